package umbp

import (
	"errors"
	"slices"
	"testing"
)

// A CANCELLED job's keys are its failed keys: KeyErr, FailedKeys,
// FailedBlockIDs and CompletedKeys agree, and a key that failed before
// the job was withdrawn keeps its own error.
func TestCancelledKeysAreFailed(t *testing.T) {
	plans := []BlockTransferPlan{{Key: "a", BlockID: 1}, {Key: "b", BlockID: 2}, {Key: "c", BlockID: 3}}
	j := newJob(kindStore, plans, newTestSet(), "unix:///test.grpc.sock")
	j.setOutcome(1, notAttempted(ErrInvalidPlan)) // failed in planning
	j.submit(nil, nil)
	if !j.cancelQueued("preempted") {
		t.Fatal("cancel of a queued job failed")
	}
	if j.Status() != JobCancelled {
		t.Fatalf("status %s, want CANCELLED", j.Status())
	}
	for i, want := range []error{ErrCancelled, ErrInvalidPlan, ErrCancelled} {
		if err := j.KeyErr(i); !errors.Is(err, want) {
			t.Errorf("KeyErr(%d) = %v, want %v", i, err, want)
		}
	}
	if got := j.FailedKeys(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("FailedKeys = %q, want every key", got)
	}
	if got := j.FailedBlockIDs(); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("FailedBlockIDs = %v, want every block", got)
	}
	if got := j.CompletedKeys(); len(got) != 0 {
		t.Errorf("CompletedKeys = %q, want none", got)
	}
}

// fuzzRegions is a region set of the caller's allocations and the
// handle's own memory, laid out from data (adjacent or with gaps): no
// server is asked. It returns the caller's memory and the handle's own.
func fuzzRegions(data []byte) (s *regionSet, caller, own []Buffer) {
	s = newRegionSet()
	base := uintptr(1 << 30)
	for i := 0; len(data) >= 2 && i < 8; i++ {
		pages := uintptr(data[0]%4) + 1 // each region 1–4 pages, after a gap of 0–3
		gap := uintptr(data[1] % 4)
		isOwn := data[0]&0x80 != 0
		data = data[2:]
		base += gap * 4096
		name := string(rune('a' + i))
		r := &memRegion{names: []string{name}, base: base, size: uint64(pages * 4096), loc: LocationHost, own: isOwn}
		b := Buffer{Ptr: r.base, Size: r.size}
		if isOwn {
			own = append(own, b)
		} else {
			s.named[name] = b
			caller = append(caller, b)
		}
		s.add(r)
		base += pages * 4096
	}
	return s, caller, own
}

// FuzzResolvePlan: a plan of arbitrary ranges against the caller's
// registered memory and the handle's own (staging) memory, laid side by
// side, is accepted only if every range lies within one region the caller
// registered, and none touches the handle's own memory.
func FuzzResolvePlan(f *testing.F) {
	f.Add([]byte{1, 0, 0x81, 0, 2, 1}, uint64(1<<30+64), uint64(512), uint64(1<<30+2*4096), uint64(64))
	f.Add([]byte{0x80, 0, 0, 0}, uint64(1<<30), uint64(4096), uint64(1<<30+4096-8), uint64(16))
	f.Add([]byte{3, 1, 3, 0}, uint64(1<<30+4096*5-16), uint64(32), uint64(1<<30+4096), uint64(4096))
	f.Fuzz(func(t *testing.T, layout []byte, a0, n0, a1, n1 uint64) {
		s, caller, own := fuzzRegions(layout)
		n0, n1 = n0%(5*4096)+1, n1%(5*4096)+1
		p := BlockTransferPlan{Key: "k", Ranges: []KVRange{
			{BaseAddress: uintptr(a0), Length: n0},
			{BaseAddress: uintptr(a1), Length: n1, ObjectOffset: n0},
		}}
		j := newJob(kindLoad, []BlockTransferPlan{p}, newTestSet(), "unix:///test.grpc.sock")
		r := &jobRunner{regions: s}
		items, slab := r.resolve(j, nil, false, false)
		defer rangeSlabs.Put(slab)
		within := func(addr uintptr, n uint64) bool {
			return slices.ContainsFunc(caller, func(b Buffer) bool {
				return addr >= b.Ptr && addr <= b.Ptr+uintptr(b.Size) && n <= uint64(b.Ptr+uintptr(b.Size)-addr)
			})
		}
		touchesOwn := func(addr uintptr, n uint64) bool {
			return slices.ContainsFunc(own, func(o Buffer) bool {
				return addr < o.Ptr+uintptr(o.Size) && addr+uintptr(n) > o.Ptr
			})
		}
		if len(items) == 0 {
			if err := j.KeyErr(0); !errors.Is(err, ErrInvalidPlan) {
				t.Fatalf("plan refused with %v, want ErrInvalidPlan", err)
			}
			return
		}
		for _, rg := range p.Ranges {
			if !within(rg.BaseAddress, rg.Length) || touchesOwn(rg.BaseAddress, rg.Length) {
				t.Fatalf("accepted range %#x+%d outside the caller's memory %v (own %v)", rg.BaseAddress, rg.Length, caller, own)
			}
		}
		for _, rg := range items[0].obj.Ranges { // as it would be sent
			addr := uintptr(rg.RegionBase + rg.Offset)
			if !within(addr, rg.Size) || touchesOwn(addr, rg.Size) {
				t.Fatalf("resolved range %#x+%d outside the caller's memory", addr, rg.Size)
			}
		}
	})
}

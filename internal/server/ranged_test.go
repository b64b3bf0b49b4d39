package server

import (
	"testing"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// rng is one range of a ranged request.
type rng struct {
	base, off, size, objOff uint64
}

// rkey is one key of a ranged request.
type rkey struct {
	key     string
	objSize uint64 // puts only
	ranges  []rng
}

func rangedReq(client string, put bool, keys ...rkey) *umbppb.BatchRangeDataRequest {
	req := &umbppb.BatchRangeDataRequest{ClientId: client}
	for _, k := range keys {
		req.Keys = append(req.Keys, k.key)
		req.RangeCounts = append(req.RangeCounts, uint32(len(k.ranges)))
		if put {
			req.ObjectSizes = append(req.ObjectSizes, k.objSize)
		}
		for _, r := range k.ranges {
			req.RegionBases = append(req.RegionBases, r.base)
			req.ShmOffsets = append(req.ShmOffsets, r.off)
			req.Sizes = append(req.Sizes, r.size)
			req.ObjectOffsets = append(req.ObjectOffsets, r.objOff)
		}
	}
	return req
}

func (h *harness) putRanges(t *testing.T, req *umbppb.BatchRangeDataRequest) []bool {
	t.Helper()
	r, err := h.c.BatchPutRanges(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return r.Ok
}

func (h *harness) getRanges(t *testing.T, req *umbppb.BatchRangeDataRequest) []bool {
	t.Helper()
	r, err := h.c.BatchGetRanges(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return r.Ok
}

// rangedSetup: a registered 64 KiB region whose first 16 KiB hold pattern 1.
func rangedSetup(t *testing.T, opts Options) (*harness, *memfd) {
	t.Helper()
	opts.Capacity = 1 << 20
	h := newHarness(t, opts)
	m := newMemfd(t, 64<<10)
	h.register(t, "c", m)
	fill(m.mem[:16384], 1)
	return h, m
}

func TestRangedRoundTrip(t *testing.T) {
	for _, opts := range []Options{{}, {DisableRangedIO: true}} {
		h, m := rangedSetup(t, opts)
		b := m.base
		src := pattern(16384, 1)
		// Object "k" = src[8192:12288] ++ src[0:4096] (gathered out of order).
		ok := h.putRanges(t, rangedReq("c", true, rkey{"k", 8192, []rng{{b, 0, 4096, 4096}, {b, 8192, 4096, 0}}}))
		wantBools(t, "put", ok, true)
		// Whole object, scattered into two places.
		ok = h.getRanges(t, rangedReq("c", false, rkey{"k", 0, []rng{{b, 32768, 4096, 0}, {b, 49152, 4096, 4096}}}))
		wantBools(t, "get", ok, true)
		wantBytes(t, "first half", m.mem[32768:32768+4096], src[8192:12288])
		wantBytes(t, "second half", m.mem[49152:49152+4096], src[:4096])
		// Any subset: the middle 100 bytes.
		ok = h.getRanges(t, rangedReq("c", false, rkey{"k", 0, []rng{{b, 20000, 100, 4050}}}))
		wantBools(t, "subset", ok, true)
		wantBytes(t, "subset bytes", m.mem[20000:20100], append(append([]byte{}, src[8192+4050:8192+4096]...), src[:54]...))
		// A contiguous Get sees the same object.
		wantOK(t, "plain get", h.get(t, "c", "k", b, 24576, 8192))
		wantBytes(t, "plain get bytes", m.mem[24576:24576+4096], src[8192:12288])
		// region_base 0 is the first region that fits.
		wantBools(t, "base 0", h.getRanges(t, rangedReq("c", false, rkey{"k", 0, []rng{{0, 0, 8192, 0}}})), true)
	}
}

func TestRangedWholeBatchFalse(t *testing.T) {
	h, m := rangedSetup(t, Options{})
	b := m.base
	good := rkey{"good", 4096, []rng{{b, 0, 4096, 0}}}
	other := rkey{"other", 4096, []rng{{b, 4096, 4096, 0}}}
	wantBools(t, "seed", h.putRanges(t, rangedReq("c", true, rkey{"stored", 4096, []rng{{b, 0, 4096, 0}}})), true)
	goodGet := rkey{"stored", 0, []rng{{b, 32768, 4096, 0}}}

	type tc struct {
		name string
		req  *umbppb.BatchRangeDataRequest
	}
	mutate := func(put bool, f func(*umbppb.BatchRangeDataRequest), keys ...rkey) *umbppb.BatchRangeDataRequest {
		r := rangedReq("c", put, keys...)
		f(r)
		return r
	}
	puts := []tc{
		{"range_counts short", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.RangeCounts = r.RangeCounts[:1] }, good, other)},
		{"range_counts sum too small", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.RangeCounts[1] = 0 }, good, other)},
		{"range_counts sum too large", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.RangeCounts[1] = 2 }, good, other)},
		{"range_counts huge", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.RangeCounts[0] = 1<<32 - 1 }, good, other)},
		{"shm_offsets short", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.ShmOffsets = r.ShmOffsets[:1] }, good, other)},
		{"sizes long", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.Sizes = append(r.Sizes, 1) }, good, other)},
		{"object_offsets short", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.ObjectOffsets = r.ObjectOffsets[:1] }, good, other)},
		{"region_bases short", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.RegionBases = r.RegionBases[:1] }, good, other)},
		{"region_bases missing", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.RegionBases = nil }, good, other)},
		{"object_sizes missing", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.ObjectSizes = nil }, good, other)},
		{"object_sizes short", mutate(true, func(r *umbppb.BatchRangeDataRequest) { r.ObjectSizes = r.ObjectSizes[:1] }, good, other)},
		{"range outside region", rangedReq("c", true, good, rkey{"other", 4096, []rng{{b, 64 << 10, 4096, 0}}})},
		{"zero-size range outside", rangedReq("c", true, good, rkey{"other", 4096, []rng{{b, 0, 4096, 0}, {b, 64<<10 + 1, 0, 4096}}})},
		{"unknown region", rangedReq("c", true, good, rkey{"other", 4096, []rng{{b + 4096, 0, 4096, 0}}})},
		{"unknown client", rangedReq("nobody", true, good, other)},
	}
	for _, c := range puts {
		t.Run("put "+c.name, func(t *testing.T) {
			wantBools(t, "put", h.putRanges(t, c.req), allFalse(len(c.req.Keys))...)
			for _, k := range c.req.Keys {
				if h.exists(t, k) {
					t.Fatalf("%s stored by an all-false batch", k)
				}
			}
		})
	}
	missing := rkey{"missing", 0, []rng{{b, 36864, 4096, 0}}}
	gets := []tc{
		{"range_counts long", mutate(false, func(r *umbppb.BatchRangeDataRequest) { r.RangeCounts = append(r.RangeCounts, 0) }, goodGet, missing)},
		{"sizes short", mutate(false, func(r *umbppb.BatchRangeDataRequest) { r.Sizes = r.Sizes[:1] }, goodGet, missing)},
		{"region_bases missing", mutate(false, func(r *umbppb.BatchRangeDataRequest) { r.RegionBases = nil }, goodGet, missing)},
		{"object_sizes present", mutate(false, func(r *umbppb.BatchRangeDataRequest) { r.ObjectSizes = []uint64{4096, 4096} }, goodGet, missing)},
		{"one object_size present", mutate(false, func(r *umbppb.BatchRangeDataRequest) { r.ObjectSizes = []uint64{4096} }, goodGet, missing)},
		{"range outside region", rangedReq("c", false, goodGet, rkey{"stored", 0, []rng{{b, 64<<10 - 100, 4096, 0}}})},
		{"zero-size range outside", rangedReq("c", false, goodGet, rkey{"stored", 0, []rng{{b, 1 << 40, 0, 0}}})},
		{"unknown client", rangedReq("nobody", false, goodGet)},
	}
	for _, c := range gets {
		t.Run("get "+c.name, func(t *testing.T) {
			clear(m.mem[32768:36864])
			wantBools(t, "get", h.getRanges(t, c.req), allFalse(len(c.req.Keys))...)
			if string(m.mem[32768:36864]) != string(make([]byte, 4096)) {
				t.Fatal("an all-false get wrote memory")
			}
		})
	}
	wantBools(t, "empty", h.putRanges(t, rangedReq("c", true)))
}

func TestRangedPutPerKeyFalse(t *testing.T) {
	h, m := rangedSetup(t, Options{})
	b := m.base
	for _, c := range []struct {
		name string
		bad  rkey
	}{
		{"gap", rkey{"x", 8192, []rng{{b, 0, 4096, 0}, {b, 4096, 2048, 6144}}}},
		{"overlap", rkey{"x", 8192, []rng{{b, 0, 4096, 0}, {b, 4096, 4096, 2048}}}},
		{"repeat", rkey{"x", 8192, []rng{{b, 0, 4096, 0}, {b, 0, 4096, 0}, {b, 4096, 4096, 4096}}}},
		{"short of object_size", rkey{"x", 8192, []rng{{b, 0, 4096, 0}}}},
		{"past object_size", rkey{"x", 4096, []rng{{b, 0, 8192, 0}}}},
		{"not starting at 0", rkey{"x", 4096, []rng{{b, 0, 4096, 1}}}},
		{"zero-size range", rkey{"x", 4096, []rng{{b, 0, 4096, 0}, {b, 4096, 0, 4096}}}},
		{"object_size 0", rkey{"x", 0, []rng{{b, 0, 4096, 0}}}},
		{"object_size 0, no ranges", rkey{"x", 0, nil}},
		{"no ranges", rkey{"x", 4096, nil}},
		{"object offset overflow", rkey{"x", 8192, []rng{{b, 0, 4096, 0}, {b, 4096, 4096, 1<<64 - 1}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok := h.putRanges(t, rangedReq("c", true,
				rkey{"ok-" + c.name, 4096, []rng{{b, 0, 4096, 0}}}, c.bad,
				rkey{"ok2-" + c.name, 4096, []rng{{b, 0, 2048, 0}, {b, 2048, 2048, 2048}}}))
			wantBools(t, "put", ok, true, false, true)
			if h.exists(t, "x") {
				t.Fatal("bad key stored")
			}
		})
	}
}

func TestRangedRePut(t *testing.T) {
	h, m := rangedSetup(t, Options{})
	b := m.base
	src := pattern(16384, 1)
	wantBools(t, "first", h.putRanges(t, rangedReq("c", true, rkey{"k", 8192, []rng{{b, 0, 8192, 0}}})), true)
	// Valid ranges, other bytes and size: ok, the first value stays.
	wantBools(t, "valid re-put", h.putRanges(t, rangedReq("c", true, rkey{"k", 4096, []rng{{b, 8192, 4096, 0}}})), true)
	// Non-tiling ranges: false, the stored object intact.
	wantBools(t, "bad re-put", h.putRanges(t, rangedReq("c", true, rkey{"k", 8192, []rng{{b, 8192, 4096, 0}}})), false)
	wantOK(t, "get", h.get(t, "c", "k", b, 32768, 8192))
	wantBytes(t, "first value", m.mem[32768:32768+8192], src[:8192])
	// An existing key twice in one put: ok for both.
	wantBools(t, "existing twice", h.putRanges(t, rangedReq("c", true,
		rkey{"k", 4096, []rng{{b, 0, 4096, 0}}}, rkey{"k", 4096, []rng{{b, 4096, 4096, 0}}})), true, true)
	wantOK(t, "still first", h.get(t, "c", "k", b, 32768, 8192))
}

func TestRangedSameNewKeyTwice(t *testing.T) {
	h, m := rangedSetup(t, Options{})
	b := m.base
	ok := h.putRanges(t, rangedReq("c", true,
		rkey{"dup", 4096, []rng{{b, 0, 4096, 0}}},
		rkey{"single", 4096, []rng{{b, 4096, 4096, 0}}},
		rkey{"dup", 4096, []rng{{b, 8192, 4096, 0}}}))
	wantBools(t, "put", ok, false, true, false)
	if h.exists(t, "dup") {
		t.Fatal("a new key given twice was stored")
	}
	if !h.exists(t, "single") {
		t.Fatal("single not stored")
	}
}

func TestRangedGetPerKeyFalse(t *testing.T) {
	h, m := rangedSetup(t, Options{})
	b := m.base
	wantBools(t, "seed", h.putRanges(t, rangedReq("c", true, rkey{"k", 8192, []rng{{b, 0, 8192, 0}}})), true)
	src := pattern(16384, 1)
	for _, c := range []struct {
		name string
		bad  rkey
	}{
		{"zero-size range", rkey{"k", 0, []rng{{b, 40960, 4096, 0}, {b, 45056, 0, 4096}}}},
		{"past the end", rkey{"k", 0, []rng{{b, 40960, 4096, 4097}}}},
		{"offset overflow", rkey{"k", 0, []rng{{b, 40960, 4096, 1<<64 - 100}}}},
		{"no ranges", rkey{"k", 0, nil}},
		{"missing key", rkey{"nope", 0, []rng{{b, 40960, 4096, 0}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clear(m.mem[32768:])
			ok := h.getRanges(t, rangedReq("c", false,
				rkey{"k", 0, []rng{{b, 32768, 4096, 4096}}}, c.bad,
				rkey{"k", 0, []rng{{b, 36864, 8192, 0}}}))
			wantBools(t, "get", ok, true, false, true)
			wantBytes(t, "first", m.mem[32768:32768+4096], src[4096:8192])
			wantBytes(t, "third", m.mem[36864:36864+8192], src[:8192])
		})
	}
}

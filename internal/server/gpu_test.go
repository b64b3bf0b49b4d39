package server

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// fakeGPU stands in for a GPU runtime: "device allocations" are host
// buffers named by 64-byte handles; copies resolve addresses back to the
// buffers (or to the pool's arena) they lie in.
type fakeGPU struct {
	mu        sync.Mutex
	allocs    map[[64]byte][]byte
	arena     []byte
	opens     map[[64]byte]int // open handles, by handle
	openCalls int
	closes    int
	pinned    [2]uint64 // ptr, n
	unpinned  bool
	openErr   error
	block     chan struct{} // when set, copies wait on it
	copying   chan struct{} // signalled when a copy starts
	copyCalls int
	// failCopy, when set, may fail a copy (before it is made).
	failCopy func(GPUCopy) error
	// miscount makes Copy return one error too many.
	miscount bool
}

func newFakeGPU() *fakeGPU {
	return &fakeGPU{allocs: make(map[[64]byte][]byte), opens: make(map[[64]byte]int)}
}

// alloc makes a device allocation of n bytes: its handle and server-side bytes.
func (f *fakeGPU) alloc(n int, seed byte) ([]byte, []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h [64]byte
	copy(h[:], fmt.Sprintf("handle-%d-%d", len(f.allocs), seed))
	mem := make([]byte, n)
	f.allocs[h] = mem
	return h[:], mem
}

func (f *fakeGPU) setArena(a []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.arena = a
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// view resolves [p, p+n) to the buffer holding it.
func (f *fakeGPU) view(p uintptr, n uint64) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	bufs := [][]byte{f.arena}
	for _, m := range f.allocs {
		bufs = append(bufs, m)
	}
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		base := addrOf(b)
		if p >= base && uint64(p-base)+n <= uint64(len(b)) {
			off := p - base
			return b[off : uint64(off)+n], nil
		}
	}
	return nil, fmt.Errorf("fake GPU: address %#x+%d is not mapped", p, n)
}

func (f *fakeGPU) OpenIPC(device int, handle []byte) (uintptr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.openCalls++
	if f.openErr != nil {
		return 0, f.openErr
	}
	var h [64]byte
	copy(h[:], handle)
	mem, ok := f.allocs[h]
	if !ok {
		return 0, errors.New("fake GPU: invalid handle")
	}
	f.opens[h]++
	return addrOf(mem), nil
}

func (f *fakeGPU) CloseIPC(device int, ptr uintptr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for h, m := range f.allocs {
		if addrOf(m) == ptr {
			if f.opens[h] == 0 {
				return errors.New("fake GPU: handle not open")
			}
			f.opens[h]--
			f.closes++
			return nil
		}
	}
	return errors.New("fake GPU: unknown pointer")
}

func (f *fakeGPU) wait() {
	f.mu.Lock()
	block, copying := f.block, f.copying
	f.mu.Unlock()
	if copying != nil {
		copying <- struct{}{}
	}
	if block != nil {
		<-block
	}
}

func (f *fakeGPU) Copy(copies []GPUCopy) []error {
	f.wait()
	f.mu.Lock()
	f.copyCalls++
	failCopy, miscount := f.failCopy, f.miscount
	f.mu.Unlock()
	if miscount {
		return make([]error, len(copies)+1)
	}
	var errs []error
	for i, c := range copies {
		dst, src := c.GPU, c.Pool
		if c.ToPool {
			dst, src = c.Pool, c.GPU
		}
		var err error
		if failCopy != nil {
			err = failCopy(c)
		}
		var d []byte
		if err == nil {
			d, err = f.view(dst, c.N)
		}
		if err == nil {
			var s []byte
			if s, err = f.view(src, c.N); err == nil {
				copy(d, s)
			}
		}
		if err != nil {
			if errs == nil {
				errs = make([]error, len(copies))
			}
			errs[i] = err
		}
	}
	return errs
}

func (f *fakeGPU) Pin(ptr uintptr, n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pinned = [2]uint64{uint64(ptr), n}
	return nil
}

func (f *fakeGPU) Unpin(ptr uintptr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unpinned = uint64(ptr) == f.pinned[0]
	return nil
}

func (f *fakeGPU) copies() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.copyCalls
}

func (f *fakeGPU) counts() (openCalls, open, closes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.opens {
		open += n
	}
	return f.openCalls, open, f.closes
}

func newGPUHarness(t *testing.T, opts Options) (*harness, *fakeGPU) {
	t.Helper()
	f := newFakeGPU()
	opts.GPU = f
	if opts.Capacity == 0 {
		opts.Capacity = 1 << 20
	}
	h := newHarness(t, opts)
	f.setArena(h.srv.pool.arena)
	return h, f
}

func gpuReq(client string, base, size uint64, device int32, handle []byte, off, allocBase uint64) *umbppb.RegisterMemoryRequest {
	return &umbppb.RegisterMemoryRequest{
		ClientId: client, WorkerBase: base, Size: size, Kind: umbppb.MemoryKind_MEMORY_KIND_GPU_IPC,
		DeviceId: device, IpcHandle: handle, IpcOffset: off, AllocBase: allocBase,
	}
}

func (h *harness) registerGPU(t *testing.T, req *umbppb.RegisterMemoryRequest) *umbppb.BoolResponse {
	t.Helper()
	r, err := h.c.RegisterMemory(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestGPURegistrationRefused(t *testing.T) {
	handle := make([]byte, 64)
	valid := func() *umbppb.RegisterMemoryRequest { return gpuReq("c", 0x10000, 4096, 0, handle, 0, 0x10000) }
	t.Run("invalid payload", func(t *testing.T) {
		h, f := newGPUHarness(t, Options{})
		for _, tc := range []struct {
			name   string
			modify func(*umbppb.RegisterMemoryRequest)
			reason string
		}{
			{"empty client", func(r *umbppb.RegisterMemoryRequest) { r.ClientId = "" }, "client_id"},
			{"worker_base 0", func(r *umbppb.RegisterMemoryRequest) { r.WorkerBase = 0 }, "worker_base"},
			{"size 0", func(r *umbppb.RegisterMemoryRequest) { r.Size = 0 }, "size"},
			{"alloc_base 0", func(r *umbppb.RegisterMemoryRequest) { r.AllocBase = 0 }, "alloc_base"},
			{"handle short", func(r *umbppb.RegisterMemoryRequest) { r.IpcHandle = make([]byte, 63) }, "ipc_handle"},
			{"handle long", func(r *umbppb.RegisterMemoryRequest) { r.IpcHandle = make([]byte, 65) }, "ipc_handle"},
			{"handle missing", func(r *umbppb.RegisterMemoryRequest) { r.IpcHandle = nil }, "ipc_handle"},
			{"negative device", func(r *umbppb.RegisterMemoryRequest) { r.DeviceId = -1 }, "device_id"},
			{"unknown kind", func(r *umbppb.RegisterMemoryRequest) { r.Kind = 7 }, "unknown memory kind"},
		} {
			req := valid()
			tc.modify(req)
			r := h.registerGPU(t, req)
			if r.Ok || !strings.Contains(r.Error, tc.reason) {
				t.Errorf("%s: %v, want false mentioning %q", tc.name, r, tc.reason)
			}
		}
		if calls, _, _ := f.counts(); calls != 0 {
			t.Fatalf("invalid registrations reached OpenIPC %d times", calls)
		}
		// The handle does not open.
		r := h.registerGPU(t, valid())
		if r.Ok || !strings.Contains(r.Error, "hipIpcOpenMemHandle") {
			t.Fatalf("unopenable handle: %v", r)
		}
		f.mu.Lock()
		f.openErr = errors.New("device lost")
		f.mu.Unlock()
		if r := h.registerGPU(t, valid()); r.Ok || !strings.Contains(r.Error, "device lost") {
			t.Fatalf("open error: %v", r)
		}
		if st := h.srv.Stats(); st.Regions != 0 || st.GPUHandles != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("no backend", func(t *testing.T) {
		h := newHarness(t, Options{Capacity: 1 << 20})
		wantFail(t, "no backend", h.registerGPU(t, valid()), MsgGPUUnsupported)
	})
	t.Run("ssd tier on", func(t *testing.T) {
		h, _ := newGPUHarness(t, Options{DisableRangedIO: true})
		r := h.registerGPU(t, valid())
		wantFail(t, "ssd", r, MsgGPUNeedsSSDDisabled)
		if reason := r.Error; !strings.HasPrefix(reason, "GPU IPC registration requires SSD to be disabled") {
			t.Fatalf("reason %q", r.Error)
		}
	})
}

func TestGPURegionsOpenOncePerAllocation(t *testing.T) {
	h, f := newGPUHarness(t, Options{})
	const allocBase = 0x7f0000000000
	handle, dev := f.alloc(64<<10, 1)
	// Two regions inside one allocation, one client: one open.
	wantOK(t, "r1", h.registerGPU(t, gpuReq("c", allocBase, 16384, 0, handle, 0, allocBase)))
	wantOK(t, "r2", h.registerGPU(t, gpuReq("c", allocBase+32768, 16384, 0, handle, 32768, allocBase)))
	wantOK(t, "r1 again, identical", h.registerGPU(t, gpuReq("c", allocBase, 16384, 0, handle, 0, allocBase)))
	if calls, open, _ := f.counts(); calls != 1 || open != 1 {
		t.Fatalf("open calls %d, open %d; want 1, 1", calls, open)
	}
	if st := h.srv.Stats(); st.Regions != 2 || st.GPUHandles != 1 {
		t.Fatalf("stats %+v", st)
	}

	// Data moves at mapped_base + ipc_offset.
	fill(dev[32768:32768+16384], 7)
	wantOK(t, "put from r2", h.put(t, "c", "k", allocBase+32768, 0, 16384))
	wantOK(t, "get into r1", h.get(t, "c", "k", allocBase, 0, 16384))
	wantBytes(t, "r1 bytes", dev[:16384], pattern(16384, 7))

	// Ranged I/O through a GPU region.
	fill(dev[32768:32768+16384], 9)
	r, err := h.c.BatchPutRanges(ctxT(t), &umbppb.BatchRangeDataRequest{
		Keys: []string{"g"}, ClientId: "c", RangeCounts: []uint32{2},
		ShmOffsets: []uint64{8192, 0}, RegionBases: []uint64{allocBase + 32768, allocBase + 32768},
		Sizes: []uint64{8192, 8192}, ObjectOffsets: []uint64{0, 8192}, ObjectSizes: []uint64{16384},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantBools(t, "ranged put", r.Ok, true)
	r, err = h.c.BatchGetRanges(ctxT(t), &umbppb.BatchRangeDataRequest{
		Keys: []string{"g"}, ClientId: "c", RangeCounts: []uint32{1},
		ShmOffsets: []uint64{0}, RegionBases: []uint64{allocBase}, Sizes: []uint64{16384}, ObjectOffsets: []uint64{0},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantBools(t, "ranged get", r.Ok, true)
	src := pattern(16384, 9)
	wantBytes(t, "ranged bytes", dev[:16384], append(append([]byte{}, src[8192:]...), src[:8192]...))

	// Another client opens its own.
	wantOK(t, "other client", h.registerGPU(t, gpuReq("d", allocBase, 16384, 0, handle, 0, allocBase)))
	if _, err := h.c.DeregisterMemory(ctxT(t), &umbppb.DeregisterMemoryRequest{ClientId: "c"}); err != nil {
		t.Fatal(err)
	}
	h.srv.regs.wait()
	if calls, open, closes := f.counts(); calls != 2 || open != 1 || closes != 1 {
		t.Fatalf("after deregistering c: opens %d open %d closes %d; want 2 1 1", calls, open, closes)
	}
}

func TestGPUReusesOpenHandle(t *testing.T) {
	// Opening is costly and a second mapping of one allocation may be
	// refused by the runtime: the server must reuse its open handle.
	h, f := newGPUHarness(t, Options{})
	handle, _ := f.alloc(4096, 2)
	for i := range 5 {
		wantOK(t, "register", h.registerGPU(t, gpuReq("c", 0x1000+uint64(i)*16, 16, 0, handle, uint64(i)*16, 0x1000)))
	}
	if calls, _, _ := f.counts(); calls != 1 {
		t.Fatalf("%d opens", calls)
	}
}

func TestGPUHandleChanged(t *testing.T) {
	h, f := newGPUHarness(t, Options{})
	oldHandle, _ := f.alloc(8192, 1)
	newHandle, newMem := f.alloc(8192, 2)
	const allocBase = 0x5000
	wantOK(t, "old a", h.registerGPU(t, gpuReq("c", allocBase, 4096, 0, oldHandle, 0, allocBase)))
	wantOK(t, "old b", h.registerGPU(t, gpuReq("c", allocBase+4096, 4096, 0, oldHandle, 4096, allocBase)))
	// The allocation was freed and another one took its address.
	wantOK(t, "new a", h.registerGPU(t, gpuReq("c", allocBase, 4096, 0, newHandle, 0, allocBase)))
	h.srv.regs.wait()
	calls, open, closes := f.counts()
	if calls != 2 || open != 1 || closes != 1 {
		t.Fatalf("opens %d open %d closes %d; want 2 1 1", calls, open, closes)
	}
	if st := h.srv.Stats(); st.Regions != 1 || st.GPUHandles != 1 {
		t.Fatalf("stats %+v (regions on the old allocation must be gone)", st)
	}
	fill(newMem[:4096], 3)
	wantOK(t, "put", h.put(t, "c", "k", allocBase, 0, 4096))
	wantFail(t, "old region gone", h.put(t, "c", "k2", allocBase+4096, 0, 4096), MsgBadShmBuffer)
}

// TestGPUDeregisterWhileCopying: the handle of a deregistered region stays
// open until the copy using it ends.
func TestGPUDeregisterWhileCopying(t *testing.T) {
	h, f := newGPUHarness(t, Options{})
	handle, _ := f.alloc(8192, 1)
	wantOK(t, "register", h.registerGPU(t, gpuReq("c", 0x9000, 8192, 0, handle, 0, 0x9000)))
	block := make(chan struct{})
	copying := make(chan struct{}, 1)
	f.mu.Lock()
	f.block, f.copying = block, copying
	f.mu.Unlock()
	done := make(chan *umbppb.BoolResponse, 1)
	go func() {
		r, _ := h.c.Put(ctxT(t), &umbppb.PutRequest{Key: "k", ClientId: "c", Size: 8192, RegionBase: 0x9000})
		done <- r
	}()
	<-copying
	if _, err := h.c.DeregisterMemory(ctxT(t), &umbppb.DeregisterMemoryRequest{ClientId: "c"}); err != nil {
		t.Fatal(err)
	}
	// Re-registering the same allocation meanwhile reuses the open handle.
	f.mu.Lock()
	f.block, f.copying = nil, nil
	f.mu.Unlock()
	wantOK(t, "re-register", h.registerGPU(t, gpuReq("c", 0x9000, 8192, 0, handle, 0, 0x9000)))
	h.srv.regs.wait()
	if _, open, closes := f.counts(); open != 1 || closes != 0 {
		t.Fatalf("handle closed under a running copy: open %d closes %d", open, closes)
	}
	if _, err := h.c.DeregisterMemory(ctxT(t), &umbppb.DeregisterMemoryRequest{ClientId: "c"}); err != nil {
		t.Fatal(err)
	}
	h.srv.regs.wait()
	if _, open, closes := f.counts(); open != 1 || closes != 0 {
		t.Fatalf("handle closed under a running copy: open %d closes %d", open, closes)
	}
	close(block)
	select {
	case r := <-done:
		wantOK(t, "put", r)
	case <-time.After(10 * time.Second):
		t.Fatal("put did not finish")
	}
	if !waitFor(5*time.Second, func() bool { _, open, closes := f.counts(); return open == 0 && closes == 1 }) {
		_, open, closes := f.counts()
		t.Fatalf("after the copy: open %d closes %d; want 0 1", open, closes)
	}
}

func TestGPUPoolPinned(t *testing.T) {
	f := newFakeGPU()
	dir := shortDir(t)
	srv, err := New(Options{Endpoint: dir + "/p.sock", Capacity: 3 << 20, GPU: f, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if f.pinned[0] != uint64(srv.pool.base()) || f.pinned[1] != 3<<20 {
		t.Errorf("pinned %#x+%d, want the arena %#x+%d", f.pinned[0], f.pinned[1], srv.pool.base(), 3<<20)
	}
	handle, _ := f.alloc(4096, 1)
	cc, c := dial(t, srv.Endpoint())
	defer cc.Close()
	r, err := c.RegisterMemory(ctxT(t), gpuReq("c", 0x1000, 4096, 0, handle, 0, 0x1000))
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, "register", r)
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if !f.unpinned {
		t.Error("arena not unpinned at Close")
	}
	if _, open, closes := f.counts(); open != 0 || closes != 1 {
		t.Errorf("handles at Close: open %d closes %d", open, closes)
	}
}

// TestGPURangedBatchCopies checks that a ranged batch makes its GPU copies
// together, one Copy call for all its objects and ranges, that a failed copy
// fails its own key alone, and that a batch larger than the pool still stores
// its keys in turn.
func TestGPURangedBatchCopies(t *testing.T) {
	const objects, ranges, rangeSize = 8, 4, 2048
	const objSize = ranges * rangeSize
	const allocBase = 0x7f0000000000
	// batch builds a ranged request over the region: object i's range r
	// lies at ((i*ranges + (ranges-1-r)) * rangeSize), so every object's
	// ranges are out of order in memory.
	batch := func(put bool, prefix string) *umbppb.BatchRangeDataRequest {
		var keys []rkey
		for i := range objects {
			k := rkey{key: fmt.Sprintf("%s%d", prefix, i), objSize: objSize}
			for r := range ranges {
				off := uint64((i*ranges + ranges - 1 - r) * rangeSize)
				k.ranges = append(k.ranges, rng{base: allocBase, off: off, size: rangeSize, objOff: uint64(r * rangeSize)})
			}
			keys = append(keys, k)
		}
		return rangedReq("c", put, keys...)
	}
	const regionSize = objects * objSize
	setup := func(t *testing.T, capacity uint64) (*harness, *fakeGPU, []byte) {
		h, f := newGPUHarness(t, Options{Capacity: capacity})
		handle, dev := f.alloc(regionSize, 1)
		wantOK(t, "register", h.registerGPU(t, gpuReq("c", allocBase, regionSize, 0, handle, 0, allocBase)))
		return h, f, dev
	}
	all := func(v bool) []bool {
		b := make([]bool, objects)
		for i := range b {
			b[i] = v
		}
		return b
	}

	t.Run("one Copy a batch", func(t *testing.T) {
		h, f, dev := setup(t, 1<<20)
		want := pattern(regionSize, 5)
		copy(dev, want)
		before := f.copies()
		wantBools(t, "put", h.putRanges(t, batch(true, "k")), all(true)...)
		if n := f.copies() - before; n != 1 {
			t.Fatalf("the put made %d Copy calls, want 1", n)
		}
		clear(dev)
		before = f.copies()
		wantBools(t, "get", h.getRanges(t, batch(false, "k")), all(true)...)
		if n := f.copies() - before; n != 1 {
			t.Fatalf("the get made %d Copy calls, want 1", n)
		}
		wantBytes(t, "round trip", dev, want)
	})

	t.Run("a failed copy fails its key", func(t *testing.T) {
		h, f, dev := setup(t, 1<<20)
		copy(dev, pattern(regionSize, 6))
		// The fake maps the allocation at dev's address. Fail object 2's
		// third range, at region offset (2*ranges+1)*rangeSize.
		var bad atomic.Uintptr
		bad.Store(addrOf(dev) + uintptr((2*ranges+1)*rangeSize))
		f.mu.Lock()
		f.failCopy = func(c GPUCopy) error {
			if c.GPU == bad.Load() {
				return errors.New("fake GPU: injected copy failure")
			}
			return nil
		}
		f.mu.Unlock()
		want := all(true)
		want[2] = false
		wantBools(t, "put", h.putRanges(t, batch(true, "k")), want...)
		if st := h.srv.Stats(); st.Objects != objects-1 {
			t.Fatalf("%d objects stored, want %d (the failed one aborted)", st.Objects, objects-1)
		}
		// Gets: object 2 was not stored; fail one of object 5's ranges.
		bad.Store(addrOf(dev) + uintptr((5*ranges+3)*rangeSize))
		want[5] = false
		wantBools(t, "get", h.getRanges(t, batch(false, "k")), want...)
	})

	t.Run("a backend that miscounts", func(t *testing.T) {
		h, f, _ := setup(t, 1<<20)
		f.mu.Lock()
		f.miscount = true
		f.mu.Unlock()
		wantBools(t, "put", h.putRanges(t, batch(true, "k")), all(false)...)
		if st := h.srv.Stats(); st.Objects != 0 || st.BytesUsed != 0 {
			t.Fatalf("stats %+v after a put whose copies cannot be trusted", st)
		}
	})

	t.Run("a batch larger than the pool", func(t *testing.T) {
		// Room for 3 objects: the put finishes the objects in flight when
		// the pool is full, so later objects evict earlier ones.
		h, f, dev := setup(t, 3*objSize)
		want := pattern(regionSize, 7)
		copy(dev, want)
		before := f.copies()
		wantBools(t, "put", h.putRanges(t, batch(true, "k")), all(true)...)
		if n := f.copies() - before; n < 2 {
			t.Fatalf("the put made %d Copy calls, want several (one each time the pool filled)", n)
		}
		clear(dev)
		got := h.getRanges(t, batch(false, "k"))
		if !got[objects-1] {
			t.Fatalf("the last key is not stored: %v", got)
		}
		stored := 0
		for i, ok := range got {
			if ok {
				stored++
				lo, hi := i*objSize, (i+1)*objSize
				wantBytes(t, fmt.Sprintf("object %d", i), dev[lo:hi], want[lo:hi])
			}
		}
		if stored == 0 || stored > 3 {
			t.Fatalf("%d objects stored in a pool with room for 3", stored)
		}
	})
}

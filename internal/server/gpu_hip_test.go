package server

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/internal/hip/hiptest"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// fakeRuntime loads the fake GPU runtime (two devices, HIP 6 flavour).
func fakeRuntime(t *testing.T) *hip.Runtime {
	t.Helper()
	lib := hiptest.BuildFake(t, "libamdhip64.so.6", "-DFAKE_HIP6")
	return openFake(t, hip.Options{HIPLibraries: []string{lib}})
}

// fakeCUDARuntime is the fake runtime as CUDA 13, which has batched copies.
func fakeCUDARuntime(t *testing.T) *hip.Runtime {
	t.Helper()
	lib := hiptest.BuildFake(t, "libcudart.so.13", "-DFAKE_CUDA")
	rt := openFake(t, hip.Options{CUDARuntimeLibraries: []string{lib}, CUDADriverLibraries: []string{lib}})
	if !rt.CanMemcpyBatch() {
		t.Fatalf("%v: no batched copies", rt)
	}
	return rt
}

func openFake(t *testing.T, opts hip.Options) *hip.Runtime {
	t.Helper()
	rt, err := hip.Open(opts)
	if errors.Is(err, hip.ErrNotSupported) {
		t.Skipf("cannot load the fake GPU runtime: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// fakeFlavours runs f on the fake runtime as HIP (single copies) and as
// CUDA 13 (batched copies).
func fakeFlavours(t *testing.T, f func(t *testing.T, rt *hip.Runtime)) {
	t.Run("hip", func(t *testing.T) { f(t, fakeRuntime(t)) })
	t.Run("cuda", func(t *testing.T) { f(t, fakeCUDARuntime(t)) })
}

// foreign opens the fake runtime's handles as if another process made them:
// client and server share this test's process.
type foreign struct{ *HIPBackend }

func (f foreign) OpenIPC(device int, handle []byte) (uintptr, error) {
	return f.HIPBackend.OpenIPC(device, hiptest.Foreign(handle))
}

func TestNewHIPBackendWithoutGPU(t *testing.T) {
	if hip.Available() {
		t.Skip("this host has a GPU runtime")
	}
	var logged bytes.Buffer
	b, err := NewHIPBackend(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if b != nil || !errors.Is(err, ErrNotSupported) || !errors.Is(err, hip.ErrNotSupported) {
		t.Fatalf("NewHIPBackend = %v, %v; want nil and an error matching both ErrNotSupported", b, err)
	}
	// The error is one short line; what each library gave is at debug
	// level, a line each.
	var le *hip.LoadError
	if !errors.As(err, &le) {
		t.Skipf("not a load failure (%v): no library was tried", err)
	}
	if len(err.Error()) > 120 || strings.Contains(err.Error(), "cannot open") {
		t.Errorf("NewHIPBackend error is not one short line: %q", err)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != len(le.Tried) {
		t.Fatalf("%d lines logged for %d libraries tried:\n%s", len(lines), len(le.Tried), logged.String())
	}
	for i, l := range lines {
		if !strings.Contains(l, "level=DEBUG") || !strings.Contains(l, le.Tried[i]) {
			t.Errorf("line %d does not say at debug level what %q gave: %s", i, le.Tried[i], l)
		}
	}
}

// TestHIPBackendFakeRuntime serves GPU regions through the HIP backend on
// the fake runtime: IPC opens shared between clients, pinning, ranged copies
// on device 1 (so that a call that does not select its device fails).
func TestHIPBackendFakeRuntime(t *testing.T) {
	fakeFlavours(t, func(t *testing.T, rt *hip.Runtime) {
		b := NewHIPBackendFor(rt, nil)
		testHIPBackendServes(t, rt, b)
		if rt.CanMemcpyBatch() && !b.batch.Load() {
			t.Fatal("batched copies failed and were turned off")
		}
	})
}

func testHIPBackendServes(t *testing.T, rt *hip.Runtime, b *HIPBackend) {
	h := newHarness(t, Options{Capacity: 4 << 20, GPU: foreign{b}})
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if mt, _, err := rt.PointerInfo(h.srv.pool.base() + 100); err != nil || mt != hip.MemoryHost {
		t.Fatalf("pool arena: %v, %v; want pinned host memory", mt, err)
	}

	const dev, size = 1, 256 << 10
	alloc, err := rt.Malloc(dev, size)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Free(dev, alloc)
	handle, err := rt.IpcGetMemHandle(dev, alloc)
	if err != nil {
		t.Fatal(err)
	}
	base := uint64(alloc)
	for _, c := range []string{"a", "b"} {
		wantOK(t, "register "+c, h.registerGPU(t, gpuReq(c, base, size, dev, handle[:], 0, base)))
	}
	if st := h.srv.Stats(); st.GPUHandles != 2 || b.OpenHandles() != 1 {
		t.Fatalf("two clients on one allocation: server handles %d, runtime handles %d; want 2, 1", st.GPUHandles, b.OpenHandles())
	}

	// A put gathered from two ranges of client a, read back whole by b.
	src := pattern(64<<10, 5)
	if err := rt.CopyToDevice(dev, alloc+4096, src); err != nil {
		t.Fatal(err)
	}
	r, err := h.c.BatchPutRanges(ctxT(t), &umbppb.BatchRangeDataRequest{
		Keys: []string{"k"}, ClientId: "a", RangeCounts: []uint32{2},
		ShmOffsets: []uint64{4096 + 32<<10, 4096}, RegionBases: []uint64{base, base},
		Sizes: []uint64{32 << 10, 32 << 10}, ObjectOffsets: []uint64{32 << 10, 0}, ObjectSizes: []uint64{64 << 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantBools(t, "ranged put", r.Ok, true)
	wantOK(t, "get", h.get(t, "b", "k", base, 128<<10, 64<<10))
	got := make([]byte, 64<<10)
	if err := rt.CopyFromDevice(dev, got, alloc+128<<10); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, "loaded bytes", got, src)

	// Concurrent copies each take a stream of their own.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := h.get(t, "a", "k", base, uint64(i)*16<<10, 64<<10); !r.Ok {
				t.Errorf("concurrent get %d: %v", i, r)
			}
		}()
	}
	wg.Wait()

	for _, c := range []string{"a", "b"} {
		if _, err := h.c.DeregisterMemory(ctxT(t), &umbppb.DeregisterMemoryRequest{ClientId: c}); err != nil {
			t.Fatal(err)
		}
	}
	h.srv.regs.wait()
	if n := b.OpenHandles(); n != 0 {
		t.Fatalf("%d handles open after both clients deregistered", n)
	}
	if err := b.CloseIPC(dev, alloc); err == nil {
		t.Fatal("CloseIPC of a closed mapping succeeded")
	}
	if _, err := b.OpenIPC(dev, make([]byte, 63)); err == nil {
		t.Fatal("OpenIPC of a 63-byte handle succeeded")
	}
}

// TestHIPBackendCopyBatch makes one batch of copies on two devices of the
// fake runtime, one of which the runtime refuses: that copy fails alone.
func TestHIPBackendCopyBatch(t *testing.T) {
	fakeFlavours(t, testHIPBackendCopyBatch)
}

func testHIPBackendCopyBatch(t *testing.T, rt *hip.Runtime) {
	b := NewHIPBackendFor(rt, nil)
	defer b.Close()
	const n = 4096
	arena, err := unix.Mmap(-1, 0, 4*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(arena)
	ap := uintptr(unsafe.Pointer(&arena[0]))
	var dev [2]uintptr
	for d := range dev {
		if dev[d], err = rt.Malloc(d, 2*n); err != nil {
			t.Fatal(err)
		}
		defer rt.Free(d, dev[d])
		if err := rt.CopyToDevice(d, dev[d], pattern(n, byte(d+1))); err != nil {
			t.Fatal(err)
		}
	}
	fill(arena[2*n:3*n], 9)
	copies := []GPUCopy{
		{Device: 0, GPU: dev[0], Pool: ap, N: n, ToPool: true},
		{Device: 1, GPU: dev[1], Pool: ap + n, N: n, ToPool: true},
		{Device: 1, GPU: ap + 3*n, Pool: ap, N: n, ToPool: true}, // host memory as "device" memory
		{Device: 0, GPU: dev[0] + n, Pool: ap + 2*n, N: n},
		{Device: 1, GPU: dev[1] + n, Pool: ap + 2*n, N: 0}, // nothing to do
	}
	errs := b.Copy(copies)
	if len(errs) != len(copies) {
		t.Fatalf("Copy returned %d errors for %d copies: %v", len(errs), len(copies), errs)
	}
	for i, err := range errs {
		if (err != nil) != (i == 2) {
			t.Errorf("copy %d: %v", i, err)
		}
	}
	wantBytes(t, "device 0 to the pool", arena[:n], pattern(n, 1))
	wantBytes(t, "device 1 to the pool", arena[n:2*n], pattern(n, 2))
	got := make([]byte, n)
	if err := rt.CopyFromDevice(0, got, dev[0]+n); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, "pool to device 0", got, pattern(n, 9))
	if errs := b.Copy(copies[:2]); errs != nil {
		t.Fatalf("a batch after a failed one: %v", errs)
	}
	if !rt.CanMemcpyBatch() {
		return
	}
	// One failed batched call leaves batching on; maxBatchFails in a row
	// turn it off, and copies still work.
	if !b.batch.Load() {
		t.Fatal("one failed batched call turned batching off")
	}
	bad := []GPUCopy{copies[1], copies[2]} // one device and direction
	for range maxBatchFails {
		if errs := b.Copy(bad); len(errs) != 2 || errs[0] != nil || errs[1] == nil {
			t.Fatalf("a failing batch: %v", errs)
		}
	}
	if b.batch.Load() {
		t.Fatalf("batching still on after %d failed calls in a row", maxBatchFails+1)
	}
	if errs := b.Copy(copies[:2]); errs != nil {
		t.Fatalf("copies after batching was turned off: %v", errs)
	}
}

// TestHIPBackendBatchUnsupported: a runtime whose driver cannot make
// batched copies turns batching off at its first refusal; the copies are
// made one by one.
func TestHIPBackendBatchUnsupported(t *testing.T) {
	rt := fakeCUDARuntime(t)
	t.Setenv("UMBP_FAKE_BATCH_UNSUPPORTED", "1")
	err := rt.MemcpyBatchAsync(0, []uintptr{1, 2}, []uintptr{3, 4}, []uint64{1, 1}, hip.MemcpyHostToDevice, 0, 0)
	if !errors.Is(err, hip.ErrNotSupported) {
		t.Fatalf("MemcpyBatchAsync refused by the driver: %v, want ErrNotSupported", err)
	}
	b := NewHIPBackendFor(rt, nil)
	defer b.Close()
	const n = 4096
	arena, err := unix.Mmap(-1, 0, 2*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(arena)
	ap := uintptr(unsafe.Pointer(&arena[0]))
	d, err := rt.Malloc(0, 2*n)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Free(0, d)
	want := pattern(2*n, 4)
	if err := rt.CopyToDevice(0, d, want); err != nil {
		t.Fatal(err)
	}
	copies := []GPUCopy{
		{Device: 0, GPU: d, Pool: ap, N: n, ToPool: true},
		{Device: 0, GPU: d + n, Pool: ap + n, N: n, ToPool: true},
	}
	if errs := b.Copy(copies); errs != nil {
		t.Fatalf("Copy: %v", errs)
	}
	wantBytes(t, "pool", arena, want)
	if b.batch.Load() {
		t.Fatal("batching still on after the runtime said it cannot batch")
	}
}

// TestHIPBackendCopyMany makes more copies than one batched call takes, in
// both directions, and checks every byte.
func TestHIPBackendCopyMany(t *testing.T) {
	fakeFlavours(t, func(t *testing.T, rt *hip.Runtime) {
		b := NewHIPBackendFor(rt, nil)
		defer b.Close()
		const dev, pieces, n = 1, 2*maxBatchCopies + 45, 256
		const size = pieces * n
		arena, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(arena)
		ap := uintptr(unsafe.Pointer(&arena[0]))
		d, err := rt.Malloc(dev, size)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Free(dev, d)
		want := pattern(size, 11)
		if err := rt.CopyToDevice(dev, d, want); err != nil {
			t.Fatal(err)
		}
		// Piece k of the device lands at piece pieces-1-k of the pool.
		copies := make([]GPUCopy, pieces)
		for k := range copies {
			copies[k] = GPUCopy{Device: dev, GPU: d + uintptr(k*n), Pool: ap + uintptr((pieces-1-k)*n), N: n, ToPool: true}
		}
		if errs := b.Copy(copies); errs != nil {
			t.Fatalf("to the pool: %v", errs)
		}
		for k := range pieces {
			wantBytes(t, fmt.Sprintf("pool piece %d", pieces-1-k), arena[(pieces-1-k)*n:(pieces-k)*n], want[k*n:(k+1)*n])
		}
		if err := rt.CopyToDevice(dev, d, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		for k := range copies {
			copies[k].ToPool = false
		}
		if errs := b.Copy(copies); errs != nil {
			t.Fatalf("from the pool: %v", errs)
		}
		got := make([]byte, size)
		if err := rt.CopyFromDevice(dev, got, d); err != nil {
			t.Fatal(err)
		}
		wantBytes(t, "device after the round trip", got, want)
		if rt.CanMemcpyBatch() && !b.batch.Load() {
			t.Fatal("batched copies failed and were turned off")
		}
	})
}

// TestGPUHIPBackendCopies runs the backend's copies and pinning on the real
// GPU: device memory to a pinned mmap arena and back, in batches of several
// copies, from several goroutines at once.
func TestGPUHIPBackendCopies(t *testing.T) {
	rt, err := hip.Load()
	if errors.Is(err, hip.ErrNotSupported) {
		t.Skipf("no usable GPU runtime on this host: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	b := NewHIPBackendFor(rt, nil)
	defer b.Close()
	const size = 16 << 20
	arena, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(arena)
	ap := uintptr(unsafe.Pointer(&arena[0]))
	if err := b.Pin(ap, size); err != nil {
		t.Fatalf("Pin: %v", err)
	}
	defer func() {
		if err := b.Unpin(ap); err != nil {
			t.Errorf("Unpin: %v", err)
		}
	}()
	if mt, _, err := rt.PointerInfo(ap + 12345); err != nil || mt != hip.MemoryHost {
		t.Fatalf("pinned arena: %v, %v; want host", mt, err)
	}
	const dev = 0
	d, err := rt.Malloc(dev, size)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Free(dev, d)
	want := pattern(size, 3)
	if err := rt.CopyToDevice(dev, d, want); err != nil {
		t.Fatal(err)
	}
	// Each goroutine copies its part as one batch of pieces.
	const parts, pieces = 8, 16
	const part = size / parts
	batch := func(off uintptr, toPool bool) []GPUCopy {
		cs := make([]GPUCopy, pieces)
		for k := range cs {
			o := off + uintptr(k*part/pieces)
			cs[k] = GPUCopy{Device: dev, GPU: d + o, Pool: ap + o, N: part / pieces, ToPool: toPool}
		}
		return cs
	}
	var wg sync.WaitGroup
	for i := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := uintptr(i * part)
			if errs := b.Copy(batch(off, true)); errs != nil {
				t.Errorf("Copy to the pool, part %d: %v", i, errs)
			}
		}()
	}
	wg.Wait()
	if !bytes.Equal(arena, want) {
		t.Fatal("Copy to the pool: the arena differs from the device memory")
	}
	fill(arena, 4)
	for i := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := uintptr(i * part)
			if errs := b.Copy(batch(off, false)); errs != nil {
				t.Errorf("Copy from the pool, part %d: %v", i, errs)
			}
		}()
	}
	wg.Wait()
	got := make([]byte, size)
	if err := rt.CopyFromDevice(dev, got, d); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, arena) {
		t.Fatal("Copy from the pool: the device memory differs from the arena")
	}
	if rt.CanMemcpyBatch() && !b.batch.Load() {
		t.Fatalf("%v: batched copies failed and were turned off", rt)
	}
}

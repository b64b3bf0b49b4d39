//go:build linux

package hip

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// loadGPU returns the process's runtime or skips when there is none.
func loadGPU(tb testing.TB) *Runtime {
	tb.Helper()
	rt, err := Load()
	if errors.Is(err, ErrNotSupported) {
		tb.Skipf("no usable GPU runtime on this host: %v", err)
	}
	if err != nil {
		tb.Fatalf("Load: %v", err)
	}
	return rt
}

// mmapHost maps size bytes of anonymous host memory outside the Go heap.
func mmapHost(tb testing.TB, size int) ([]byte, uintptr) {
	tb.Helper()
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		tb.Fatalf("mmap %d bytes: %v", size, err)
	}
	tb.Cleanup(func() {
		if err := syscall.Munmap(b); err != nil {
			tb.Errorf("munmap: %v", err)
		}
	})
	return b, uintptr(unsafe.Pointer(&b[0]))
}

// pinnedHost is mmapHost's memory pinned with HostRegister until the test
// ends.
func pinnedHost(tb testing.TB, rt *Runtime, size int) ([]byte, uintptr) {
	tb.Helper()
	b, p := mmapHost(tb, size)
	if err := rt.HostRegister(p, uint64(size)); err != nil {
		tb.Fatalf("HostRegister: %v", err)
	}
	tb.Cleanup(func() {
		if err := rt.HostUnregister(p); err != nil {
			tb.Errorf("HostUnregister: %v", err)
		}
	})
	return b, p
}

func fillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
}

func mustMalloc(tb testing.TB, rt *Runtime, dev int, size uint64) uintptr {
	tb.Helper()
	p, err := rt.Malloc(dev, size)
	if err != nil {
		tb.Fatalf("Malloc(%d, %d): %v", dev, size, err)
	}
	if p == 0 {
		tb.Fatalf("Malloc(%d, %d) returned 0", dev, size)
	}
	tb.Cleanup(func() {
		if err := rt.Free(dev, p); err != nil {
			tb.Errorf("Free(%d, %#x): %v", dev, p, err)
		}
	})
	return p
}

// exerciseRuntime runs the API against rt: a real GPU runtime or a fake one.
func exerciseRuntime(t *testing.T, rt *Runtime) {
	n, err := rt.DeviceCount()
	if err != nil {
		t.Fatalf("DeviceCount: %v", err)
	}
	if n <= 0 {
		t.Fatalf("DeviceCount = %d", n)
	}
	dev := n - 1 // not device 0 where there are several, so a device mix-up shows
	t.Logf("%v, %d device(s); testing on device %d", rt, n, dev)

	t.Run("MallocFree", func(t *testing.T) {
		p, err := rt.Malloc(dev, 1<<20)
		if err != nil || p == 0 {
			t.Fatalf("Malloc: %#x, %v", p, err)
		}
		if err := rt.Free(dev, p); err != nil {
			t.Fatalf("Free: %v", err)
		}
	})

	t.Run("ErrorAttribution", func(t *testing.T) {
		// An out-of-range device fails in the device selection, and says so.
		_, err := rt.Malloc(n, 16)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("Malloc on device %d: %v, want *Error", n, err)
		}
		if !strings.HasSuffix(e.Op, "SetDevice") || e.Code != 101 || e.Msg == "" {
			t.Errorf("Malloc on device %d: %+v, want the set-device call failing with 101 and text", n, e)
		}
		if err := rt.SetDevice(n); err == nil {
			t.Errorf("SetDevice(%d) succeeded", n)
		}
		if err := rt.SetDevice(dev); err != nil {
			t.Errorf("SetDevice(%d): %v", dev, err)
		}
		if _, err := rt.GetDevice(); err != nil {
			t.Errorf("GetDevice: %v", err)
		}
		// Freeing host memory is a runtime error carrying the free call's name.
		_, host := mmapHost(t, 4096)
		err = rt.Free(dev, host)
		if !errors.As(err, &e) || !strings.HasSuffix(e.Op, "Free") || e.Code == 0 {
			t.Errorf("Free of host memory: %v, want *Error from the free call", err)
		}
	})

	t.Run("MemcpyRoundTrip", func(t *testing.T) {
		const size = 1<<20 + 13
		src, srcPtr := mmapHost(t, size)
		dst, dstPtr := mmapHost(t, size)
		fillPattern(src, 0x5a)
		d1 := mustMalloc(t, rt, dev, size)
		d2 := mustMalloc(t, rt, dev, size)
		if err := rt.Memcpy(dev, d1, srcPtr, size, MemcpyHostToDevice); err != nil {
			t.Fatalf("Memcpy HtoD: %v", err)
		}
		if err := rt.Memcpy(dev, d2, d1, size, MemcpyDeviceToDevice); err != nil {
			t.Fatalf("Memcpy DtoD: %v", err)
		}
		if err := rt.Memcpy(dev, dstPtr, d2, size, MemcpyDeviceToHost); err != nil {
			t.Fatalf("Memcpy DtoH: %v", err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("HtoD/DtoD/DtoH round trip changed the bytes")
		}
		// Go slices, and the direction inferred by the runtime.
		in := make([]byte, 4096)
		fillPattern(in, 0x33)
		if err := rt.CopyToDevice(dev, d1+100, in); err != nil {
			t.Fatalf("CopyToDevice: %v", err)
		}
		out := make([]byte, len(in))
		if err := rt.CopyFromDevice(dev, out, d1+100); err != nil {
			t.Fatalf("CopyFromDevice: %v", err)
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("CopyToDevice/CopyFromDevice round trip changed the bytes")
		}
		if err := rt.Memcpy(dev, dstPtr, d1+100, 4096, MemcpyDefault); err != nil {
			t.Fatalf("Memcpy default kind: %v", err)
		}
		if !bytes.Equal(dst[:4096], in) {
			t.Fatalf("Memcpy with MemcpyDefault read the wrong bytes")
		}
		if err := rt.CopyToDevice(dev, d1, nil); err != nil {
			t.Errorf("CopyToDevice of nothing: %v", err)
		}
	})

	t.Run("PointerInfo", func(t *testing.T) {
		p := mustMalloc(t, rt, dev, 1<<20)
		for _, q := range []uintptr{p, p + 4096 + 3} {
			mt, d, err := rt.PointerInfo(q)
			if err != nil || mt != MemoryDevice || d != dev {
				t.Errorf("PointerInfo(device %#x) = %v, %d, %v; want device, %d", q, mt, d, err, dev)
			}
		}
		_, host := mmapHost(t, 1<<16)
		mt, d, err := rt.PointerInfo(host)
		if err != nil || mt != MemoryUnregistered || d != -1 {
			t.Errorf("PointerInfo(mmap) = %v, %d, %v; want unregistered, -1", mt, d, err)
		}
		goMem := make([]byte, 64)
		mt, _, err = rt.PointerInfo(uintptr(unsafe.Pointer(&goMem[0])))
		if err != nil || mt != MemoryUnregistered {
			t.Errorf("PointerInfo(Go memory) = %v, %v; want unregistered", mt, err)
		}
	})

	t.Run("AddressRange", func(t *testing.T) {
		const size = 3<<20 + 123
		p := mustMalloc(t, rt, dev, size)
		base, sz, err := rt.AddressRange(dev, p+(1<<20)+7)
		if err != nil {
			t.Fatalf("AddressRange: %v", err)
		}
		if base != p || sz < size {
			t.Errorf("AddressRange(interior) = %#x, %d; want %#x, >= %d", base, sz, p, uint64(size))
		}
	})

	t.Run("IPCHandle", func(t *testing.T) {
		p := mustMalloc(t, rt, dev, 2<<20)
		h, err := rt.IpcGetMemHandle(dev, p)
		if err != nil {
			t.Fatalf("IpcGetMemHandle: %v", err)
		}
		if h == (IpcMemHandle{}) {
			t.Fatalf("IpcGetMemHandle returned an all-zero handle")
		}
		// A process cannot open its own handle.
		q, err := rt.IpcOpenMemHandle(dev, h)
		if err == nil {
			t.Logf("this runtime opened its own IPC handle at %#x", q)
			if err := rt.IpcCloseMemHandle(dev, q); err != nil {
				t.Errorf("IpcCloseMemHandle: %v", err)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) || !strings.HasSuffix(e.Op, "IpcOpenMemHandle") {
			t.Errorf("IpcOpenMemHandle of own handle: %v, want *Error from the open call", err)
		}
		t.Logf("opening our own handle fails as expected: %v", err)
	})

	t.Run("HostRegister", func(t *testing.T) {
		const size = 4 << 20
		_, host := mmapHost(t, size)
		if err := rt.HostRegister(host, size); err != nil {
			t.Fatalf("HostRegister: %v", err)
		}
		mt, _, err := rt.PointerInfo(host + 12345)
		if err != nil || mt != MemoryHost {
			t.Errorf("PointerInfo(registered) = %v, %v; want host", mt, err)
		}
		if err := rt.HostUnregister(host); err != nil {
			t.Fatalf("HostUnregister: %v", err)
		}
		mt, _, err = rt.PointerInfo(host)
		if err != nil || mt != MemoryUnregistered {
			t.Errorf("PointerInfo(unregistered again) = %v, %v; want unregistered", mt, err)
		}
		if err := rt.HostRegisterWithFlags(host, size, HostRegisterPortable); err != nil {
			t.Fatalf("HostRegisterWithFlags(portable): %v", err)
		}
		if err := rt.HostUnregister(host); err != nil {
			t.Fatalf("HostUnregister: %v", err)
		}
	})

	t.Run("MemcpyBatch", func(t *testing.T) {
		if !rt.CanMemcpyBatch() {
			if err := rt.MemcpyBatchAsync(dev, []uintptr{1}, []uintptr{2}, []uint64{3}, MemcpyHostToDevice, 0, 0); !errors.Is(err, ErrNotSupported) {
				t.Fatalf("MemcpyBatchAsync without support: %v, want ErrNotSupported", err)
			}
			// Not a skip: HIP has none, and the GPU check counts skips.
			t.Logf("%v has no batched copies", rt)
			return
		}
		const size, pieces = 1 << 20, 64
		const piece = size / pieces
		src, srcPtr := pinnedHost(t, rt, size)
		dst, dstPtr := pinnedHost(t, rt, size)
		fillPattern(src, 0x3c)
		d := mustMalloc(t, rt, dev, size)
		s, err := rt.StreamCreate(dev)
		if err != nil {
			t.Fatalf("StreamCreate: %v", err)
		}
		defer rt.StreamDestroy(dev, s)
		// Piece k of the host buffer goes to piece pieces-1-k on the device
		// and comes back to piece k: a mix-up of sources, destinations or
		// sizes shows in the bytes.
		var hs, ds []uintptr
		var ns []uint64
		for k := range pieces {
			hs = append(hs, srcPtr+uintptr(k*piece))
			ds = append(ds, d+uintptr((pieces-1-k)*piece))
			ns = append(ns, piece)
		}
		if err := rt.MemcpyBatchAsync(dev, ds, hs, ns, MemcpyHostToDevice, 0, s); err != nil {
			t.Fatalf("MemcpyBatchAsync HtoD: %v", err)
		}
		for k := range hs {
			hs[k] = dstPtr + uintptr(k*piece)
		}
		if err := rt.MemcpyBatchAsync(dev, hs, ds, ns, MemcpyDeviceToHost, 0, s); err != nil {
			t.Fatalf("MemcpyBatchAsync DtoH: %v", err)
		}
		if err := rt.StreamSynchronize(dev, s); err != nil {
			t.Fatalf("StreamSynchronize: %v", err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("batched round trip changed the bytes")
		}
		if err := rt.MemcpyBatchAsync(dev, hs, ds, ns[:1], MemcpyDeviceToHost, 0, s); err == nil {
			t.Fatal("MemcpyBatchAsync with fewer sizes than copies succeeded")
		}
		if err := rt.MemcpyBatchAsync(dev, hs, ds, ns, MemcpyDeviceToDevice, 0, s); err == nil {
			t.Fatal("MemcpyBatchAsync device to device succeeded")
		}
	})

	t.Run("StreamsEvents", func(t *testing.T) {
		const size = 1 << 20
		src, srcPtr := pinnedHost(t, rt, size)
		dst, dstPtr := pinnedHost(t, rt, size)
		fillPattern(src, 0xc3)
		d := mustMalloc(t, rt, dev, size)
		s, err := rt.StreamCreate(dev)
		if err != nil {
			t.Fatalf("StreamCreate: %v", err)
		}
		ev, err := rt.EventCreate(dev)
		if err != nil {
			t.Fatalf("EventCreate: %v", err)
		}
		if err := rt.MemcpyAsync(dev, d, srcPtr, size, MemcpyHostToDevice, s); err != nil {
			t.Fatalf("MemcpyAsync HtoD: %v", err)
		}
		if err := rt.EventRecord(dev, ev, s); err != nil {
			t.Fatalf("EventRecord: %v", err)
		}
		if err := rt.EventSynchronize(dev, ev); err != nil {
			t.Fatalf("EventSynchronize: %v", err)
		}
		if done, err := rt.EventQuery(dev, ev); !done || err != nil {
			t.Fatalf("EventQuery after EventSynchronize: %v, %v; want done", done, err)
		}
		if err := rt.MemcpyAsync(dev, dstPtr, d, size, MemcpyDeviceToHost, s); err != nil {
			t.Fatalf("MemcpyAsync DtoH: %v", err)
		}
		if err := rt.StreamSynchronize(dev, s); err != nil {
			t.Fatalf("StreamSynchronize: %v", err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("async round trip changed the bytes")
		}
		// The default stream.
		clear(dst)
		if err := rt.MemcpyAsync(dev, dstPtr, d, size, MemcpyDeviceToHost, 0); err != nil {
			t.Fatalf("MemcpyAsync on the default stream: %v", err)
		}
		if err := rt.DeviceSynchronize(dev); err != nil {
			t.Fatalf("DeviceSynchronize: %v", err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("default-stream copy changed the bytes")
		}
		if err := rt.EventDestroy(dev, ev); err != nil {
			t.Errorf("EventDestroy: %v", err)
		}
		if err := rt.StreamDestroy(dev, s); err != nil {
			t.Errorf("StreamDestroy: %v", err)
		}
	})

	t.Run("ConcurrentDevices", func(t *testing.T) {
		// Goroutines on every device at once: each call must act on its own
		// device whatever thread it lands on.
		devs := min(n, 4)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					d := (g + i) % devs
					if err := concurrentStep(rt, d); err != nil {
						t.Errorf("goroutine %d step %d on device %d: %v", g, i, d, err)
						return
					}
				}
			}()
		}
		wg.Wait()
	})
}

func concurrentStep(rt *Runtime, d int) (err error) {
	const size = 64 << 10
	p, err := rt.Malloc(d, size)
	if err != nil {
		return err
	}
	defer func() {
		if ferr := rt.Free(d, p); err == nil {
			err = ferr
		}
	}()
	if mt, pd, err := rt.PointerInfo(p + 10); err != nil || mt != MemoryDevice || pd != d {
		return fmt.Errorf("PointerInfo = %v, %d, %v", mt, pd, err)
	}
	if base, _, err := rt.AddressRange(d, p+10); err != nil || base != p {
		return fmt.Errorf("AddressRange = %#x, %v", base, err)
	}
	if _, err := rt.IpcGetMemHandle(d, p); err != nil {
		return err
	}
	s, err := rt.StreamCreate(d)
	if err != nil {
		return err
	}
	if err := rt.StreamSynchronize(d, s); err != nil {
		return err
	}
	return rt.StreamDestroy(d, s)
}

func TestGPU(t *testing.T) {
	exerciseRuntime(t, loadGPU(t))
}

const ipcChildEnv = "UMBP_HIP_TEST_IPC_CHILD"

// TestGPUIPCTwoProcess exports an interior range of an allocation the way a
// worker registers GPU memory (allocation base, handle, offset) and has a
// second process open it, check the bytes and write new ones.
func TestGPUIPCTwoProcess(t *testing.T) {
	rt := loadGPU(t)
	const size = 2 << 20
	const offset = 4096 + 512
	const span = 64 << 10
	dev := 0
	p := mustMalloc(t, rt, dev, size)
	want := make([]byte, span)
	fillPattern(want, 0x17)
	if err := rt.CopyToDevice(dev, p+offset, want); err != nil {
		t.Fatalf("CopyToDevice: %v", err)
	}
	base, allocSize, err := rt.AddressRange(dev, p+offset)
	if err != nil || base != p || allocSize < size {
		t.Fatalf("AddressRange = %#x, %d, %v", base, allocSize, err)
	}
	h, err := rt.IpcGetMemHandle(dev, base)
	if err != nil {
		t.Fatalf("IpcGetMemHandle: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestIPCChildProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d:%d:%d", ipcChildEnv, hex.EncodeToString(h[:]), dev, offset, span))
	out, err := cmd.CombinedOutput()
	t.Logf("child process:\n%s", out)
	if err != nil {
		t.Fatalf("child process: %v", err)
	}
	got := make([]byte, span)
	if err := rt.CopyFromDevice(dev, got, p+offset); err != nil {
		t.Fatalf("CopyFromDevice: %v", err)
	}
	fillPattern(want, 0x71)
	if !bytes.Equal(got, want) {
		t.Fatalf("the child's writes are not visible in the parent")
	}
}

// TestIPCChildProcess is TestGPUIPCTwoProcess's second process.
func TestIPCChildProcess(t *testing.T) {
	arg := os.Getenv(ipcChildEnv)
	if arg == "" {
		t.Skip("runs only as the child process of TestGPUIPCTwoProcess")
	}
	parts := strings.Split(arg, ":")
	if len(parts) != 4 {
		t.Fatalf("bad %s=%q", ipcChildEnv, arg)
	}
	raw, err := hex.DecodeString(parts[0])
	if err != nil || len(raw) != IpcHandleSize {
		t.Fatalf("bad handle %q: %v", parts[0], err)
	}
	var h IpcMemHandle
	copy(h[:], raw)
	dev, _ := strconv.Atoi(parts[1])
	offset, _ := strconv.Atoi(parts[2])
	span, _ := strconv.Atoi(parts[3])

	rt, err := Load()
	if err != nil {
		t.Fatalf("Load in the child: %v", err)
	}
	base, err := rt.IpcOpenMemHandle(dev, h)
	if err != nil {
		// The runtime's refusal, by name: the GPU check reports the path
		// as not run, for this reason.
		t.Fatalf("GPU PATH NOT RUN: TestGPUIPCTwoProcess: a second process opens the IPC handle: IpcOpenMemHandle: %v", err)
	}
	if mt, d, err := rt.PointerInfo(base); err != nil || mt != MemoryDevice || d != dev {
		t.Errorf("PointerInfo(opened) = %v, %d, %v", mt, d, err)
	}
	got := make([]byte, span)
	if err := rt.CopyFromDevice(dev, got, base+uintptr(offset)); err != nil {
		t.Fatalf("CopyFromDevice: %v", err)
	}
	want := make([]byte, span)
	fillPattern(want, 0x17)
	if !bytes.Equal(got, want) {
		t.Fatalf("the child read different bytes than the parent wrote")
	}
	fillPattern(want, 0x71)
	if err := rt.CopyToDevice(dev, base+uintptr(offset), want); err != nil {
		t.Fatalf("CopyToDevice: %v", err)
	}
	if err := rt.DeviceSynchronize(dev); err != nil {
		t.Fatalf("DeviceSynchronize: %v", err)
	}
	if err := rt.IpcCloseMemHandle(dev, base); err != nil {
		t.Fatalf("IpcCloseMemHandle: %v", err)
	}
}

// BenchmarkMemcpy4MiB copies 4 MiB between device memory and pinned (and,
// for comparison, pageable) host memory outside the Go heap.
func BenchmarkMemcpy4MiB(b *testing.B) {
	rt := loadGPU(b)
	const size = 4 << 20
	dev := 0
	d := mustMalloc(b, rt, dev, size)
	pinned, pinnedPtr := pinnedHost(b, rt, size)
	fillPattern(pinned, 1)
	pageable, pageablePtr := mmapHost(b, size)
	fillPattern(pageable, 2)

	cases := []struct {
		name     string
		dst, src uintptr
		kind     MemcpyKind
	}{
		{"HtoD/pinned", d, pinnedPtr, MemcpyHostToDevice},
		{"DtoH/pinned", pinnedPtr, d, MemcpyDeviceToHost},
		{"HtoD/pageable", d, pageablePtr, MemcpyHostToDevice},
		{"DtoH/pageable", pageablePtr, d, MemcpyDeviceToHost},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if err := rt.Memcpy(dev, c.dst, c.src, size, c.kind); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// memcpyFlagPreferOverlapWithCompute is cudaMemcpyFlagPreferOverlapWithCompute.
const memcpyFlagPreferOverlapWithCompute = 1

// BenchmarkMemcpyPieces copies 4 MiB between device memory and pinned host
// memory as many small pieces, the way a server copies the ranges of KV
// blocks, then synchronises once: "loop" queues one MemcpyAsync a piece on
// one stream, "streams4" does so from 4 goroutines on 4 streams, "batch"
// queues them all with one MemcpyBatchAsync ("batch-overlap": with
// cudaMemcpyFlagPreferOverlapWithCompute). Next to BenchmarkMemcpy4MiB it
// gives the cost of a piece.
func BenchmarkMemcpyPieces(b *testing.B) {
	rt := loadGPU(b)
	const size = 4 << 20
	dev := 0
	d := mustMalloc(b, rt, dev, size)
	_, pinnedPtr := pinnedHost(b, rt, size)
	var streams [4]Stream
	for i := range streams {
		s, err := rt.StreamCreate(dev)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = rt.StreamDestroy(dev, s) })
		streams[i] = s
	}
	// queue copies pieces [lo, hi) on s.
	queue := func(dst, src uintptr, n uint64, kind MemcpyKind, lo, hi int, s Stream) error {
		for k := lo; k < hi; k++ {
			off := uintptr(k) * uintptr(n)
			if err := rt.MemcpyAsync(dev, dst+off, src+off, n, kind, s); err != nil {
				return err
			}
		}
		return rt.StreamSynchronize(dev, s)
	}
	for _, pieces := range []int{16, 128, 1024} {
		for _, dir := range []struct {
			name     string
			dst, src uintptr
			kind     MemcpyKind
		}{
			{"DtoH", pinnedPtr, d, MemcpyDeviceToHost},
			{"HtoD", d, pinnedPtr, MemcpyHostToDevice},
		} {
			n := uint64(size / pieces)
			name := fmt.Sprintf("%s/%dx%dKiB", dir.name, pieces, n>>10)
			b.Run(name+"/loop", func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					if err := queue(dir.dst, dir.src, n, dir.kind, 0, pieces, streams[0]); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(name+"/streams4", func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					var wg sync.WaitGroup
					errs := make([]error, len(streams))
					for i, s := range streams {
						wg.Go(func() {
							errs[i] = queue(dir.dst, dir.src, n, dir.kind, i*pieces/len(streams), (i+1)*pieces/len(streams), s)
						})
					}
					wg.Wait()
					if err := errors.Join(errs...); err != nil {
						b.Fatal(err)
					}
				}
			})
			if !rt.CanMemcpyBatch() {
				continue
			}
			dsts, srcs, sizes := make([]uintptr, pieces), make([]uintptr, pieces), make([]uint64, pieces)
			for k := range pieces {
				off := uintptr(k) * uintptr(n)
				dsts[k], srcs[k], sizes[k] = dir.dst+off, dir.src+off, n
			}
			for _, flags := range []uint32{0, memcpyFlagPreferOverlapWithCompute} {
				mode := "batch"
				if flags != 0 {
					mode = "batch-overlap"
				}
				b.Run(name+"/"+mode, func(b *testing.B) {
					b.SetBytes(size)
					for b.Loop() {
						if err := rt.MemcpyBatchAsync(dev, dsts, srcs, sizes, dir.kind, flags, streams[0]); err != nil {
							b.Fatal(err)
						}
						if err := rt.StreamSynchronize(dev, streams[0]); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkMemcpyLayerMajor makes the copies a server makes for 64 KV blocks
// of 128 layers of 32 KiB: on the device layer-major (a block's layers 2 MiB
// apart), in pinned host memory one block after the other. "batch" queues
// all 8192 copies with one MemcpyBatchAsync, "batch-per-block" with one call
// a block, "loop" with one MemcpyAsync a copy; each then synchronises once.
func BenchmarkMemcpyLayerMajor(b *testing.B) {
	rt := loadGPU(b)
	const blocks, layers, piece = 64, 128, 32 << 10
	const size = blocks * layers * piece
	dev := 0
	d := mustMalloc(b, rt, dev, size)
	_, host := pinnedHost(b, rt, size)
	s, err := rt.StreamCreate(dev)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rt.StreamDestroy(dev, s) })
	devAddr := make([]uintptr, 0, blocks*layers)
	hostAddr := make([]uintptr, 0, blocks*layers)
	sizes := make([]uint64, 0, blocks*layers)
	for blk := range blocks {
		for l := range layers {
			devAddr = append(devAddr, d+uintptr((l*blocks+blk)*piece))
			hostAddr = append(hostAddr, host+uintptr((blk*layers+l)*piece))
			sizes = append(sizes, piece)
		}
	}
	for _, dir := range []struct {
		name       string
		dsts, srcs []uintptr
		kind       MemcpyKind
	}{
		{"DtoH", hostAddr, devAddr, MemcpyDeviceToHost},
		{"HtoD", devAddr, hostAddr, MemcpyHostToDevice},
	} {
		wait := func(b *testing.B) {
			if err := rt.StreamSynchronize(dev, s); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(dir.name+"/loop", func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				for k := range dir.dsts {
					if err := rt.MemcpyAsync(dev, dir.dsts[k], dir.srcs[k], piece, dir.kind, s); err != nil {
						b.Fatal(err)
					}
				}
				wait(b)
			}
		})
		if !rt.CanMemcpyBatch() {
			continue
		}
		for _, per := range []int{blocks * layers, layers} {
			name := "batch"
			if per == layers {
				name = "batch-per-block"
			}
			b.Run(dir.name+"/"+name, func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					for lo := 0; lo < len(dir.dsts); lo += per {
						hi := lo + per
						if err := rt.MemcpyBatchAsync(dev, dir.dsts[lo:hi], dir.srcs[lo:hi], sizes[lo:hi], dir.kind, 0, s); err != nil {
							b.Fatal(err)
						}
					}
					wait(b)
				}
			})
		}
	}
}

//go:build linux

package hip

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/umbp-go/umbp-go/internal/hip/hiptest"
)

// buildFake compiles testdata/fakegpu.c into a shared library with the given
// defines and returns its path.
func buildFake(t *testing.T, name string, defines ...string) string {
	t.Helper()
	if !cgoEnabled {
		t.Skip("built without cgo: no runtime can be loaded")
	}
	return hiptest.BuildFake(t, name, defines...)
}

func mustOpen(t *testing.T, opts Options) *Runtime {
	t.Helper()
	rt, err := Open(opts)
	if err != nil {
		t.Fatalf("Open(%+v): %v", opts, err)
	}
	return rt
}

func checkLoaded(t *testing.T, rt *Runtime, v Vendor, version int, lib string) {
	t.Helper()
	if rt.Vendor() != v || rt.RuntimeVersion() != version || rt.Library() != lib {
		t.Fatalf("loaded %s %d from %s; want %s %d from %s",
			rt.Vendor(), rt.RuntimeVersion(), rt.Library(), v, version, lib)
	}
}

func TestFakeHIP6(t *testing.T) {
	lib := buildFake(t, "libamdhip64.so.6", "-DFAKE_HIP6")
	rt := mustOpen(t, Options{HIPLibraries: []string{filepath.Join(t.TempDir(), "missing.so"), lib}})
	checkLoaded(t, rt, VendorHIP, 60342131, lib)
	exerciseRuntime(t, rt)
	exerciseFakeIPC(t, rt)
}

func TestFakeHIP5(t *testing.T) {
	// ROCm 5 numbers memory types differently and rejects unregistered
	// pointers: the same expectations hold.
	lib := buildFake(t, "libamdhip64.so.5", "-DFAKE_HIP5")
	rt := mustOpen(t, Options{HIPLibraries: []string{lib}})
	checkLoaded(t, rt, VendorHIP, 50731921, lib)
	exerciseRuntime(t, rt)
}

func TestFakeCUDA(t *testing.T) {
	lib := buildFake(t, "libcudart.so.13", "-DFAKE_CUDA")
	rt := mustOpen(t, Options{
		HIPLibraries:         []string{filepath.Join(t.TempDir(), "libamdhip64.so.7")},
		CUDARuntimeLibraries: []string{lib},
		CUDADriverLibraries:  []string{filepath.Join(t.TempDir(), "libcuda.so.1"), lib},
	})
	checkLoaded(t, rt, VendorCUDA, 13000, lib)
	if got, want := rt.String(), "cuda 13000 ("+lib+"; driver "+lib+")"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	exerciseRuntime(t, rt)
	exerciseFakeIPC(t, rt)

	// The driver call's errors carry the driver's text.
	_, _, err := rt.AddressRange(0, 0x1000)
	var e *Error
	if !errors.As(err, &e) || e.Op != "cuMemGetAddressRange_v2" || e.Msg != "driver: invalid argument" {
		t.Errorf("AddressRange of an unknown pointer: %v", err)
	}
}

// exerciseFakeIPC opens a handle as if it came from another process: the fake
// accepts it when the pid inside differs and all 64 bytes arrived intact.
func exerciseFakeIPC(t *testing.T, rt *Runtime) {
	const dev = 1
	p := mustMalloc(t, rt, dev, 1<<20)
	data := make([]byte, 8192)
	fillPattern(data, 0x44)
	if err := rt.CopyToDevice(dev, p+4096, data); err != nil {
		t.Fatal(err)
	}
	h, err := rt.IpcGetMemHandle(dev, p+100) // an interior pointer names the whole allocation
	if err != nil {
		t.Fatal(err)
	}
	_, err = rt.IpcOpenMemHandle(dev, h)
	var e *Error
	if !errors.As(err, &e) || e.Code != 201 || e.Msg != "invalid device context" {
		t.Fatalf("opening our own handle: %v, want error 201 (invalid device context)", err)
	}
	foreign := IpcMemHandle(hiptest.Foreign(h[:]))
	q, err := rt.IpcOpenMemHandle(dev, foreign)
	if err != nil {
		t.Fatalf("IpcOpenMemHandle(foreign): %v", err)
	}
	if q != p {
		t.Errorf("opened at %#x, want the allocation base %#x", q, p)
	}
	got := make([]byte, len(data))
	if err := rt.CopyFromDevice(dev, got, q+4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("read through the opened handle gave other bytes")
	}
	if err := rt.IpcCloseMemHandle(0, q); err == nil {
		t.Errorf("IpcCloseMemHandle on the wrong device succeeded")
	}
	if err := rt.IpcCloseMemHandle(dev, q); err != nil {
		t.Errorf("IpcCloseMemHandle: %v", err)
	}
	corrupt := foreign
	corrupt[63] ^= 0xff
	if _, err := rt.IpcOpenMemHandle(dev, corrupt); !errors.As(err, &e) || e.Code != 400 {
		t.Errorf("opening a handle with its last byte changed: %v, want error 400", err)
	}
}

// TestFakeMemcpyBatchForms runs batched copies on both forms of
// cudaMemcpyBatchAsync (CUDA 12.8 has failIdx, 13 does not) and checks that
// an older runtime, and HIP, report none.
func TestFakeMemcpyBatchForms(t *testing.T) {
	for _, v := range []struct {
		version int
		batch   bool
	}{{12000, false}, {12080, true}, {12090, true}, {13000, true}} {
		t.Run(fmt.Sprint(v.version), func(t *testing.T) {
			lib := buildFake(t, "libcudart.so.13", "-DFAKE_CUDA", fmt.Sprintf("-DFAKE_CUDA_VERSION=%d", v.version))
			rt := mustOpen(t, Options{CUDARuntimeLibraries: []string{lib}, CUDADriverLibraries: []string{lib}})
			if got := rt.CanMemcpyBatch(); got != v.batch {
				t.Fatalf("CanMemcpyBatch() = %v, want %v", got, v.batch)
			}
			exerciseRuntime(t, rt)
		})
	}
	rt := mustOpen(t, Options{HIPLibraries: []string{buildFake(t, "libamdhip64.so.6", "-DFAKE_HIP6")}})
	if rt.CanMemcpyBatch() {
		t.Fatal("CanMemcpyBatch() on HIP = true")
	}
}

func TestFakeFallbackToCUDA(t *testing.T) {
	hip := buildFake(t, "libamdhip64.so.7", "-DFAKE_HIP6", "-DFAKE_DEVICES=0")
	cuda := buildFake(t, "libcudart.so.12", "-DFAKE_CUDA")
	rt := mustOpen(t, Options{
		HIPLibraries:         []string{hip},
		CUDARuntimeLibraries: []string{cuda},
		CUDADriverLibraries:  []string{cuda},
	})
	checkLoaded(t, rt, VendorCUDA, 13000, cuda)
}

func TestFakeNoDevices(t *testing.T) {
	hip := buildFake(t, "libamdhip64.so.7", "-DFAKE_HIP6", "-DFAKE_DEVICES=0")
	cuda := buildFake(t, "libcudart.so.13", "-DFAKE_CUDA", "-DFAKE_DEVICES=0")
	_, err := Open(Options{
		HIPLibraries:         []string{hip},
		CUDARuntimeLibraries: []string{cuda},
		CUDADriverLibraries:  []string{cuda},
	})
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Open with no devices: %v, want ErrNotSupported", err)
	}
	for _, want := range []string{
		hip + ": hipGetDeviceCount: no devices",
		cuda + ": cudaGetDeviceCount: error 100 (no device)",
	} {
		if !strings.Contains(loadErrText(err), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestFakeMissingSymbol(t *testing.T) {
	partial := buildFake(t, "libamdhip64.so.7", "-DFAKE_HIP6", "-DFAKE_OMIT_IPC_OPEN")
	_, err := Open(Options{HIPLibraries: []string{partial}})
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Open with a missing symbol: %v, want ErrNotSupported", err)
	}
	if want := partial + ": missing symbols hipIpcOpenMemHandle"; !strings.Contains(loadErrText(err), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
	// The next candidate is tried.
	full := buildFake(t, "libamdhip64.so.6", "-DFAKE_HIP6")
	rt := mustOpen(t, Options{HIPLibraries: []string{partial, full}})
	checkLoaded(t, rt, VendorHIP, 60342131, full)

	// A CUDA runtime without a driver library is not usable.
	cuda := buildFake(t, "libcudart.so.13", "-DFAKE_CUDA")
	_, err = Open(Options{CUDARuntimeLibraries: []string{cuda}, CUDADriverLibraries: []string{partial}})
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(loadErrText(err), "cuMemGetAddressRange_v2") {
		t.Errorf("Open without a driver: %v, want ErrNotSupported naming cuMemGetAddressRange_v2", err)
	}
}

func TestFakeNotALibrary(t *testing.T) {
	if !cgoEnabled {
		t.Skip("built without cgo: no runtime can be loaded")
	}
	bad := filepath.Join(t.TempDir(), "libamdhip64.so.7")
	if err := os.WriteFile(bad, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Open(Options{HIPLibraries: []string{bad}})
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(loadErrText(err), bad) {
		t.Errorf("Open of a non-library: %v, want ErrNotSupported naming %s", err, bad)
	}
}

// BenchmarkFakeCall measures the cost of one call through the binding into
// the fake runtime, whose entry points do almost nothing: the Go wrapper,
// the cgo transition and the C trampoline.
func BenchmarkFakeCall(b *testing.B) {
	if !cgoEnabled {
		b.Skip("built without cgo: no runtime can be loaded")
	}
	lib := hiptest.BuildFake(b, "libcudart.so.13", "-DFAKE_CUDA")
	rt, err := Open(Options{CUDARuntimeLibraries: []string{lib}, CUDADriverLibraries: []string{lib}})
	if err != nil {
		b.Fatal(err)
	}
	const dev = 1
	s, err := rt.StreamCreate(dev)
	if err != nil {
		b.Fatal(err)
	}
	ev, err := rt.EventCreate(dev)
	if err != nil {
		b.Fatal(err)
	}
	if err := rt.EventRecord(dev, ev, s); err != nil {
		b.Fatal(err)
	}
	p, err := rt.Malloc(dev, 4096)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, err := range []error{rt.Free(dev, p), rt.EventDestroy(dev, ev), rt.StreamDestroy(dev, s)} {
			if err != nil {
				b.Error(err)
			}
		}
	})
	buf := make([]byte, 64)
	b.Run("DeviceCount", func(b *testing.B) {
		for b.Loop() {
			if _, err := rt.DeviceCount(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("EventQuery", func(b *testing.B) {
		for b.Loop() {
			if _, err := rt.EventQuery(dev, ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("CopyToDevice64", func(b *testing.B) {
		for b.Loop() {
			if err := rt.CopyToDevice(dev, p, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("PointerInfo", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := rt.PointerInfo(p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

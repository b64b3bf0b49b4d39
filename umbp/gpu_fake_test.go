package umbp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/internal/hip/hiptest"
	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// These tests run GPU registration and transfers without a GPU: the worker
// uses the fake GPU runtime (internal/hip/testdata/fakegpu.c, two devices
// over host memory), and an in-process server serves it through the HIP
// backend on the same fake runtime. Client and server share the process, so
// the server's handle opens are made to look foreign to the fake.

// fakeDev is the device the tests use: not 0, so that a call that does not
// select its device fails in the fake.
const fakeDev = 1

// useFakeGPU loads the fake runtime and makes the umbp package use it.
func useFakeGPU(t *testing.T) *hip.Runtime {
	t.Helper()
	lib := hiptest.BuildFake(t, "libamdhip64.so.6", "-DFAKE_HIP6")
	rt, err := hip.Open(hip.Options{HIPLibraries: []string{lib}})
	if errors.Is(err, hip.ErrNotSupported) {
		t.Skipf("cannot load the fake GPU runtime: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(umbp.SetGPURuntime(rt, nil))
	return rt
}

// foreignBackend opens the fake runtime's handles as another process's.
type foreignBackend struct{ *server.HIPBackend }

func (f foreignBackend) OpenIPC(device int, handle []byte) (uintptr, error) {
	return f.HIPBackend.OpenIPC(device, hiptest.Foreign(handle))
}

// fakeGPUServer starts an in-process v2 server with the HIP backend on rt.
func fakeGPUServer(t *testing.T, rt *hip.Runtime) (*server.Server, *server.HIPBackend) {
	t.Helper()
	b := server.NewHIPBackendFor(rt, testLogger(t))
	srv, err := server.New(server.Options{
		Endpoint: "unix://" + filepath.Join(shortDir(t), "g.grpc.sock"),
		Capacity: 32 << 20,
		GPU:      foreignBackend{b},
		Logger:   testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("server close: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("backend close: %v", err)
		}
	})
	return srv, b
}

// gpuMalloc allocates device memory that the test frees at its end.
func gpuMalloc(t *testing.T, rt *hip.Runtime, dev int, size uint64) uintptr {
	t.Helper()
	p, err := rt.Malloc(dev, size)
	if err != nil {
		t.Fatalf("Malloc(%d, %d): %v", dev, size, err)
	}
	t.Cleanup(func() {
		if err := rt.Free(dev, p); err != nil {
			t.Errorf("Free: %v", err)
		}
	})
	return p
}

func gpuWorker(t *testing.T, rt *umbp.StandaloneRuntime) *umbp.WorkerHandle {
	t.Helper()
	w, err := rt.NewWorkerHandle(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("worker close: %v", err)
		}
	})
	return w
}

// gpuPattern is the content of a test block: distinct per seed and offset.
func gpuPattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*13+i>>8) ^ seed
	}
	return b
}

// gpuSpan is a piece of device memory a plan's range names.
type gpuSpan struct {
	addr uintptr
	n    uint64
}

// gpuPlan is a plan whose ranges lie at spans, tiling the object in order.
func gpuPlan(key string, spans ...gpuSpan) umbp.BlockTransferPlan {
	p := umbp.BlockTransferPlan{Key: key}
	var off uint64
	for i, s := range spans {
		p.Ranges = append(p.Ranges, umbp.KVRange{
			LayerName: fmt.Sprintf("layer.%d", i), BaseAddress: s.addr, Length: s.n, ObjectOffset: off,
		})
		off += s.n
	}
	return p
}

// gpuWritePlan fills the plan's ranges with the object's bytes.
func gpuWritePlan(t *testing.T, rt *hip.Runtime, dev int, p umbp.BlockTransferPlan, obj []byte) {
	t.Helper()
	for _, r := range p.Ranges {
		if err := rt.CopyToDevice(dev, r.BaseAddress, obj[r.ObjectOffset:r.ObjectOffset+r.Length]); err != nil {
			t.Fatal(err)
		}
	}
}

// gpuReadPlan gathers the plan's ranges from device memory.
func gpuReadPlan(t *testing.T, rt *hip.Runtime, dev int, p umbp.BlockTransferPlan) []byte {
	t.Helper()
	out := make([]byte, p.ObjectSize())
	for _, r := range p.Ranges {
		if err := rt.CopyFromDevice(dev, out[r.ObjectOffset:r.ObjectOffset+r.Length], r.BaseAddress); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func gpuWantCompleted(t *testing.T, w *umbp.WorkerHandle, job *umbp.TransferJob, what string) {
	t.Helper()
	if err := w.Wait(context.Background(), job); err != nil {
		t.Fatalf("%s: wait: %v", what, err)
	}
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("%s: %s: %s (failed %v)", what, job.Status(), job.Err(), job.FailedKeys())
	}
}

func gpuWaitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRegisterGPUWithoutRuntime(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libamdhip64.so.7")
	_, loadErr := hip.Open(hip.Options{HIPLibraries: []string{missing}})
	if !errors.Is(loadErr, hip.ErrNotSupported) {
		t.Fatalf("hip.Open of a missing library: %v", loadErr)
	}
	t.Cleanup(umbp.SetGPURuntime(nil, loadErr))
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 1, 4, 4096)
	goHeap := make([]byte, 4096)
	err := e.w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{
		"gpu":  {Ptr: 0xdead0000, Size: 4096, Location: umbp.LocationGPU},
		"auto": {Ptr: uintptr(unsafe.Pointer(&goHeap[0])), Size: 4096},
	})
	if !errors.Is(err, umbp.ErrNotSupported) || !errors.Is(err, hip.ErrNotSupported) || !errors.Is(err, umbp.ErrInvalidBuffer) {
		t.Fatalf("RegisterBuffers without a GPU runtime: %v, want ErrNotSupported (the GPU buffer) and ErrInvalidBuffer (the Go heap's)", err)
	}
	for _, frag := range []string{`"gpu"`, `"auto"`, "NewHostBuffer", "no GPU runtime"} {
		if !strings.Contains(err.Error(), frag) {
			t.Errorf("error %q does not mention %s", err, frag)
		}
	}
	// One short line per buffer: the libraries tried go to the debug log.
	for _, line := range strings.Split(err.Error(), "\n") {
		if len(line) > 300 || strings.Contains(line, missing) {
			t.Errorf("error line of %d bytes lists the libraries tried: %q", len(line), line)
		}
	}
	if n := srv.Calls("RegisterMemory"); n != 1 {
		t.Errorf("%d RegisterMemory calls, want only the engine's host buffer", n)
	}

	job := e.w.Store(e.plans(t, "s", 0, 1), umbp.AfterStream(0, 0))
	waitJob(t, e.w, job)
	if job.Status() != umbp.JobFailed || !errors.Is(job.Err(), umbp.ErrNotAttempted) || !errors.Is(job.Err(), umbp.ErrNotSupported) {
		t.Fatalf("AfterStream without a GPU runtime: %s %v, want failed as not attempted", job.Status(), job.Err())
	}
	if n := srv.Calls("BatchPutRanges"); n != 0 {
		t.Errorf("%d puts reached the server", n)
	}

	// Loads take the option too, and fail the same way.
	load := e.w.Load(e.plans(t, "s", 0), umbp.AfterStream(0, 0))
	waitJob(t, e.w, load)
	blocks := e.w.LoadBlocks([]umbp.Block{{Key: "s-0", BlockID: 1}}, umbp.AfterStream(0, 0))
	waitJob(t, e.w, blocks)
	for _, job := range []*umbp.TransferJob{load, blocks} {
		if job.Status() != umbp.JobFailed || !errors.Is(job.Err(), umbp.ErrNotAttempted) || !errors.Is(job.Err(), umbp.ErrNotSupported) {
			t.Fatalf("load with AfterStream without a GPU runtime: %s %v, want failed as not attempted", job.Status(), job.Err())
		}
	}
	if n := srv.Calls("BatchGet") + srv.Calls("BatchGetRanges"); n != 0 {
		t.Errorf("%d gets reached the server", n)
	}
}

// TestFakeRuntimeGPUTransfers stores and loads blocks whose ranges lie in
// two device allocations, registered as interior buffers.
func TestFakeRuntimeGPUTransfers(t *testing.T) {
	rt := useFakeGPU(t)
	srv, backend := fakeGPUServer(t, rt)
	urt := newRuntime(t, testConfig(t, srv.Endpoint()))
	const size1, size2 = 1 << 20, 256 << 10
	a1 := gpuMalloc(t, rt, fakeDev, size1)
	a2 := gpuMalloc(t, rt, fakeDev, size2)
	w := gpuWorker(t, urt)
	ctx := context.Background()
	err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{
		"k": {Ptr: a1, Size: 256 << 10},
		"v": {Ptr: a1 + 512<<10, Size: 256 << 10, Location: umbp.LocationGPU, Device: fakeDev},
		"x": {Ptr: a2 + 4096, Size: 64 << 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	st := srv.Stats()
	if st.Regions != 2 || st.GPUHandles != 2 || backend.OpenHandles() != 2 {
		t.Fatalf("three buffers in two allocations: %d regions, %d server handles, %d open; want 2 each", st.Regions, st.GPUHandles, backend.OpenHandles())
	}

	// Bad buffers fail with their reasons; the good ones stay registered.
	goHeap := make([]byte, 4096)
	err = w.RegisterBuffers(ctx, map[string]umbp.Buffer{
		"spills": {Ptr: a2 + 4096, Size: size2},
		"device": {Ptr: a1, Size: 4096, Location: umbp.LocationGPU, Device: 0},
		"host":   {Ptr: uintptr(unsafe.Pointer(&goHeap[0])), Size: 4096},
	})
	for _, frag := range []string{`"spills"`, "does not lie inside its allocation", `"device"`, "names device 0", `"host"`, "NewHostBuffer"} {
		if err == nil || !strings.Contains(err.Error(), frag) {
			t.Errorf("bad buffers: error %v does not mention %s", err, frag)
		}
	}
	if !errors.Is(err, umbp.ErrInvalidBuffer) || errors.Is(err, umbp.ErrNotSupported) {
		t.Errorf("GPU buffers outside their allocation or device, and host memory outside a HostBuffer: %v, want ErrInvalidBuffer alone", err)
	}

	// Four blocks of five ranges each, across both allocations and outside
	// the registered buffers' own bounds (the whole allocation is registered).
	const rlen = 8 << 10
	var src, dst []umbp.BlockTransferPlan
	objs := map[string][]byte{}
	for i := range 4 {
		key := fmt.Sprintf("blk-%d", i)
		o := uintptr(i) * 2 * rlen
		src = append(src, gpuPlan(key,
			gpuSpan{a1 + o, rlen}, gpuSpan{a1 + 512<<10 + o, rlen}, gpuSpan{a2 + 4096 + o, rlen},
			gpuSpan{a1 + o + rlen, rlen / 2}, gpuSpan{a1 + 900<<10 + 2*o, 3 * rlen}))
		dst = append(dst, gpuPlan(key,
			gpuSpan{a2 + 128<<10 + o, rlen}, gpuSpan{a1 + 300<<10 + o, rlen}, gpuSpan{a1 + 800<<10 + o, rlen},
			gpuSpan{a2 + 200<<10 + o/2, rlen / 2}, gpuSpan{a1 + 400<<10 + o*2, 3 * rlen}))
		objs[key] = gpuPattern(int(src[i].ObjectSize()), byte(i+1))
		gpuWritePlan(t, rt, fakeDev, src[i], objs[key])
	}
	stream, err := rt.StreamCreate(fakeDev)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.StreamDestroy(fakeDev, stream)
	gpuWantCompleted(t, w, w.Store(src, umbp.AfterStream(fakeDev, uintptr(stream))), "store")
	gpuWantCompleted(t, w, w.Load(dst, umbp.AfterStream(fakeDev, uintptr(stream))), "load")
	for _, p := range dst {
		if got := gpuReadPlan(t, rt, fakeDev, p); !bytes.Equal(got, objs[p.Key]) {
			t.Fatalf("%s: loaded bytes differ", p.Key)
		}
	}

	// An AfterStream event that cannot be recorded: the transfer is not
	// attempted.
	job := w.Store(src[:1], umbp.AfterStream(0, uintptr(stream)))
	waitJob(t, w, job)
	if job.Status() != umbp.JobFailed || !errors.Is(job.Err(), umbp.ErrNotAttempted) {
		t.Fatalf("store after a stream of another device: %s %v", job.Status(), job.Err())
	}
	job = w.Load(dst[:1], umbp.AfterStream(0, uintptr(stream)))
	waitJob(t, w, job)
	if job.Status() != umbp.JobFailed || !errors.Is(job.Err(), umbp.ErrNotAttempted) {
		t.Fatalf("load after a stream of another device: %s %v", job.Status(), job.Err())
	}

	// A second handle registers the same allocation: the server maps it once.
	w2 := gpuWorker(t, urt)
	if err := w2.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": {Ptr: a1 + 4096, Size: 4096}}); err != nil {
		t.Fatal(err)
	}
	if st := srv.Stats(); st.GPUHandles != 3 || backend.OpenHandles() != 2 {
		t.Fatalf("second handle: %d server handles, %d open; want 3, 2", st.GPUHandles, backend.OpenHandles())
	}
	only1 := gpuPlan("blk-0", gpuSpan{a1 + 700<<10, src[0].ObjectSize()})
	gpuWantCompleted(t, w2, w2.Load([]umbp.BlockTransferPlan{only1}), "load by the second handle")
	if got := gpuReadPlan(t, rt, fakeDev, only1); !bytes.Equal(got, objs["blk-0"]) {
		t.Fatal("second handle: loaded bytes differ")
	}

	// The first handle goes: its allocation a2 is closed, a1 stays open for
	// the second. A new handle registers both again.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	gpuWaitUntil(t, "a2's handle to close", func() bool { return backend.OpenHandles() == 1 })
	w3 := gpuWorker(t, urt)
	if err := w3.RegisterBuffers(ctx, map[string]umbp.Buffer{"a": {Ptr: a1, Size: size1}, "b": {Ptr: a2, Size: size2}}); err != nil {
		t.Fatal(err)
	}
	if n := backend.OpenHandles(); n != 2 {
		t.Fatalf("after re-registration %d handles open, want 2", n)
	}
	for _, p := range dst {
		for _, r := range p.Ranges {
			if err := rt.CopyToDevice(fakeDev, r.BaseAddress, make([]byte, r.Length)); err != nil {
				t.Fatal(err)
			}
		}
	}
	gpuWantCompleted(t, w3, w3.Load(dst), "load by the new handle")
	for _, p := range dst {
		if got := gpuReadPlan(t, rt, fakeDev, p); !bytes.Equal(got, objs[p.Key]) {
			t.Fatalf("%s: loaded bytes differ after re-registration", p.Key)
		}
	}
	for _, h := range []*umbp.WorkerHandle{w2, w3} {
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}
	gpuWaitUntil(t, "every handle to close", func() bool { return backend.OpenHandles() == 0 })
}

// TestRegisterGPURefused: a server that cannot take GPU memory refuses with
// its reason, which the error carries.
func TestRegisterGPURefused(t *testing.T) {
	rt := useFakeGPU(t)
	p := gpuMalloc(t, rt, fakeDev, 64<<10)
	for _, tc := range []struct {
		name   string
		opts   umbptest.Options
		reason string
		notSup bool
	}{
		{"v1", umbptest.Options{Version: 1}, server.MsgFDRegistrationNotFound, true},
		{"ssd tier on", umbptest.Options{DisableRangedIO: true}, server.MsgGPUNeedsSSDDisabled, true},
		{"no GPU backend", umbptest.Options{}, server.MsgGPUUnsupported, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.opts)
			w := gpuWorker(t, newRuntime(t, testConfig(t, srv.Endpoint())))
			err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{"kv": {Ptr: p + 100, Size: 1000}})
			var refused *conn.RefusedError
			if !errors.As(err, &refused) || refused.Reason != tc.reason {
				t.Fatalf("error %v, want the server's refusal %q", err, tc.reason)
			}
			if !strings.Contains(err.Error(), tc.reason) || !strings.Contains(err.Error(), `"kv"`) {
				t.Errorf("error %q does not carry the reason and the buffer's name", err)
			}
			if errors.Is(err, umbp.ErrNotSupported) != tc.notSup {
				t.Errorf("errors.Is(%v, ErrNotSupported) = %v, want %v", err, !tc.notSup, tc.notSup)
			}
			// Nothing was registered: a transfer into it is not attempted.
			job := w.Load([]umbp.BlockTransferPlan{gpuPlan("k", gpuSpan{p + 100, 1000})})
			waitJob(t, w, job)
			if !errors.Is(job.Err(), umbp.ErrNotAttempted) {
				t.Errorf("load into refused memory: %v", job.Err())
			}
		})
	}
}

// TestFakeRuntimeGPUScenarios runs the TestGPU scenarios on the fake runtime
// and one in-process server, at a smaller scale: it checks the scenarios'
// own logic where no GPU can run them.
func TestFakeRuntimeGPUScenarios(t *testing.T) {
	rt := useFakeGPU(t)
	srv, _ := fakeGPUServer(t, rt)
	e := gpuEnv{rt: rt, dev: fakeDev, small: true, server: func(*testing.T, string) string { return srv.Endpoint() }}
	for _, sc := range []struct {
		name string
		run  func(*testing.T, gpuEnv)
	}{
		{"InteriorManyRanges", scenarioInteriorManyRanges},
		{"SeveralAllocations", scenarioSeveralAllocations},
		{"Reregistration", scenarioReregistration},
		{"AfterStream", scenarioAfterStream},
		{"WaitRunsTheJob", scenarioWaitRunsTheJob},
		{"TransferGoroutines", scenarioTransferGoroutines},
		{"Bandwidth", scenarioBandwidth},
	} {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, e) })
	}
}

// TestFakeRuntimeTwoProcessScenarios runs the TestGPU scenarios as the GPU
// check does, with the server as a separate process, both processes on the
// fake runtime built to share device memory between processes.
func TestFakeRuntimeTwoProcessScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	lib := hiptest.BuildFake(t, "libamdhip64.so.6", "-DFAKE_HIP6", "-DFAKE_SHARED")
	rt, err := hip.Open(hip.Options{HIPLibraries: []string{lib}})
	if errors.Is(err, hip.ErrNotSupported) {
		t.Skipf("cannot load the fake GPU runtime: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(umbp.SetGPURuntime(rt, nil))
	bin := serverBinary(t)
	libEnv := hip.EnvHIPLibrary + "=" + lib
	e := gpuEnv{rt: rt, dev: fakeDev, small: true,
		server: func(t *testing.T, capacity string) string {
			return gpuServerProcess(t, bin, capacity, libEnv)
		},
		process: func(t *testing.T, endpoint, capacity string) *gpuProc {
			return startGPUProc(t, bin, endpoint, capacity, libEnv)
		},
		childEnv: []string{libEnv},
	}
	for _, sc := range []struct {
		name string
		run  func(*testing.T, gpuEnv)
	}{
		{"InteriorManyRanges", scenarioInteriorManyRanges},
		{"Reregistration", scenarioReregistration},
		{"AfterStream", scenarioAfterStream},
		{"WaitRunsTheJob", scenarioWaitRunsTheJob},
		{"WaitPaused", scenarioWaitPaused},
		{"TransferGoroutines", scenarioTransferGoroutines},
		{"ServerRestart", scenarioServerRestart},
		{"CrashedClient", scenarioCrashedClient},
	} {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, e) })
	}
}

// TestFakeRuntimeGPUPathNotRun: where the GPU runtime refuses a path (here
// the server's runtime cannot open the worker's IPC handles), a TestGPU
// test says so by name, with the runtime's reason, and fails: the GPU
// check reports the path as not run, neither passed nor skipped. The test
// runs TestGPUWaitRunsTheJob as the GPU check does, in a process of its
// own, on the fake runtime.
func TestFakeRuntimeGPUPathNotRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	lib := hiptest.BuildFake(t, "libamdhip64.so.6", "-DFAKE_HIP6", "-DFAKE_SHARED")
	bin := serverBinary(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPUWaitRunsTheJob$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), hip.EnvHIPLibrary+"="+lib, envGPUServerBin+"="+bin, envGPUEndpoint+"=",
		"UMBP_FAKE_IPC_OPEN_FAILS=1")
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("the test passed, or did not run (%v), where the server cannot open IPC handles:\n%s", err, out)
	}
	for _, want := range []string{"GPU PATH NOT RUN: TestGPUWaitRunsTheJob: GPU memory registered by IPC handle: ", "hipIpcOpenMemHandle failed", "--- FAIL: TestGPUWaitRunsTheJob"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("its output does not say %q:\n%s", want, out)
		}
	}
}

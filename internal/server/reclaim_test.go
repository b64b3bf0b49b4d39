package server

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// The child client process these tests start: this test binary again, run
// with TestClientProcessChild and its orders in the environment.
const (
	childEndpointEnv = "UMBP_SERVER_TEST_CHILD_ENDPOINT"
	childModeEnv     = "UMBP_SERVER_TEST_CHILD_MODE"   // host, host-put, gpu, gpu-put, send
	childHandleEnv   = "UMBP_SERVER_TEST_CHILD_HANDLE" // gpu: the IPC handle, hex
	childMemfdName   = "umbp-child-region"
	childRegionSize  = 4 << 20
	childPutSize     = 64 << 10
	childGPUBase     = 0x7e0000000000
)

// TestClientProcessChild is the client process of TestReclaimOnClientExit;
// run on its own it is skipped. It registers two host regions (host,
// host-put) or one GPU region (gpu, gpu-put), prints "ready", and then waits
// for its stdin to close (the -put modes put from their first region before
// "ready") and exits without deregistering. In mode send it only writes a
// registration to the fd socket, prints "ready" and waits, never reading
// the answer.
func TestClientProcessChild(t *testing.T) {
	endpoint := os.Getenv(childEndpointEnv)
	if endpoint == "" {
		t.Skip("run as a child process by TestReclaimOnClientExit")
	}
	fail := func(format string, args ...any) {
		fmt.Printf("child: "+format+"\n", args...)
		os.Exit(3)
	}
	cc, c := dial(t, endpoint)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mode := os.Getenv(childModeEnv)
	var first uint64
	switch mode {
	case "send":
		_, fdPath, err := fdpass.SocketPaths(endpoint)
		if err != nil {
			fail("%v", err)
		}
		fd, err := unix.MemfdCreate(childMemfdName, unix.MFD_CLOEXEC)
		if err != nil {
			fail("memfd: %v", err)
		}
		if err := unix.Ftruncate(fd, childRegionSize); err != nil {
			fail("ftruncate: %v", err)
		}
		msg, err := fdpass.Registration{ClientID: "child", WorkerBase: 0x10000, Size: childRegionSize}.Encode()
		if err != nil {
			fail("%v", err)
		}
		uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: fdPath, Net: "unix"})
		if err != nil {
			fail("connect: %v", err)
		}
		if _, _, err := uc.WriteMsgUnix(msg, unix.UnixRights(fd), nil); err != nil {
			fail("send: %v", err)
		}
	case "host", "host-put":
		_, fdPath, err := fdpass.SocketPaths(endpoint)
		if err != nil {
			fail("%v", err)
		}
		for i := range 2 {
			fd, err := unix.MemfdCreate(childMemfdName, unix.MFD_CLOEXEC)
			if err != nil {
				fail("memfd: %v", err)
			}
			if err := unix.Ftruncate(fd, childRegionSize); err != nil {
				fail("ftruncate: %v", err)
			}
			mem, err := unix.Mmap(fd, 0, childRegionSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				fail("mmap: %v", err)
			}
			fill(mem, byte(i))
			base := uint64(uintptr(unsafe.Pointer(&mem[0])))
			if i == 0 {
				first = base
			}
			if err := fdpass.Send(ctx, fdPath, fd, fdpass.Registration{ClientID: "child", WorkerBase: base, Size: childRegionSize}, nil); err != nil {
				fail("handoff: %v", err)
			}
			r, err := c.RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{ClientId: "child", WorkerBase: base, Size: childRegionSize})
			if err != nil || !r.GetOk() {
				fail("RegisterMemory: %v %v", r, err)
			}
		}
	case "gpu", "gpu-put":
		first = childGPUBase
		handle, err := hex.DecodeString(os.Getenv(childHandleEnv))
		if err != nil {
			fail("handle: %v", err)
		}
		r, err := c.RegisterMemory(ctx, gpuReq("child", childGPUBase, childRegionSize, 0, handle, 0, childGPUBase))
		if err != nil || !r.GetOk() {
			fail("RegisterMemory GPU: %v %v", r, err)
		}
	default:
		fail("unknown mode %q", mode)
	}
	if strings.HasSuffix(mode, "-put") {
		// The parent stalls this put's copy; the process exits under it.
		go func() {
			_, _ = c.Put(ctx, &umbppb.PutRequest{Key: "k", ClientId: "child", Size: childPutSize, RegionBase: first})
		}()
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0) // without deregistering, and leaving the put in flight
}

// TestHandoffFromExitedProcess: a registration whose sender has exited
// (and been reaped) by the time the server reads it is refused: nobody is
// left to use the region, and nothing could tell the server when to drop it.
func TestHandoffFromExitedProcess(t *testing.T) {
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	h := newHarness(t, Options{Capacity: 1 << 20, FDGate: func(ctx context.Context) error {
		entered <- struct{}{}
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	ch := startChild(t, h.srv.Endpoint(), "send")
	<-entered // the server holds the connection, the message unread
	if err := ch.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = ch.cmd.Wait()
	close(gate)
	if !waitFor(5*time.Second, func() bool { return h.srv.Stats().FDRejected == 1 }) {
		st := h.srv.Stats()
		t.Fatalf("handoff from a reaped process: %d rejected, %d regions; want 1 0", st.FDRejected, st.Regions)
	}
	if st := h.srv.Stats(); st.Regions != 0 || st.ClientProcesses != 0 {
		t.Fatalf("%d regions, %d processes; want 0 0", st.Regions, st.ClientProcesses)
	}
	if n := childMappings(t); n != 0 {
		t.Fatalf("%d mappings of the dead sender's memfd", n)
	}
}

// child is a running client process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startChild starts a client process in mode and returns once it has
// registered its memory.
func startChild(t *testing.T, endpoint, mode string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestClientProcessChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), append(env, childEndpointEnv+"="+endpoint, childModeEnv+"="+mode)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		var lines []string
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- ""
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
			lines = append(lines, sc.Text())
		}
		ready <- strings.Join(lines, "\n")
	}()
	select {
	case out := <-ready:
		if out != "" {
			t.Fatalf("child exited before registering:\n%s", out)
		}
	case <-time.After(time.Minute):
		t.Fatal("child did not register within a minute")
	}
	return ch
}

// waitCopying waits for the child's put to reach its copy.
func waitCopying(t *testing.T, copying <-chan struct{}) {
	t.Helper()
	select {
	case <-copying:
	case <-time.After(time.Minute):
		t.Fatal("the child's put did not reach its copy within a minute")
	}
}

// childMappings counts this process's mappings of the child's memfds.
func childMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("cannot read mappings: %v", err)
	}
	return strings.Count(string(b), "/memfd:"+childMemfdName)
}

// wantReclaimed waits (at most a second) for the server's mappings of the
// child's memory to be back at baseline and its regions gone.
func wantReclaimed(t *testing.T, h *harness, what string, mappings func() int) {
	t.Helper()
	start := time.Now()
	if !waitFor(time.Second, func() bool { return mappings() == 0 && h.srv.Stats().Regions == 0 }) {
		t.Fatalf("%s: %d mappings and %d regions left a second later; want 0 0", what, mappings(), h.srv.Stats().Regions)
	}
	t.Logf("%s: released %v later", what, time.Since(start))
	if st := h.srv.Stats(); st.ClientProcesses != 0 || st.ReclaimedProcesses != 1 {
		t.Fatalf("%s: %d client processes watched, %d reclaimed; want 0 1", what, st.ClientProcesses, st.ReclaimedProcesses)
	}
}

// TestReclaimOnClientExit: the regions of a client process that exits
// without deregistering (killed, or exiting while the server is stalled in
// a copy from its memory) are released: the server's mappings go back to
// their baseline, at once for regions no copy uses, and for a region under
// a stalled copy once that copy ends, not before. GPU regions' IPC handles
// likewise.
func TestReclaimOnClientExit(t *testing.T) {
	t.Run("SIGKILL", func(t *testing.T) {
		h := newHarness(t, Options{Capacity: 16 << 20})
		if n := childMappings(t); n != 0 {
			t.Fatalf("%d mappings before the child", n)
		}
		ch := startChild(t, h.srv.Endpoint(), "host")
		if n, st := childMappings(t), h.srv.Stats(); n != 2 || st.Regions != 2 || st.ClientProcesses != 1 {
			t.Fatalf("registered: %d mappings, %d regions, %d processes; want 2 2 1", n, st.Regions, st.ClientProcesses)
		}
		if err := ch.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = ch.cmd.Wait()
		wantReclaimed(t, h, "after SIGKILL", func() int { return childMappings(t) })
		if st := h.srv.Stats(); st.ReclaimedRegions != 2 {
			t.Fatalf("%d regions reclaimed, want 2", st.ReclaimedRegions)
		}
	})

	t.Run("exit during a stalled copy", func(t *testing.T) {
		h := newHarness(t, Options{Capacity: 16 << 20})
		copying := make(chan struct{}, 1)
		block := make(chan struct{})
		hook := func() {
			copying <- struct{}{}
			<-block
		}
		h.srv.hostCopyHook.Store(&hook)
		ch := startChild(t, h.srv.Endpoint(), "host-put")
		waitCopying(t, copying) // the put holds the first region
		_ = ch.stdin.Close()
		if err := ch.cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
		// The process is gone: its regions leave the table at once, the one
		// no copy uses is unmapped, the one under the copy stays mapped.
		if !waitFor(time.Second, func() bool { return h.srv.Stats().Regions == 0 && childMappings(t) == 1 }) {
			t.Fatalf("child gone, copy stalled: %d regions, %d mappings; want 0 1", h.srv.Stats().Regions, childMappings(t))
		}
		if st := h.srv.Stats(); st.ReclaimedRegions != 2 {
			t.Fatalf("%d regions reclaimed, want 2", st.ReclaimedRegions)
		}
		h.srv.hostCopyHook.Store(nil)
		close(block)
		wantReclaimed(t, h, "after the stalled copy ended", func() int { return childMappings(t) })
		// The copy itself read mapped memory: the put stored the child's bytes.
		if !waitFor(time.Second, func() bool { return h.exists(t, "k") }) {
			t.Fatal("the stalled put did not store its object")
		}
	})

	t.Run("GPU SIGKILL", func(t *testing.T) {
		h, f := newGPUHarness(t, Options{})
		handle, _ := f.alloc(childRegionSize, 9)
		ch := startChild(t, h.srv.Endpoint(), "gpu", childHandleEnv+"="+hex.EncodeToString(handle))
		if _, open, _ := f.counts(); open != 1 || h.srv.Stats().ClientProcesses != 1 {
			t.Fatalf("registered: %d handles open, %d processes; want 1 1", open, h.srv.Stats().ClientProcesses)
		}
		if err := ch.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = ch.cmd.Wait()
		wantReclaimed(t, h, "GPU after SIGKILL", func() int { _, open, _ := f.counts(); return open })
		if _, _, closes := f.counts(); closes != 1 {
			t.Fatalf("%d handle closes, want 1", closes)
		}
	})

	t.Run("GPU exit during a stalled copy", func(t *testing.T) {
		h, f := newGPUHarness(t, Options{})
		handle, _ := f.alloc(childRegionSize, 9)
		block := make(chan struct{})
		copying := make(chan struct{}, 1)
		f.mu.Lock()
		f.block, f.copying = block, copying
		f.mu.Unlock()
		ch := startChild(t, h.srv.Endpoint(), "gpu-put", childHandleEnv+"="+hex.EncodeToString(handle))
		waitCopying(t, copying)
		_ = ch.stdin.Close()
		if err := ch.cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
		if !waitFor(time.Second, func() bool { return h.srv.Stats().Regions == 0 }) {
			t.Fatalf("child gone: %d regions left", h.srv.Stats().Regions)
		}
		h.srv.regs.wait()
		if _, open, closes := f.counts(); open != 1 || closes != 0 {
			t.Fatalf("handle closed under a running copy: open %d closes %d", open, closes)
		}
		close(block)
		wantReclaimed(t, h, "GPU after the stalled copy ended", func() int { _, open, _ := f.counts(); return open })
	})

	// The HIP backend over the fake GPU runtime (a C library loaded as
	// libamdhip64): the runtime's handle is closed.
	t.Run("HIP SIGKILL", func(t *testing.T) {
		rt := fakeRuntime(t)
		b := NewHIPBackendFor(rt, nil)
		t.Cleanup(func() {
			if err := b.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		h := newHarness(t, Options{Capacity: 4 << 20, GPU: foreign{b}})
		alloc, err := rt.Malloc(0, childRegionSize)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Free(0, alloc)
		handle, err := rt.IpcGetMemHandle(0, alloc)
		if err != nil {
			t.Fatal(err)
		}
		ch := startChild(t, h.srv.Endpoint(), "gpu", childHandleEnv+"="+hex.EncodeToString(handle[:]))
		if n := b.OpenHandles(); n != 1 {
			t.Fatalf("registered: %d runtime handles open, want 1", n)
		}
		if err := ch.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = ch.cmd.Wait()
		wantReclaimed(t, h, "HIP after SIGKILL", b.OpenHandles)
	})
}

// warnings records the messages of warnings and errors logged.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}

// TestDeregisterStopsWatching: a process that deregisters all it registered
// is watched no more (its pidfd closed, its watcher ended) without a
// warning; registering again watches it again.
func TestDeregisterStopsWatching(t *testing.T) {
	var w warnings
	h := newHarness(t, Options{Capacity: 1 << 20, Logger: slog.New(&w)})
	mems := []*memfd{newMemfd(t, 8192), newMemfd(t, 8192)}
	if _, err := h.c.Ping(ctxT(t), &umbppb.Empty{}); err != nil { // the gRPC connection's descriptors, before counting
		t.Fatal(err)
	}
	before := openFDs(t)
	for round := range 2 {
		h.register(t, "c", mems[0])
		h.register(t, "c2", mems[1])
		if st := h.srv.Stats(); st.ClientProcesses != 1 || h.srv.regs.watching.Load() != 1 {
			t.Fatalf("round %d: %d client processes, %d watchers; want 1 1 (one per process)", round, st.ClientProcesses, h.srv.regs.watching.Load())
		}
		for _, c := range []string{"c", "c2"} {
			if _, err := h.c.DeregisterMemory(ctxT(t), &umbppb.DeregisterMemoryRequest{ClientId: c}); err != nil {
				t.Fatal(err)
			}
		}
		if !waitFor(5*time.Second, func() bool { return h.srv.regs.watching.Load() == 0 }) {
			t.Fatalf("round %d: the watcher outlived the last region", round)
		}
		if st := h.srv.Stats(); st.ClientProcesses != 0 || st.ReclaimedProcesses != 0 {
			t.Fatalf("round %d: %d client processes, %d reclaimed; want 0 0", round, st.ClientProcesses, st.ReclaimedProcesses)
		}
	}
	// No pidfd is left (nor a handoff's socket, which the server closes
	// just after its reply).
	if !waitFor(5*time.Second, func() bool { return openFDs(t) <= before }) {
		t.Fatalf("%d descriptors open, %d before", openFDs(t), before)
	}
	if msgs := w.all(); len(msgs) != 0 {
		t.Fatalf("warnings logged: %q", msgs)
	}
}

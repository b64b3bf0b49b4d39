package umbp_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// Tests here run the client in a child process (this test binary again) and
// the server in this one, so that the server process outlives a transport
// it cut: the client must then keep the buffers of a transfer that failed
// on that transport, for as long as the server process lives.

const childEnv = "UMBP_CHILD_ENDPOINT"

func childEndpoint(t *testing.T) string {
	ep := os.Getenv(childEnv)
	if ep == "" {
		t.Skip("runs as the client process of a cross-process test")
	}
	return ep
}

// TestTransportCutServerAlive: the server cuts the transport under a stalled
// store and lives on. The store keeps its buffers (RUNNING) while that
// process lives; the handle reattaches and new transfers run on the new
// connection; Close abandons the pinned buffers.
func TestTransportCutServerAlive(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent side")
	}
	if testing.Short() {
		t.Skip("runs a child process")
	}
	srv := newServer(t, umbptest.Options{})
	srv.Stall("BatchPut") // the child's first store (one host range: a plain segment) is held
	out := startChild(t, "TestTransportCutServerAliveChild", srv.Endpoint())
	waitCalls(t, srv, "BatchPut", 1)
	if err := srv.Restart(); err != nil { // cuts the transport; this process, the server, lives on
		t.Fatal(err)
	}
	srv.Resume()
	got := out()
	for _, want := range []string{"CHILD: stuck RUNNING in use", "CHILD: next COMPLETED", "CHILD: close abandoned", "CHILD: done"} {
		if !strings.Contains(got, want) {
			t.Fatalf("child output lacks %q:\n%s", want, got)
		}
	}
}

func TestTransportCutServerAliveChild(t *testing.T) {
	ep := childEndpoint(t)
	cfg := testConfig(t, ep)
	cfg.Timeout = 500 * time.Millisecond
	rt := newRuntime(t, cfg)
	buf, err := umbp.NewHostBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	e := newBareEngine(t, rt, buf)
	stuck := e.Store([]umbp.BlockTransferPlan{plan("stuck", buf, 0)})
	waitReconnects(t, e, 1)
	// Its transport was cut, but its server lives on: past its deadline
	// the store still holds its buffers.
	err = e.Wait(t.Context(), stuck)
	inUse := ""
	if errors.Is(err, umbp.ErrBuffersInUse) {
		inUse = " in use"
	}
	fmt.Printf("CHILD: stuck %s%s\n", stuck.Status(), inUse)
	next := e.Store([]umbp.BlockTransferPlan{plan("next", buf, 1)})
	<-next.Done()
	fmt.Printf("CHILD: next %s %s\n", next.Status(), next.Err())
	if err := e.Close(); errors.Is(err, umbp.ErrBuffersAbandoned) {
		fmt.Printf("CHILD: close abandoned\n")
	} else {
		fmt.Printf("CHILD: Close = %v, want ErrBuffersAbandoned\n", err)
	}
	// The stuck store waits for the server process, this test's parent, on
	// a goroutine: leave before the leak check would count it.
	fmt.Printf("CHILD: done\n")
	os.Exit(0)
}

// TestStagingBufferNotReused: on a server without ranged I/O, a staged store
// whose transport was cut while the server lives never gives its staging
// buffer to another transfer.
func TestStagingBufferNotReused(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent side")
	}
	if testing.Short() {
		t.Skip("runs a child process")
	}
	srv := newServer(t, umbptest.Options{Version: 1})
	srv.Stall("BatchExists") // the child looks up once its warm-up store ended
	out := startChild(t, "TestStagingBufferNotReusedChild", srv.Endpoint())
	waitCalls(t, srv, "BatchExists", 1) // the warm-up store has its staging buffer
	srv.Stall("BatchPut")               // the next store is held
	puts := srv.Calls("BatchPut")
	srv.Resume("BatchExists")
	waitCalls(t, srv, "BatchPut", puts+1)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	srv.Resume()
	got := out()
	if !strings.Contains(got, "CHILD: second COMPLETED") || !strings.Contains(got, "first RUNNING") {
		t.Fatalf("child output:\n%s", got)
	}
	// kv and the first staging buffer, each twice (before and after the
	// restart), and a new staging buffer for the second store.
	if n := srv.Calls(umbptest.FDHandoff); n < 5 {
		t.Fatalf("%d fd handoffs: the second store reused the first one's staging buffer", n)
	}
}

func TestStagingBufferNotReusedChild(t *testing.T) {
	ep := childEndpoint(t)
	cfg := testConfig(t, ep)
	cfg.Timeout = 5 * time.Second
	cfg.LookupTimeout = time.Minute // held until the parent has stalled stores
	rt := newRuntime(t, cfg)
	sched, err := rt.NewSchedulerHandle(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, rt, 2, 8, 4096) // two ranges per block: staged
	warm := e.w.Store(e.plans(t, "warm", 0))
	<-warm.Done()
	sched.Lookup(t.Context(), []string{"a", "b"}) // tells the parent
	first := e.w.Store(e.plans(t, "first", 1))
	waitReconnects(t, e.w, 1)
	second := e.w.Store(e.plans(t, "second", 2))
	<-second.Done()
	fmt.Printf("CHILD: second %s %s; first %s\n", second.Status(), second.Err(), first.Status())
	// Exit at once, without the engine's cleanup: the first store still
	// holds its buffers, and closing would wait out its deadline.
	os.Exit(0)
}

// startChild runs the named test as the client and returns a function that
// waits (bounded) for its output.
func startChild(t *testing.T, name, endpoint string) func() string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^"+name+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+endpoint)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return func() string {
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("client process did not finish")
		}
		return out.String()
	}
}

// newBareEngine is a worker with buf registered and no layout.
func newBareEngine(t *testing.T, rt *umbp.StandaloneRuntime, buf *umbp.HostBuffer) *umbp.WorkerHandle {
	t.Helper()
	w, err := rt.NewWorkerHandle(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterBuffers(t.Context(), map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	return w
}

// plan is a one-range plan of 4 KiB at block i of buf.
func plan(key string, buf *umbp.HostBuffer, i int) umbp.BlockTransferPlan {
	return umbp.BlockTransferPlan{Key: key, BlockID: i, Ranges: []umbp.KVRange{{BaseAddress: buf.Buffer().Ptr + uintptr(i*4096), Length: 4096}}}
}

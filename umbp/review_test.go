package umbp_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// TestJobOwnsItsPlans: an engine may reuse its plan slice as soon as Load
// returns; the job still reports its own keys and blocks.
func TestJobOwnsItsPlans(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	a := newEngine(t, rt, 2, 8, 256)
	stored := a.plans(t, "own", 0)
	waitJob(t, a.w, a.w.Store(stored))
	plans := append(a.plans(t, "own", 0), a.plans(t, "missing", 7)...)
	job := a.w.Load(plans)
	plans[1] = a.plans(t, "other", 3)[0] // reused at once
	waitJob(t, a.w, job)
	if fmt.Sprint(job.FailedKeys()) != "[missing-7]" || fmt.Sprint(job.FailedBlockIDs()) != "[7]" {
		t.Fatalf("job reports failed keys %v blocks %v", job.FailedKeys(), job.FailedBlockIDs())
	}
}

// TestFailedReattachLeavesNothing: re-registration that fails after a
// restart is retried without leaving registrations behind on the server.
func TestFailedReattachLeavesNothing(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 1, 4, 4096)
	staging, err := umbp.NewHostBuffer(1 << 16) // a second region
	if err != nil {
		t.Fatal(err)
	}
	if err := e.w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{"extra": staging.Buffer()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e.w.Close() == nil {
			staging.Close()
		}
	})
	srv.Restart()
	srv.FailNext("RegisterMemory", 3) // the second region fails, three times
	waitReconnects(t, e.w, 1)
	if st := srv.Stats(); st.Clients != 1 || st.Regions != 2 {
		t.Fatalf("server holds %d clients, %d regions; want 1, 2", st.Clients, st.Regions)
	}
}

// TestEngineBeforeServer: an engine that starts before the server attaches
// once, when the server comes, and does not reconnect right after.
func TestEngineBeforeServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	ep := filepath.Join(shortDir(t), "late.grpc.sock")
	cfg := testConfig(t, ep)
	cfg.StartupTimeout = 20 * time.Second
	rt := newRuntime(t, cfg)
	started := make(chan struct{})
	go func() {
		defer close(started)
		time.Sleep(300 * time.Millisecond)
	}()
	type result struct {
		w   *umbp.WorkerHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		w, err := rt.NewWorkerHandle(context.Background(), "late", umbp.RankTopology{}, nil)
		done <- result{w, err}
	}()
	<-started
	startServerProcess(t, ep, "-prefault=false")
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.w.Close()
	time.Sleep(500 * time.Millisecond) // several supervision ticks
	if s := r.w.Stats(); s.Reconnects != 0 || s.State != umbp.StateConnected {
		t.Fatalf("after a late start: %+v", s)
	}
}

package umbp_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// waitState waits until every handle reports want.
func waitState(t *testing.T, want umbp.HandleState, hs ...interface{ State() umbp.HandleState }) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, h := range hs {
		for h.State() != want {
			if time.Now().After(deadline) {
				t.Fatalf("handle state %s, want %s", h.State(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// waitReconnects waits until the handle has attached n times again and is
// connected.
func waitReconnects(t *testing.T, h interface{ Stats() umbp.Stats }, n uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := h.Stats()
		if s.Reconnects >= n && s.State == umbp.StateConnected {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s: %d reconnects, state %s; want %d, connected", s.Reconnects, s.State, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// storeLoad stores blocks 0..n-1 of a under prefix and loads them into b's
// blocks, checking every byte.
func storeLoad(t *testing.T, a, b *engine, prefix string, seed byte, n int) {
	t.Helper()
	src := a.plans(t, prefix, ids(n)...)
	a.fill(src, seed)
	job := a.w.Store(src)
	waitJob(t, a.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("store %s: %s %q", prefix, job.Status(), job.Err())
	}
	dst := b.plans(t, prefix, ids(n)...)
	lj := b.w.Load(dst)
	waitJob(t, b.w, lj)
	if lj.Status() != umbp.JobCompleted {
		t.Fatalf("load %s: %s %q", prefix, lj.Status(), lj.Err())
	}
	b.check(t, dst, seed, ids(n))
}

// TestRestartReattaches: a restarted server is found again by every handle,
// which re-registers its memory and resumes with no call from the engine;
// the new server's pool is empty, so earlier blocks are misses, never stale.
func TestRestartReattaches(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	a := newEngine(t, rt, 4, 8, 512)
	b := newEngine(t, rt, 4, 8, 512)
	h := newScheduler(t, rt)
	ctx := context.Background()
	storeLoad(t, a, b, "before", 1, 4)
	keys := a.plans(t, "before", ids(4)...)
	if got := h.Lookup(ctx, []string{keys[0].Key}); !got[0] {
		t.Fatal("lookup missed before the restart")
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []interface{ Stats() umbp.Stats }{a.w, b.w, h} {
		waitReconnects(t, s, 1)
	}
	// The new pool is empty: loads miss, lookups miss.
	lj := b.w.Load(b.plans(t, "before", 0))
	waitJob(t, b.w, lj)
	if lj.Status() != umbp.JobFailed || !errors.Is(lj.Err(), umbp.ErrNotInPool) || errors.Is(lj.Err(), umbp.ErrNotAttempted) {
		t.Fatalf("load after restart: %s %v, want a miss", lj.Status(), lj.Err())
	}
	if got := h.Lookup(ctx, []string{keys[0].Key}); got[0] {
		t.Fatal("lookup hit a key the restarted server never stored")
	}
	// Memory was registered again: transfers work byte-exactly.
	storeLoad(t, a, b, "after", 2, 8)
	if got := h.Lookup(ctx, []string{a.plans(t, "after", 7)[0].Key}); !got[0] {
		t.Fatal("lookup missed after the restart")
	}
}

// TestReconnectingRefusesAtOnce: while the server is away, lookups answer
// misses and transfers fail as not attempted, without waiting.
func TestReconnectingRefusesAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	ep := filepath.Join(shortDir(t), "r.grpc.sock")
	p := startServerProcess(t, ep, "-prefault=false")
	cfg := testConfig(t, ep)
	rt := newRuntime(t, cfg)
	a := newEngine(t, rt, 2, 8, 256)
	b := newEngine(t, rt, 2, 8, 256)
	h := newScheduler(t, rt)
	ctx := context.Background()
	storeLoad(t, a, b, "p1", 3, 8)

	p.kill()
	waitState(t, umbp.StateReconnecting, a.w, h)
	start := time.Now()
	got := h.Lookup(ctx, []string{a.plans(t, "p1", 0)[0].Key})
	job := a.w.Store(a.plans(t, "p2", 0))
	if el := time.Since(start); el > margin {
		t.Fatalf("calls while reconnecting took %v", el)
	}
	if got[0] || job.Status() != umbp.JobFailed || !errors.Is(job.Err(), umbp.ErrNotAttempted) || !errors.Is(job.Err(), umbp.ErrUnavailable) {
		t.Fatalf("while reconnecting: lookup %v, store %s %v", got, job.Status(), job.Err())
	}

	startServerProcess(t, ep, "-prefault=false")
	for _, s := range []interface{ Stats() umbp.Stats }{a.w, b.w, h} {
		waitReconnects(t, s, 1)
	}
	storeLoad(t, a, b, "p3", 4, 8)
	if s := a.w.Stats(); s.Reconnects != 1 || s.Transfers.Refused == 0 || s.Transfers.Completed < 2 {
		t.Fatalf("stats after restart: %+v", s)
	}
}

// TestFastRestartsAreNoticed: a server restarted at the same path may get
// the same inode; the handle still notices, through its transport, while
// transfers keep running, and re-registers its memory every time.
func TestFastRestartsAreNoticed(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	a := newEngine(t, rt, 2, 8, 256)
	b := newEngine(t, rt, 2, 8, 256)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // loads in flight across every restart
		defer close(done)
		plans := b.plans(t, "busy", 0, 1)
		for {
			select {
			case <-stop:
				return
			default:
			}
			<-b.w.Load(plans).Done()
		}
	}()
	const restarts = 8
	for i := 1; i <= restarts; i++ {
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		waitReconnects(t, a.w, uint64(i))
		waitReconnects(t, b.w, uint64(i))
	}
	close(stop)
	<-done
	storeLoad(t, a, b, "fast", 9, 8)
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
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
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
		w, err := rt.NewWorkerHandle(context.Background(), nil)
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

// TestTransportLostServerLives: a transport that fails under a server that
// lives on is noticed like a restart. The handles attach anew (a
// connection never redials), the pool's blocks are still there, and the
// old connection's registrations are dropped through the new one, so the
// server is left with one client per worker, not two.
func TestTransportLostServerLives(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	a := newEngine(t, rt, 4, 8, 512)
	h := newScheduler(t, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // does not hang
	defer cancel()
	storeLoad(t, a, a, "before", 1, 4)
	if st := srv.Stats(); st.Clients != 1 {
		t.Fatalf("server clients before: %d, want 1", st.Clients)
	}

	srv.DropConnections()
	waitReconnects(t, a.w, 1)
	waitReconnects(t, h, 1)
	// The old client's registrations go once it has nothing in flight.
	if err := srv.WaitCalls(ctx, "DeregisterMemory", 1); err != nil {
		t.Fatalf("the old connection was never deregistered: %v", err)
	}
	// The call has arrived; its handler drops the client as it returns.
	waitFor(t, "one client left on the server (the old connection's registrations gone)", func() bool { return srv.Stats().Clients == 1 })
	// The pool lived on: the blocks stored before are still there.
	if got := h.Lookup(ctx, []string{a.plans(t, "before", 0)[0].Key}); !got[0] {
		t.Fatal("lookup missed a block the living server holds")
	}
	storeLoad(t, a, a, "after", 2, 8)
}

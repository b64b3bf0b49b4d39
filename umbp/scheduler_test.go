package umbp_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// margin is a generous bound on scheduling noise for "does not hang" checks.
const margin = 2 * time.Second

func storeKeys(t *testing.T, rt *umbp.StandaloneRuntime, n int) []string {
	t.Helper()
	e := newEngine(t, rt, 2, n, 256)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	plans := e.plans(t, "blk", ids...)
	e.fill(plans, 1)
	job := e.w.Store(plans)
	waitJob(t, e.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("store: %s %s", job.Status(), job.Err())
	}
	keys := make([]string, n)
	for i, p := range plans {
		keys[i] = p.Key
	}
	return keys
}

func newScheduler(t *testing.T, rt *umbp.StandaloneRuntime) *umbp.SchedulerHandle {
	t.Helper()
	h, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func allEqual(got []bool, want bool) bool {
	for _, g := range got {
		if g != want {
			return false
		}
	}
	return true
}

func TestLookup(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	keys := storeKeys(t, rt, 8)
	h := newScheduler(t, rt)
	ctx := context.Background()

	got := h.Lookup(ctx, append(keys[:4:4], "missing", keys[5]))
	want := []bool{true, true, true, true, false, true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Lookup = %v, want %v", got, want)
	}
	if n := h.LookupPrefix(ctx, append(keys[:3:3], "missing", keys[4])); n != 3 {
		t.Fatalf("LookupPrefix = %d, want 3", n)
	}
	// Keys the server cannot be asked about are misses; their siblings hit.
	got = h.Lookup(ctx, []string{keys[0], "", "bad\xff", keys[1]})
	if fmt.Sprint(got) != "[true false false true]" {
		t.Fatalf("Lookup with bad keys = %v", got)
	}
	if n := h.LookupPrefix(ctx, []string{keys[0], keys[1], "", keys[2]}); n != 2 {
		t.Fatalf("LookupPrefix with a bad key = %d, want 2", n)
	}
	// A key that is not UTF-8 alone: the request that held it could not
	// be encoded, so it never reached the server; the one without it did.
	calls := srv.Calls("BatchExists")
	if got := h.Lookup(ctx, []string{keys[0], "bad\xff", keys[1]}); fmt.Sprint(got) != "[true false true]" {
		t.Fatalf("Lookup with a key that is not UTF-8 = %v", got)
	}
	if n := srv.Calls("BatchExists") - calls; n != 1 {
		t.Fatalf("Lookup with a key that is not UTF-8 reached the server %d times, want once", n)
	}
	calls = srv.Calls("BatchExistsConsecutive")
	if n := h.LookupPrefix(ctx, []string{keys[0], keys[1], "bad\xff", keys[2]}); n != 2 {
		t.Fatalf("LookupPrefix with a key that is not UTF-8 = %d, want 2", n)
	}
	if n := srv.Calls("BatchExistsConsecutive") - calls; n != 1 {
		t.Fatalf("LookupPrefix with a key that is not UTF-8 reached the server %d times, want once", n)
	}
	if n := h.LookupPrefix(ctx, []string{"bad\xff", keys[0]}); n != 0 {
		t.Fatalf("LookupPrefix starting with a key that is not UTF-8 = %d, want 0", n)
	}
	before := srv.Calls("BatchExists")
	if got := h.Lookup(ctx, nil); len(got) != 0 {
		t.Fatalf("Lookup(nil) = %v", got)
	}
	if h.LookupPrefix(ctx, nil) != 0 || srv.Calls("BatchExists") != before {
		t.Fatal("empty lookups reached the server")
	}
	if err := h.Clear(ctx); err != nil {
		t.Fatalf("Clear: %v", err)
	}
	if got := h.Lookup(ctx, keys); !allEqual(got, false) {
		t.Fatalf("after Clear: %v", got)
	}
}

// A key too large for any request is a miss alone, its siblings asked
// about; in LookupPrefix it lies past a key that is not UTF-8, which ends
// the prefix first: the keys before it are asked about, once.
func TestLookupKeyOverTheLimit(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	keys := storeKeys(t, rt, 2)
	h := newScheduler(t, rt)
	ctx := context.Background()
	huge := strings.Repeat("k", 65<<20)

	before := h.Stats().Lookups
	if got := h.Lookup(ctx, []string{keys[0], huge}); fmt.Sprint(got) != "[true false]" {
		t.Fatalf("Lookup with a key over the limit = %v", got)
	}
	after := h.Stats().Lookups
	if after.Calls-before.Calls != 1 || after.Failures-before.Failures != 0 {
		t.Fatalf("Lookup with a key over the limit counted %d calls and %d failures, want 1 and 0",
			after.Calls-before.Calls, after.Failures-before.Failures)
	}
	calls := srv.Calls("BatchExistsConsecutive")
	if n := h.LookupPrefix(ctx, []string{keys[0], keys[1], "bad\xff", huge}); n != 2 {
		t.Fatalf("LookupPrefix with a key over the limit past one not UTF-8 = %d, want 2", n)
	}
	if n := srv.Calls("BatchExistsConsecutive") - calls; n != 1 {
		t.Fatalf("it reached the server %d times, want once", n)
	}
}

func TestLookupFailuresAreMisses(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	keys := storeKeys(t, rt, 4)
	h := newScheduler(t, rt)
	ctx := context.Background()
	srv.FailNext("BatchExists", 1)
	if got := h.Lookup(ctx, keys); len(got) != 4 || !allEqual(got, false) {
		t.Fatalf("failed lookup = %v, want 4 misses", got)
	}
	if got := h.Lookup(ctx, keys); !allEqual(got, true) {
		t.Fatalf("lookup after a failure = %v, want hits", got)
	}
	srv.FailNext("Clear", 1)
	if err := h.Clear(ctx); !errors.Is(err, umbp.ErrUnavailable) {
		t.Fatalf("Clear that failed in transport = %v, want ErrUnavailable", err)
	}
	// A caller's context that ends answers misses at once.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got := h.Lookup(cctx, keys); !allEqual(got, false) {
		t.Fatalf("lookup with a done context = %v", got)
	}
}

// TestLookupStalledServer is the scheduler's promise: a stalled server is a
// miss within LookupTimeout, and later lookups do not queue behind it.
func TestLookupStalledServer(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	rt := newRuntime(t, cfg)
	keys := storeKeys(t, rt, 4)
	h := newScheduler(t, rt)
	ctx := context.Background()
	if got := h.Lookup(ctx, keys); !allEqual(got, true) {
		t.Fatalf("before stall: %v", got)
	}

	calls := srv.Calls("BatchExists") + 1 // the stalled one
	srv.Stall()
	start := time.Now()
	got := h.Lookup(ctx, keys)
	if el := time.Since(start); el > cfg.LookupTimeout+margin {
		t.Fatalf("stalled lookup took %v, bound %v", el, cfg.LookupTimeout)
	}
	if !allEqual(got, false) {
		t.Fatalf("stalled lookup = %v, want misses", got)
	}
	if !grpcLookups {
		// The lock-step call that overran was ended; it left a probe (a
		// lookup of no key) in flight, which the server sees.
		calls++
		waitFor(t, "the probe", func() bool { return srv.Calls("BatchExists") >= calls })
	}
	start = time.Now()
	for range 5 {
		if got := h.Lookup(ctx, keys); !allEqual(got, false) {
			t.Fatalf("lookup behind a stalled call = %v", got)
		}
		if h.LookupPrefix(ctx, keys) != 0 {
			t.Fatal("prefix lookup behind a stalled call hit")
		}
	}
	if el := time.Since(start); el > margin {
		t.Fatalf("lookups behind a stalled call took %v, want at once", el)
	}
	if c := srv.Calls("BatchExists"); c != calls {
		t.Fatalf("server saw %d new calls while one was unanswered", c-calls)
	}

	srv.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for !allEqual(h.Lookup(ctx, keys), true) {
		if time.Now().After(deadline) {
			t.Fatal("lookups did not hit again after Resume")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSchedulerCloseWithStuckCall(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 500 * time.Millisecond
	rt := newRuntime(t, cfg)
	h, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv.Stall()
	defer srv.Resume()
	h.Lookup(context.Background(), []string{"k"})
	start := time.Now()
	err = h.Close()
	if el := time.Since(start); el > cfg.Timeout+margin {
		t.Fatalf("Close took %v", el)
	}
	switch {
	case grpcLookups && (err == nil || !strings.Contains(err.Error(), "left open")):
		// gRPC's Close would wait for the call stuck in the server.
		t.Fatalf("Close with a stuck call = %v, want it to say the connection was left open", err)
	case !grpcLookups && err != nil:
		// What is in flight is the lock-step probe, which closing the
		// connection ends.
		t.Fatalf("Close with a lookup unanswered = %v", err)
	}
	if got := h.Lookup(context.Background(), []string{"k"}); !allEqual(got, false) || h.Clear(context.Background()) == nil {
		t.Fatal("calls after Close did not answer misses")
	}
}

func TestNewSchedulerHandleUnreachable(t *testing.T) {
	ep := filepath.Join(shortDir(t), "none.grpc.sock")
	cfg := testConfig(t, ep)
	cfg.StartupTimeout = 300 * time.Millisecond
	rt := newRuntime(t, cfg)
	start := time.Now()
	_, err := rt.NewSchedulerHandle(context.Background())
	if err == nil || !strings.Contains(err.Error(), "umbp: attach at unix://"+ep+": server unavailable: no socket file there: check Endpoint for a typo, or start umbp_standalone_server on this host first") {
		t.Fatalf("err = %v", err)
	}
	if el := time.Since(start); el > cfg.StartupTimeout+margin {
		t.Fatalf("attach took %v past StartupTimeout %v", el, cfg.StartupTimeout)
	}
	if _, err := rt.NewSchedulerHandle(context.Background()); err == nil {
		t.Fatal("bad topology accepted")
	}
}

// TestLookupServerProcessStoppedAndKilled drives a real server process:
// SIGSTOP makes lookups miss within their bound, SIGCONT brings hits back,
// SIGKILL makes them miss without errors or hangs.
func TestLookupServerProcessStoppedAndKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	ep := filepath.Join(shortDir(t), "n.grpc.sock")
	p := startServerProcess(t, ep)
	cfg := testConfig(t, ep)
	rt := newRuntime(t, cfg)
	keys := storeKeys(t, rt, 4)
	h := newScheduler(t, rt)
	ctx := context.Background()
	if got := h.Lookup(ctx, keys); !allEqual(got, true) {
		t.Fatalf("lookup = %v", got)
	}

	p.signal(syscall.SIGSTOP)
	start := time.Now()
	got := h.Lookup(ctx, keys)
	if el := time.Since(start); el > cfg.LookupTimeout+margin || !allEqual(got, false) {
		t.Fatalf("lookup on a stopped server: %v after %v", got, el)
	}
	start = time.Now()
	if got := h.Lookup(ctx, keys); !allEqual(got, false) || time.Since(start) > margin {
		t.Fatalf("second lookup on a stopped server: %v after %v", got, time.Since(start))
	}
	p.signal(syscall.SIGCONT)
	deadline := time.Now().Add(10 * time.Second)
	for !allEqual(h.Lookup(ctx, keys), true) {
		if time.Now().After(deadline) {
			t.Fatal("no hits after SIGCONT")
		}
		time.Sleep(20 * time.Millisecond)
	}

	p.kill()
	for range 3 {
		start := time.Now()
		if got := h.Lookup(ctx, keys); !allEqual(got, false) {
			t.Fatalf("lookup on a killed server = %v", got)
		}
		if el := time.Since(start); el > cfg.LookupTimeout+margin {
			t.Fatalf("lookup on a killed server took %v", el)
		}
	}
}

// TestSchedulerTakeoverWhileStuck: a lookup stuck on a wedged server when a
// new server takes over its socket does not hold up the handle: once the
// handle has attached to the new server, lookups are answered again.
func TestSchedulerTakeoverWhileStuck(t *testing.T) {
	ep := filepath.Join(shortDir(t), "x.grpc.sock")
	hang := make(chan struct{})
	stuck := make(chan struct{}, 1)
	var wedged atomic.Bool
	a, err := server.New(server.Options{Endpoint: ep, Logger: testLogger(t),
		UnaryInterceptor: func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if wedged.Load() {
				select {
				case stuck <- struct{}{}:
				default:
				}
				<-hang // never answers
			}
			return h(ctx, req)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	t.Cleanup(func() { close(hang) })
	cfg := testConfig(t, ep)
	cfg.LookupTimeout = time.Second
	rt := newRuntime(t, cfg)
	h, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })

	wedged.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Lookup(context.Background(), []string{"k"}) // stuck on a: a miss after 1 s
	}()
	<-stuck // the lookup is in a's hands
	b, err := server.New(server.Options{Endpoint: ep, Logger: testLogger(t), Replace: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	<-done
	deadline := time.Now().Add(10 * time.Second)
	for h.Stats().Reconnects == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the handle never attached to the new server")
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := h.Stats()
	for range 5 {
		h.Lookup(context.Background(), []string{"k"})
	}
	if after := h.Stats(); after.Lookups.Failures != before.Lookups.Failures || after.Lookups.Timeouts != before.Lookups.Timeouts || after.Lookups.Unasked != before.Lookups.Unasked {
		t.Fatalf("lookups after the takeover still fail: failures %d->%d, timeouts %d->%d",
			before.Lookups.Failures, after.Lookups.Failures, before.Lookups.Timeouts, after.Lookups.Timeouts)
	}
}

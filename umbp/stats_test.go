package umbp_test

import (
	"context"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// TestStatsGroups: each handle counts in its own group of Stats, each
// counter of the group where it belongs (every one has a value of its own
// here), and leaves the other group zero.
func TestStatsGroups(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	const blockBytes = 4096
	e := newEngine(t, rt, 1, 8, blockBytes)
	ctx := context.Background()

	waitJob(t, e.w, e.w.Store(e.plans(t, "s", 0, 1, 2))) // 3 blocks stored
	load := e.w.LoadBlocks([]umbp.Block{{Key: "s-0", BlockID: 4}, {Key: "s-1", BlockID: 5}})
	waitJob(t, e.w, load)                              // 2 blocks loaded
	waitJob(t, e.w, e.w.Load(e.plans(t, "absent", 6))) // a miss: failed
	outside := []umbp.BlockTransferPlan{{Key: "x", Ranges: []umbp.KVRange{{BaseAddress: 0x1000, Length: 64}}}}
	refused := e.w.Store(outside) // fails in planning, never submitted
	waitJob(t, e.w, refused)
	if refused.Status() != umbp.JobFailed || load.Status() != umbp.JobCompleted {
		t.Fatalf("jobs: refused %s, load %s", refused.Status(), load.Status())
	}
	want := umbp.TransferStats{Submitted: 3, Completed: 2, Failed: 1, Refused: 1, BytesStored: 3 * blockBytes, BytesLoaded: 2 * blockBytes}
	// A job is counted before its Done closes: Stats is exact once Wait
	// has returned.
	got := e.w.Stats()
	if got.Transfers != want {
		t.Fatalf("worker Transfers = %+v, want %+v", got.Transfers, want)
	}
	if got.Lookups != (umbp.LookupStats{}) || got.State != umbp.StateConnected || got.Reconnects != 0 {
		t.Errorf("worker Stats = %+v; want no lookups, connected, no reconnects", got)
	}

	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Close()
	if hits := sched.Lookup(ctx, []string{"s-0", "s-1", "s-2", "absent-6"}); !hits[0] || !hits[1] || !hits[2] || hits[3] {
		t.Fatalf("Lookup = %v", hits)
	}
	if n := sched.LookupPrefix(ctx, []string{"s-0", "absent-6", "s-1"}); n != 1 {
		t.Fatalf("LookupPrefix = %d, want 1", n)
	}
	// LookupPrefix counts the keys after the first absent one as misses.
	s := sched.Stats()
	if wantL := (umbp.LookupStats{Calls: 2, Hits: 4, Misses: 3}); s.Lookups != wantL {
		t.Errorf("scheduler Lookups = %+v, want %+v", s.Lookups, wantL)
	}
	if s.Transfers != (umbp.TransferStats{}) {
		t.Errorf("scheduler Transfers = %+v, want zero", s.Transfers)
	}
}

// A lookup answered without asking (held off behind a call the stalled
// server has not answered) counts as Unasked, not as a failure.
func TestLookupsUnaskedAreNotFailures(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	h, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.Lookup(context.Background(), []string{"k"}) // dials its connections
	srv.Stall()
	defer srv.Resume()
	h.Lookup(context.Background(), []string{"k"}) // times out: its probe stays unanswered
	h.Lookup(context.Background(), []string{"k"}) // held off: not asked
	st := h.Stats().Lookups
	if st.Timeouts != 1 || st.Unasked != 1 || st.Failures != 0 || st.Calls != 3 {
		t.Fatalf("lookups %+v; want 3 calls: 1 timeout, 1 unasked, no failure", st)
	}
}

// The keys a call's caller left unanswered are neither hits nor misses:
// they say nothing of the pool. A stalled server's unanswered keys are
// misses, as an engine sees them.
func TestLookupsCancelledKeysAreNotMisses(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.LookupTimeout = time.Second // the live calls are answered on a busy host too
	h := newScheduler(t, newRuntime(t, cfg))
	keys := []string{"a", "b", "c"}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	h.Lookup(cancelled, keys)
	h.LookupPrefix(cancelled, keys)
	h.LookupAnswers(cancelled, keys)
	if st := h.Stats().Lookups; st != (umbp.LookupStats{Calls: 3, Cancelled: 3}) {
		t.Fatalf("after 3 cancelled calls: %+v; want 3 calls, 3 cancelled, no hits or misses", st)
	}
	h.Lookup(context.Background(), keys)
	h.LookupPrefix(context.Background(), keys)
	if st := h.Stats().Lookups; st != (umbp.LookupStats{Calls: 5, Cancelled: 3, Misses: 6}) {
		t.Fatalf("after 2 answered calls: %+v; want 6 misses", st)
	}
	srv.Stall()
	defer srv.Resume()
	h.Lookup(context.Background(), keys) // no reply within LookupTimeout
	h.Lookup(context.Background(), keys) // held off
	if st := h.Stats().Lookups; st != (umbp.LookupStats{Calls: 7, Cancelled: 3, Timeouts: 1, Unasked: 1, Misses: 12}) {
		t.Fatalf("after a stalled and a held-off call: %+v; want their 6 keys counted misses", st)
	}
}

// A Score whose blocks can none be asked about (the first is a key that
// cannot be in the pool) asks nothing: complete, no call counted, and not
// refused while calls are held off.
func TestScoreWithNothingToAskAsksNothing(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	h := newScheduler(t, newRuntime(t, testConfig(t, srv.Endpoint())))
	ctx := context.Background()
	h.Lookup(ctx, []string{"k"}) // dials its connections
	srv.Stall()
	defer srv.Resume()
	h.Lookup(ctx, []string{"k"}) // no reply: later calls are held off
	before := h.Stats().Lookups
	s, err := h.Score(ctx, umbp.ScoreRequest{BlockHashes: []string{"", "b"}})
	if err != nil || !s.Complete || s.PoolPrefix != 0 {
		t.Fatalf("Score = %+v, %v; want complete, prefix 0", s, err)
	}
	if after := h.Stats().Lookups; after != before {
		t.Fatalf("Score counted %+v, before %+v: it asked", after, before)
	}
}

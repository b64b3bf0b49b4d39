package umbpprometheus_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	umbpprometheus "github.com/umbp-go/umbp-go/contrib/prometheus"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handles starts a server and returns a worker that stored one 4 KiB key
// and a scheduler that looked up that key and an absent one.
func handles(t *testing.T) (*umbp.WorkerHandle, *umbp.SchedulerHandle) {
	t.Helper()
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: srv.Endpoint(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	buf, err := umbp.NewHostBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	w, err := rt.NewWorkerHandle(ctx, "prom", umbp.RankTopology{}, nil)
	if err != nil {
		buf.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Error(err)
			return
		}
		buf.Close()
	})
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	plans := []umbp.BlockTransferPlan{{Key: "k", Ranges: []umbp.KVRange{{BaseAddress: buf.Buffer().Ptr, Length: 4096}}}}
	if err := w.Wait(ctx, w.Store(plans)); err != nil {
		t.Fatal(err)
	}
	s, err := rt.NewSchedulerHandle(ctx, "prom", umbp.RankTopology{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if got := s.Lookup(ctx, []string{"k", "absent"}); !got[0] || got[1] {
		t.Fatalf("lookup = %v, want [true false]", got)
	}
	return w, s
}

func TestCollector(t *testing.T) {
	w, s := handles(t)
	c := umbpprometheus.NewCollector()
	c.Add("sched", s)
	c.Add("worker", w)

	const want = `
# HELP umbp_handle_state 1 for the handle's current state (connected, reconnecting or closed), 0 for the others.
# TYPE umbp_handle_state gauge
umbp_handle_state{handle="sched",state="closed"} 0
umbp_handle_state{handle="sched",state="connected"} 1
umbp_handle_state{handle="sched",state="reconnecting"} 0
umbp_handle_state{handle="worker",state="closed"} 0
umbp_handle_state{handle="worker",state="connected"} 1
umbp_handle_state{handle="worker",state="reconnecting"} 0
# HELP umbp_lookup_hits_total Keys answered present.
# TYPE umbp_lookup_hits_total counter
umbp_lookup_hits_total{handle="sched"} 1
# HELP umbp_lookup_misses_total Keys answered absent, including the keys of failed calls.
# TYPE umbp_lookup_misses_total counter
umbp_lookup_misses_total{handle="sched"} 1
# HELP umbp_lookups_total Scheduler calls that asked the server about keys.
# TYPE umbp_lookups_total counter
umbp_lookups_total{handle="sched"} 1
# HELP umbp_server_ranged_io 1 if the server the handle last attached to takes scatter/gather batches (v2, SSD tier off).
# TYPE umbp_server_ranged_io gauge
umbp_server_ranged_io{handle="sched"} 1
umbp_server_ranged_io{handle="worker"} 1
# HELP umbp_stored_bytes_total Object bytes of keys stored.
# TYPE umbp_stored_bytes_total counter
umbp_stored_bytes_total{handle="worker"} 4096
# HELP umbp_transfers_completed_total Transfer jobs that ended COMPLETED.
# TYPE umbp_transfers_completed_total counter
umbp_transfers_completed_total{handle="worker"} 1
# HELP umbp_transfers_submitted_total Transfer jobs handed to the transfer goroutines.
# TYPE umbp_transfers_submitted_total counter
umbp_transfers_submitted_total{handle="worker"} 1
# HELP umbp_transfers_blocked Transfers past their deadline on the current server; new ones are refused meanwhile.
# TYPE umbp_transfers_blocked gauge
umbp_transfers_blocked{handle="worker"} 0
`
	names := []string{
		"umbp_handle_state", "umbp_lookup_hits_total", "umbp_lookup_misses_total", "umbp_lookups_total",
		"umbp_server_ranged_io", "umbp_stored_bytes_total", "umbp_transfers_completed_total",
		"umbp_transfers_submitted_total", "umbp_transfers_blocked",
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// 3 state series + ranged I/O + reconnects per handle, 5 lookup series
	// for the scheduler, 9 transfer series for the worker.
	if n := testutil.CollectAndCount(c); n != 2*5+5+9 {
		t.Errorf("%d series, want %d", n, 2*5+5+9)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	// A registry takes it, and a closed, removed handle goes.
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	const closed = `
# HELP umbp_handle_state 1 for the handle's current state (connected, reconnecting or closed), 0 for the others.
# TYPE umbp_handle_state gauge
umbp_handle_state{handle="sched",state="closed"} 1
umbp_handle_state{handle="sched",state="connected"} 0
umbp_handle_state{handle="sched",state="reconnecting"} 0
umbp_handle_state{handle="worker",state="closed"} 0
umbp_handle_state{handle="worker",state="connected"} 1
umbp_handle_state{handle="worker",state="reconnecting"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(closed), "umbp_handle_state"); err != nil {
		t.Fatal(err)
	}
	c.Remove("sched")
	if n := testutil.CollectAndCount(c, "umbp_lookups_total"); n != 0 {
		t.Errorf("%d lookup series after Remove, want 0", n)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

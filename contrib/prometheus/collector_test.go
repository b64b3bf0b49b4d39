package umbpprometheus_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

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
	w, err := rt.NewWorkerHandle(ctx, nil)
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
	s, err := rt.NewSchedulerHandle(ctx)
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
# HELP umbp_lookup_misses_total Keys answered absent, and the keys of calls that failed, timed out or went unasked (not those of calls their callers left).
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
	// 3 state series + ranged I/O + reconnects per handle, 7 lookup series
	// for the scheduler, 9 transfer series for the worker.
	if n := testutil.CollectAndCount(c); n != 2*5+7+9 {
		t.Errorf("%d series, want %d", n, 2*5+7+9)
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

// fixedStats is a StatsSource of neither handle kind: the collector exports
// both groups of its counters.
type fixedStats umbp.Stats

func (f fixedStats) Stats() umbp.Stats { return umbp.Stats(f) }

// TestCollectorEveryMetric pins every metric's name, help, labels and the
// Stats field it reads: each field has a value of its own.
func TestCollectorEveryMetric(t *testing.T) {
	c := umbpprometheus.NewCollector()
	c.Add("h", fixedStats{
		State:        umbp.StateReconnecting,
		Capabilities: umbp.ServerCapabilities{RangedIO: true},
		Reconnects:   3,
		Lookups:      umbp.LookupStats{Calls: 11, Hits: 12, Misses: 13, Timeouts: 14, Failures: 15, Unasked: 16, Cancelled: 17},
		Transfers: umbp.TransferStats{
			Submitted: 21, Completed: 22, Failed: 23, Refused: 24, Blocked: 25,
			BytesStored: 26, BytesLoaded: 27, AbandonedBuffers: 28, AbandonedBytes: 29,
		},
	})
	const want = `
# HELP umbp_abandoned_buffers Buffers that Close left registered because transfers still held them.
# TYPE umbp_abandoned_buffers gauge
umbp_abandoned_buffers{handle="h"} 28
# HELP umbp_abandoned_bytes Bytes of the registered regions of abandoned buffers.
# TYPE umbp_abandoned_bytes gauge
umbp_abandoned_bytes{handle="h"} 29
# HELP umbp_handle_state 1 for the handle's current state (connected, reconnecting or closed), 0 for the others.
# TYPE umbp_handle_state gauge
umbp_handle_state{handle="h",state="closed"} 0
umbp_handle_state{handle="h",state="connected"} 0
umbp_handle_state{handle="h",state="reconnecting"} 1
# HELP umbp_loaded_bytes_total Object bytes of keys loaded.
# TYPE umbp_loaded_bytes_total counter
umbp_loaded_bytes_total{handle="h"} 27
# HELP umbp_lookup_cancelled_total Scheduler calls whose caller's context ended before they were answered: the caller's doing, not the server's.
# TYPE umbp_lookup_cancelled_total counter
umbp_lookup_cancelled_total{handle="h"} 17
# HELP umbp_lookup_failures_total Scheduler calls that failed or were refused (not timeouts).
# TYPE umbp_lookup_failures_total counter
umbp_lookup_failures_total{handle="h"} 15
# HELP umbp_lookup_hits_total Keys answered present.
# TYPE umbp_lookup_hits_total counter
umbp_lookup_hits_total{handle="h"} 12
# HELP umbp_lookup_misses_total Keys answered absent, and the keys of calls that failed, timed out or went unasked (not those of calls their callers left).
# TYPE umbp_lookup_misses_total counter
umbp_lookup_misses_total{handle="h"} 13
# HELP umbp_lookup_timeouts_total Scheduler calls that got no reply within LookupTimeout.
# TYPE umbp_lookup_timeouts_total counter
umbp_lookup_timeouts_total{handle="h"} 14
# HELP umbp_lookup_unasked_total Scheduler calls answered misses at once without asking a server (held off, reconnecting, closed, or the master's store said out).
# TYPE umbp_lookup_unasked_total counter
umbp_lookup_unasked_total{handle="h"} 16
# HELP umbp_lookups_total Scheduler calls that asked the server about keys.
# TYPE umbp_lookups_total counter
umbp_lookups_total{handle="h"} 11
# HELP umbp_reconnects_total Attachments to a new server after the first.
# TYPE umbp_reconnects_total counter
umbp_reconnects_total{handle="h"} 3
# HELP umbp_server_ranged_io 1 if the server the handle last attached to takes scatter/gather batches (v2, SSD tier off).
# TYPE umbp_server_ranged_io gauge
umbp_server_ranged_io{handle="h"} 1
# HELP umbp_stored_bytes_total Object bytes of keys stored.
# TYPE umbp_stored_bytes_total counter
umbp_stored_bytes_total{handle="h"} 26
# HELP umbp_transfers_blocked Transfers past their deadline on the current server; new ones are refused meanwhile.
# TYPE umbp_transfers_blocked gauge
umbp_transfers_blocked{handle="h"} 25
# HELP umbp_transfers_completed_total Transfer jobs that ended COMPLETED.
# TYPE umbp_transfers_completed_total counter
umbp_transfers_completed_total{handle="h"} 22
# HELP umbp_transfers_failed_total Transfer jobs that ended FAILED or CANCELLED after submission.
# TYPE umbp_transfers_failed_total counter
umbp_transfers_failed_total{handle="h"} 23
# HELP umbp_transfers_refused_total Transfer jobs failed as not attempted before submission.
# TYPE umbp_transfers_refused_total counter
umbp_transfers_refused_total{handle="h"} 24
# HELP umbp_transfers_submitted_total Transfer jobs handed to the transfer goroutines.
# TYPE umbp_transfers_submitted_total counter
umbp_transfers_submitted_total{handle="h"} 21
`
	// No names: every metric the collector exports is compared.
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// TestCollectorReplicas pins the per-replica metrics of a handle on the
// master's replicas: one series a replica, each field its own value.
func TestCollectorReplicas(t *testing.T) {
	c := umbpprometheus.NewCollector()
	c.Add("h", fixedStats{
		Replicas: []umbp.ReplicaStats{
			{Addr: "10.0.0.1:15558", State: umbp.StateConnected, Calls: 31, Hedges: 32, Answers: 33, SetAsides: 34, Latency: 1500 * time.Microsecond},
			{Addr: "10.0.0.2:15558", State: umbp.StateReconnecting, SetAside: true, Calls: 41, Hedges: 42, Answers: 43, SetAsides: 44, Latency: 2 * time.Second},
		},
	})
	const want = `
# HELP umbp_master_replica_answers_total The master replica's answers that were used.
# TYPE umbp_master_replica_answers_total counter
umbp_master_replica_answers_total{handle="h",replica="10.0.0.1:15558"} 33
umbp_master_replica_answers_total{handle="h",replica="10.0.0.2:15558"} 43
# HELP umbp_master_replica_calls_total Calls sent to the master replica, hedges included.
# TYPE umbp_master_replica_calls_total counter
umbp_master_replica_calls_total{handle="h",replica="10.0.0.1:15558"} 31
umbp_master_replica_calls_total{handle="h",replica="10.0.0.2:15558"} 41
# HELP umbp_master_replica_hedges_total Calls sent to the master replica because another had not answered within the hedge delay.
# TYPE umbp_master_replica_hedges_total counter
umbp_master_replica_hedges_total{handle="h",replica="10.0.0.1:15558"} 32
umbp_master_replica_hedges_total{handle="h",replica="10.0.0.2:15558"} 42
# HELP umbp_master_replica_latency_seconds A moving average of the master replica's answers' time.
# TYPE umbp_master_replica_latency_seconds gauge
umbp_master_replica_latency_seconds{handle="h",replica="10.0.0.1:15558"} 0.0015
umbp_master_replica_latency_seconds{handle="h",replica="10.0.0.2:15558"} 2
# HELP umbp_master_replica_set_aside 1 while the master replica is set aside (stalled or refusing) and probed.
# TYPE umbp_master_replica_set_aside gauge
umbp_master_replica_set_aside{handle="h",replica="10.0.0.1:15558"} 0
umbp_master_replica_set_aside{handle="h",replica="10.0.0.2:15558"} 1
# HELP umbp_master_replica_set_asides_total Times the master replica was set aside.
# TYPE umbp_master_replica_set_asides_total counter
umbp_master_replica_set_asides_total{handle="h",replica="10.0.0.1:15558"} 34
umbp_master_replica_set_asides_total{handle="h",replica="10.0.0.2:15558"} 44
# HELP umbp_master_replica_up 1 while calls go to the master replica (its channel up, not set aside).
# TYPE umbp_master_replica_up gauge
umbp_master_replica_up{handle="h",replica="10.0.0.1:15558"} 1
umbp_master_replica_up{handle="h",replica="10.0.0.2:15558"} 0
`
	names := []string{"umbp_master_replica_answers_total", "umbp_master_replica_calls_total", "umbp_master_replica_hedges_total",
		"umbp_master_replica_latency_seconds", "umbp_master_replica_set_aside", "umbp_master_replica_set_asides_total", "umbp_master_replica_up"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

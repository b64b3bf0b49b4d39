package umbp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// TestStalledStore is the worker's promise: a store that outlives Timeout
// blocks new transfers (they fail as not attempted, at once), Wait says the
// buffers are in use, and everything resumes with the server.
func TestStalledStore(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 300 * time.Millisecond
	cfg.NumWorkers = 2
	rt := newRuntime(t, cfg)
	a := newEngine(t, rt, 2, 8, 256)
	plans := a.plans(t, "s", 0, 1)
	a.fill(plans, 9)

	srv.Stall()
	stuck := a.w.Store(plans)
	if a.w.Poll(stuck) {
		t.Fatal("Poll true on a stalled store")
	}
	waitCalls(t, srv, "BatchPutRanges", 1) // running: Wait bounds it by its deadline
	start := time.Now()
	err := a.w.Wait(context.Background(), stuck)
	if !errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("Wait on a stalled store = %v, want ErrBuffersInUse", err)
	}
	if el := time.Since(start); el > cfg.Timeout+margin {
		t.Fatalf("Wait took %v", el)
	}
	if stuck.Status() != umbp.JobRunning || a.w.Poll(stuck) {
		t.Fatalf("stalled store is %s", stuck.Status())
	}
	for _, j := range []*umbp.TransferJob{a.w.Store(a.plans(t, "s", 2)), a.w.Load(a.plans(t, "s", 0))} {
		if j.Status() != umbp.JobFailed || !errors.Is(j.Err(), umbp.ErrNotAttempted) || !strings.Contains(j.Err().Error(), "still blocked") {
			t.Fatalf("transfer while blocked: %s %v", j.Status(), j.Err())
		}
	}

	srv.Resume()
	select {
	case <-stuck.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("stalled store did not finish after Resume")
	}
	if stuck.Status() != umbp.JobCompleted {
		t.Fatalf("stalled store ended %s: %s", stuck.Status(), stuck.Err())
	}
	next := a.w.Store(a.plans(t, "s", 3))
	waitJob(t, a.w, next)
	if next.Status() != umbp.JobCompleted {
		t.Fatalf("store after resume: %s %s", next.Status(), next.Err())
	}
}

// TestQueuedBehindBlocked: with one transfer goroutine stuck, a job queued
// behind it is failed as not attempted by Poll and Wait, and Cancel withdraws
// another.
func TestQueuedBehindBlocked(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 200 * time.Millisecond
	cfg.NumWorkers = 1
	rt := newRuntime(t, cfg)
	a := newEngine(t, rt, 1, 8, 256)
	srv.Stall()
	defer srv.Resume()
	stuck := a.w.Store(a.plans(t, "q", 0))
	queued1 := a.w.Store(a.plans(t, "q", 1))
	queued2 := a.w.Load(a.plans(t, "q", 2))
	queued3 := a.w.Store(a.plans(t, "q", 3))
	a.w.Cancel(queued3)
	if queued3.Status() != umbp.JobCancelled || !errors.Is(queued3.Err(), umbp.ErrCancelled) || !strings.Contains(queued3.Err().Error(), "preempted") {
		t.Fatalf("cancelled queued job: %s %v", queued3.Status(), queued3.Err())
	}
	if err := a.w.Wait(context.Background(), queued3); !errors.Is(err, umbp.ErrCancelled) {
		t.Fatalf("Wait of a cancelled job = %v, want ErrCancelled", err)
	}
	if a.w.Poll(queued1) {
		t.Fatal("Poll failed a queued job before anything was blocked")
	}
	// Wait gives up on the stuck store at its deadline: it is blocked.
	waitCalls(t, srv, "BatchPut", 1) // running, not queued
	if err := a.w.Wait(context.Background(), stuck); !errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("Wait of the stuck store = %v, want ErrBuffersInUse", err)
	}
	if n := a.w.Stats().Transfers.Blocked; n != 1 {
		t.Fatalf("%d transfers blocked, want 1", n)
	}
	if !a.w.Poll(queued1) || queued1.Status() != umbp.JobFailed || !strings.Contains(queued1.Err().Error(), "queued behind a blocked") {
		t.Fatalf("Poll of a queued job: %s %v", queued1.Status(), queued1.Err())
	}
	err := a.w.Wait(context.Background(), queued2)
	if queued2.Status() != umbp.JobFailed || !errors.Is(err, umbp.ErrNotAttempted) || err.Error() != queued2.Err().Error() {
		t.Fatalf("Wait of a queued job = %v: %s %v", err, queued2.Status(), queued2.Err())
	}
	// Cancelling a running store leaves it running.
	a.w.Cancel(stuck)
	if stuck.Status() != umbp.JobRunning {
		t.Fatalf("cancel of a running store: %s", stuck.Status())
	}
}

func TestCloseWithStalledStoreAbandons(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 300 * time.Millisecond
	rt := newRuntime(t, cfg)
	buf, err := umbp.NewHostBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	w, err := rt.NewWorkerHandle(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	base := buf.Buffer().Ptr
	plan := umbp.BlockTransferPlan{Key: "abandon", Ranges: []umbp.KVRange{{BaseAddress: base, Length: 4096}}}
	srv.Stall()
	defer srv.Resume()
	job := w.Store([]umbp.BlockTransferPlan{plan})
	queued := w.Store([]umbp.BlockTransferPlan{{Key: "q", Ranges: []umbp.KVRange{{BaseAddress: base + 4096, Length: 4096}}}})
	waitCalls(t, srv, "BatchPut", 2) // one host range each: plain segments
	start := time.Now()
	err = w.Close()
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("Close took %v", el)
	}
	if !errors.Is(err, umbp.ErrBuffersAbandoned) || !strings.Contains(err.Error(), "kv") {
		t.Fatalf("Close = %v, want ErrBuffersAbandoned naming kv", err)
	}
	if err := buf.Close(); !errors.Is(err, umbp.ErrBuffersAbandoned) {
		t.Fatalf("closing an abandoned buffer = %v", err)
	}
	if job.Status() != umbp.JobRunning {
		t.Fatalf("stalled job %s", job.Status())
	}
	if s := queued.Status(); s != umbp.JobCancelled && s != umbp.JobFailed && s != umbp.JobRunning {
		t.Fatalf("queued job %s", s)
	}
	if n := srv.Calls("DeregisterMemory"); n != 0 {
		t.Fatalf("abandoning Close deregistered (%d calls)", n)
	}
}

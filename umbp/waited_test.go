package umbp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// waitedRuns counts the jobs whose request a Wait ran itself, until the
// test ends.
func waitedRuns(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	t.Cleanup(umbp.SetWaitedRunHook(func() { n.Add(1) }))
	return &n
}

// holdPool makes a transfer goroutine claim a job only once the job has
// ended (or 10 s have passed), until release is called: a Wait that runs
// a job claims it first. (A Wait that does not run it, for want of an
// idle transfer connection, leaves it to the held goroutine: each handle's
// first job is waited for before holdPool.)
func holdPool() (release func()) {
	return umbp.SetPoolClaimHook(func(j *umbp.TransferJob) {
		select {
		case <-j.Done():
		case <-time.After(10 * time.Second):
		}
	})
}

// cancelOnceSeen calls cancel once the server has seen n calls of method
// (or 10 s have passed: the test's own checks then fail). It may run on a
// goroutine other than the test's: it fails nothing itself.
func cancelOnceSeen(srv *umbptest.Server, method string, n int, cancel func()) {
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	_ = srv.WaitCalls(ctx, method, n)
	cancel()
}

// storeAndLoadBack fills plans with seed, stores them, clears the
// engine's buffer and loads them back, each job waited for, and fails the
// test (naming what) unless the buffer is as it was.
func storeAndLoadBack(t *testing.T, a *engine, plans []umbp.BlockTransferPlan, seed byte, what string) {
	t.Helper()
	a.fill(plans, seed)
	want := bytes.Clone(a.buf.Bytes())
	if err := a.w.Wait(context.Background(), a.w.Store(plans)); err != nil {
		t.Fatalf("%s: store: %v", what, err)
	}
	clear(a.buf.Bytes())
	if err := a.w.Wait(context.Background(), a.w.Load(plans)); err != nil {
		t.Fatalf("%s: load: %v", what, err)
	}
	if !bytes.Equal(a.buf.Bytes(), want) {
		t.Fatalf("%s: the loaded bytes differ", what)
	}
}

// mustEnd waits for job to end, failing the test after 10 s.
func mustEnd(t *testing.T, job *umbp.TransferJob, what string) {
	t.Helper()
	select {
	case <-job.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not end: %s", what, job.Status())
	}
}

// A Wait that finds the handle's one job still queued runs its request
// itself, plain and ranged, stores and loads, and the bytes come back
// whole; with one transfer goroutine it does not.
func TestWaitRunsTheJob(t *testing.T) {
	ran := waitedRuns(t)
	srv := newServer(t, umbptest.Options{})
	for _, layers := range []int{1, 3} { // one range a block (BatchPut), or ranged
		rt := newRuntime(t, testConfig(t, srv.Endpoint()))
		a := newEngine(t, rt, layers, 8, 512)
		prefix := fmt.Sprintf("l%d", layers) // the server is shared: keys of their own
		warm := a.plans(t, prefix+"warm", 7)
		waitJob(t, a.w, a.w.Store(warm)) // a transfer connection, idle from now on
		release := holdPool()
		t.Cleanup(release) // if the test stops before it releases the pool
		ran.Store(0)
		const rounds = 10
		plans := a.plans(t, prefix, 0, 1, 2)
		for i := range rounds {
			a.fill(plans, byte(layers+i))
			want := bytes.Clone(a.buf.Bytes())
			round := slices.Clone(plans)
			for k := range round {
				round[k].Key = fmt.Sprintf("%s-%d", plans[k].Key, i)
			}
			if err := a.w.Wait(context.Background(), a.w.Store(round)); err != nil {
				t.Fatal(err)
			}
			clear(a.buf.Bytes())
			if err := a.w.Wait(context.Background(), a.w.Load(round)); err != nil {
				t.Fatal(err)
			}
			for _, p := range round {
				for _, r := range p.Ranges {
					off := int(r.BaseAddress - a.buf.Buffer().Ptr)
					if !bytes.Equal(a.buf.Bytes()[off:off+int(r.Length)], want[off:off+int(r.Length)]) {
						t.Fatalf("%d layers: key %s: the loaded bytes differ", layers, p.Key)
					}
				}
			}
		}
		release()
		if n := ran.Load(); n != 2*rounds {
			t.Fatalf("%d layers: a Wait ran %d of the %d jobs itself", layers, n, 2*rounds)
		}
	}

	// With one transfer goroutine, transfers run one at a time: the
	// goroutine runs every job.
	cfg := testConfig(t, srv.Endpoint())
	cfg.NumWorkers = 1
	a := newEngine(t, newRuntime(t, cfg), 1, 4, 512)
	waitJob(t, a.w, a.w.Store(a.plans(t, "one", 0)))
	ran.Store(0)
	waitJob(t, a.w, a.w.Load(a.plans(t, "one", 0)))
	if n := ran.Load(); n != 0 {
		t.Fatalf("one transfer goroutine: a Wait ran %d jobs itself", n)
	}
}

// A job whose request a Wait runs keeps every promise of a job: Wait
// returns at the job's deadline (ErrBuffersInUse) or when its context
// ends, the job stays running with its buffers in use and holds up new
// transfers, and it completes once the server answers.
func TestWaitedRunStalled(t *testing.T) {
	for _, byCtx := range []bool{false, true} {
		ran := waitedRuns(t)
		srv := newServer(t, umbptest.Options{})
		cfg := testConfig(t, srv.Endpoint())
		cfg.Timeout = 300 * time.Millisecond
		if byCtx {
			cfg.Timeout = time.Minute
		}
		rt := newRuntime(t, cfg)
		a := newEngine(t, rt, 2, 8, 256)
		waitJob(t, a.w, a.w.Store(a.plans(t, "warm", 7)))
		release := holdPool()
		t.Cleanup(release) // if the test stops before it releases the pool
		plans := a.plans(t, "s", 0, 1)
		a.fill(plans, 3)

		srv.Stall()
		stuck := a.w.Store(plans)
		ctx, cancel := context.WithCancel(context.Background())
		if byCtx {
			go cancelOnceSeen(srv, "BatchPutRanges", 2, cancel) // the warm-up's and this one's
		}
		start := time.Now()
		err := a.w.Wait(ctx, stuck)
		cancel()
		if !errors.Is(err, umbp.ErrBuffersInUse) || byCtx != errors.Is(err, context.Canceled) {
			t.Fatalf("byCtx %v: Wait on a stalled store = %v", byCtx, err)
		}
		if el := time.Since(start); !byCtx && el > cfg.Timeout+margin {
			t.Fatalf("Wait took %v", el)
		}
		if n := ran.Load(); n != 1 {
			t.Fatalf("byCtx %v: a Wait ran %d jobs itself, want the stalled one", byCtx, n)
		}
		if stuck.Status() != umbp.JobRunning || a.w.Poll(stuck) {
			t.Fatalf("byCtx %v: the stalled store is %s", byCtx, stuck.Status())
		}
		if !byCtx {
			if j := a.w.Store(a.plans(t, "s", 2)); !errors.Is(j.Err(), umbp.ErrNotAttempted) {
				t.Fatalf("a store while one is blocked: %s %v", j.Status(), j.Err())
			}
		}
		srv.Resume()
		mustEnd(t, stuck, "the stalled store, after Resume")
		release()
		if stuck.Status() != umbp.JobCompleted {
			t.Fatalf("byCtx %v: the stalled store ended %s: %v", byCtx, stuck.Status(), stuck.Err())
		}
		clear(a.buf.Bytes())
		waitJob(t, a.w, a.w.Load(plans))
		if a.w.Stats().Transfers.Blocked != 0 {
			t.Fatal("a transfer still counted blocked")
		}
	}
}

// Close while the rest of a job a Wait began goes on elsewhere: Close
// says its buffers are abandoned to the server, and the job still ends
// once the server answers.
func TestWaitedRunClosed(t *testing.T) {
	ran := waitedRuns(t)
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 500 * time.Millisecond // Close waits for the store until then
	cfg.NumWorkers = 2
	rt := newRuntime(t, cfg)
	a := newEngine(t, rt, 1, 8, 256)
	waitJob(t, a.w, a.w.Store(a.plans(t, "warm", 7)))
	t.Cleanup(holdPool())
	srv.Stall()
	stuck := a.w.Store(a.plans(t, "c", 0))
	ctx, cancel := context.WithCancel(context.Background())
	go cancelOnceSeen(srv, "BatchPut", 2, cancel) // the warm-up's and this one's
	if err := a.w.Wait(ctx, stuck); !errors.Is(err, umbp.ErrBuffersInUse) || ran.Load() != 1 {
		t.Fatalf("Wait = %v, its request run by the Wait %d times", err, ran.Load())
	}
	if err := a.w.Close(); !errors.Is(err, umbp.ErrBuffersAbandoned) {
		t.Fatalf("Close with a store in flight = %v", err)
	}
	srv.Resume()
	mustEnd(t, stuck, "the store, after Resume")
}

// Waits and the transfer goroutines race to claim each job, store and
// load, plain and ranged: every byte comes back, and nothing runs twice
// or reads what the other gave back.
func TestWaitRacesTheTransferGoroutines(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	for _, layers := range []int{1, 2} {
		a := newEngine(t, newRuntime(t, testConfig(t, srv.Endpoint())), layers, 16, 256)
		prefix := fmt.Sprintf("race%d", layers)
		for i := range 300 {
			plans := a.plans(t, fmt.Sprintf("%s-%d", prefix, i), 0, 1, 2, 3)
			storeAndLoadBack(t, a, plans, byte(i), fmt.Sprintf("%d layers, round %d", layers, i))
		}
	}
}

// A Wait that loses the claim to a transfer goroutine, which runs the job
// to its end first, answers the job's outcome and reads nothing of it
// (the transfer goroutine has given its items back by then).
func TestWaitLosesTheClaim(t *testing.T) {
	ran := waitedRuns(t)
	srv := newServer(t, umbptest.Options{})
	a := newEngine(t, newRuntime(t, testConfig(t, srv.Endpoint())), 2, 8, 256)
	waitJob(t, a.w, a.w.Store(a.plans(t, "warm", 7)))
	t.Cleanup(umbp.SetWaitClaimsHook(func(j *umbp.TransferJob) {
		select {
		case <-j.Done():
		case <-time.After(10 * time.Second):
			t.Error("the transfer goroutine did not run the job")
		}
	}))
	storeAndLoadBack(t, a, a.plans(t, "lost", 0, 1, 2), 5, "lost")
	if n := ran.Load(); n != 0 {
		t.Fatalf("a Wait ran %d jobs it lost the claim of", n)
	}
}

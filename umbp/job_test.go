package umbp

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// newTestSet is a job set of its own for a test's jobs.
func newTestSet() *jobSet { return newJobSet(&transferCounters{}) }

// queuedJob is a job handed to no transfer goroutine but queued, as submit
// leaves it.
func queuedJob(kind jobKind, plans []BlockTransferPlan, set *jobSet) *TransferJob {
	j := newJob(kind, plans, set, "unix:///test.grpc.sock")
	j.submit(nil, nil)
	return j
}

// A job that starts just as the wait for a queued job runs out is waited
// for until its own deadline, not reported blocked at once.
func TestWaitStartedAsQueuedWaitEnds(t *testing.T) {
	j := queuedJob(kindStore, []BlockTransferPlan{{Key: "k"}}, newTestSet())
	if _, ok := j.begin(time.Hour, false); !ok {
		t.Fatal("begin failed")
	}
	// queuedFor 0: the queued wait has run out as the wait starts, with the
	// job already started.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := j.wait(ctx, 0)
	if !errors.Is(err, ErrBuffersInUse) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait = %v, want the context's end while the job runs (its deadline is an hour away)", err)
	}
	j.failRest(nil)
}

// The phases move as the state machine says, and the owner's blocked count
// follows a job into and out of phaseBlocked.
func TestJobPhases(t *testing.T) {
	o := newTestSet()
	j := newJob(kindLoad, []BlockTransferPlan{{Key: "a"}, {Key: "b"}}, o, "unix:///test.grpc.sock")
	if ph, _ := j.state(); ph != phaseNew {
		t.Fatalf("new job in phase %d", ph)
	}
	if _, ok := j.begin(time.Second, false); ok {
		t.Fatal("a job never submitted began")
	}
	if !j.submit(nil, nil) || j.submit(nil, nil) {
		t.Fatal("submit of a new job, then again: want true, then false")
	}
	if ph, _ := j.state(); ph != phaseQueued {
		t.Fatalf("submitted job in phase %d", ph)
	}
	// A deadline already past: its timer and this expire race, once.
	if _, ok := j.begin(-time.Second, false); !ok {
		t.Fatal("begin failed")
	}
	if j.cancelQueued("late") || j.failQueued(errQueuedBehind) {
		t.Fatal("a started job was withdrawn")
	}
	j.expire()
	if ph, _ := j.state(); ph != phaseBlocked || o.blocked.Load() != 1 {
		t.Fatalf("phase %d, blocked %d after the deadline; want blocked, 1", ph, o.blocked.Load())
	}
	j.detach()
	if ph, _ := j.state(); ph != phaseDetached || o.blocked.Load() != 0 {
		t.Fatalf("phase %d, blocked %d after detach; want detached, 0", ph, o.blocked.Load())
	}
	j.setOutcome(0, nil)
	j.setOutcome(1, ErrNotInPool)
	if ph, _ := j.state(); ph != phaseEnded || j.Status() != JobFailed || !errors.Is(j.Err(), ErrNotInPool) {
		t.Fatalf("phase %d, %s, %v after every outcome", ph, j.Status(), j.Err())
	}

	q := newJob(kindStore, []BlockTransferPlan{{Key: "q"}}, o, "unix:///test.grpc.sock")
	dropped := false
	q.submit(nil, func() { dropped = true })
	if !q.cancelQueued("preempted") || !dropped || q.Status() != JobCancelled || !errors.Is(q.Err(), ErrCancelled) {
		t.Fatalf("cancel of a queued job: %s %v, dropped %v", q.Status(), q.Err(), dropped)
	}
	if _, ok := q.begin(time.Second, false); ok {
		t.Fatal("a cancelled job began")
	}
}

// A wait that starts after the job did ends at the job's own deadline, not
// a queue bound later.
func TestWaitOfStartedJobEndsAtItsDeadline(t *testing.T) {
	o := newTestSet()
	j := queuedJob(kindLoad, []BlockTransferPlan{{Key: "k"}}, o)
	if _, ok := j.begin(50*time.Millisecond, false); !ok {
		t.Fatal("begin failed")
	}
	waitsUntilBlocked(t, j, o, time.Hour)
}

// waitsUntilBlocked checks that a wait for j (queuedFor its queued bound)
// ends at j's deadline, with j blocked, and then ends j.
func waitsUntilBlocked(t *testing.T, j *TransferJob, o *jobSet, queuedFor time.Duration) {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- j.wait(context.Background(), queuedFor) }()
	select {
	case err := <-got:
		if !errors.Is(err, ErrBuffersInUse) {
			t.Fatalf("wait = %v, want ErrBuffersInUse at the job's deadline", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the wait outlived the job's deadline by a minute")
	}
	if o.blocked.Load() != 1 {
		t.Fatalf("blocked %d past the deadline, want 1", o.blocked.Load())
	}
	j.failRest(nil)
}

// A job that starts between the queued wait's end and its withdrawal is
// waited for until its own deadline: the wait does not hang on it.
func TestWaitForJobStartingAsItIsWithdrawn(t *testing.T) {
	o := newTestSet()
	j := queuedJob(kindLoad, []BlockTransferPlan{{Key: "k"}}, o)
	testHookQueuedWaitRanOut = func(j *TransferJob) {
		if _, ok := j.begin(50*time.Millisecond, false); !ok {
			t.Error("begin failed")
		}
	}
	defer func() { testHookQueuedWaitRanOut = nil }()
	waitsUntilBlocked(t, j, o, time.Millisecond)
}

// A job whose stream gets there only after its deadline, or after its
// connection was replaced, is not sent: streamReady says why.
func TestStreamReadyLateOrReplaced(t *testing.T) {
	o := newTestSet()
	late := queuedJob(kindStore, []BlockTransferPlan{{Key: "late"}}, o)
	if _, ok := late.begin(-time.Second, true); !ok {
		t.Fatal("begin failed")
	}
	late.expire() // its timer: nothing to block while it waits for the stream
	if err := late.streamReady(); !errors.Is(err, errStreamLate) {
		t.Fatalf("streamReady past the deadline = %v, want errStreamLate", err)
	}
	if ph, _ := late.state(); ph != phaseStream || o.blocked.Load() != 0 {
		t.Fatalf("phase %d, blocked %d; want still in stream, nothing blocked", ph, o.blocked.Load())
	}
	late.failRest(nil)

	moved := queuedJob(kindStore, []BlockTransferPlan{{Key: "moved"}}, o)
	if _, ok := moved.begin(time.Hour, true); !ok {
		t.Fatal("begin failed")
	}
	moved.detach()
	if ph, _ := moved.state(); ph != phaseOrphaned {
		t.Fatalf("phase %d after its connection was replaced in stream, want orphaned", ph)
	}
	if err := moved.streamReady(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("streamReady after the connection was replaced = %v, want ErrUnavailable", err)
	}
	moved.failRest(nil)

	ok := queuedJob(kindStore, []BlockTransferPlan{{Key: "ok"}}, o)
	if _, ok := ok.begin(time.Hour, true); !ok {
		t.Fatal("begin failed")
	}
	if err := ok.streamReady(); err != nil {
		t.Fatalf("streamReady in time = %v", err)
	}
	if ph, _ := ok.state(); ph != phaseInFlight {
		t.Fatalf("phase %d after streamReady, want in flight", ph)
	}
	ok.failRest(nil)
}

// A replaced connection fails the jobs still queued on it as not attempted
// and detaches the running ones: neither can later count as blocked on the
// new server.
func TestReplacedFailsQueuedAndDetachesRunning(t *testing.T) {
	w := &jobRunner{jobs: newTestSet(), timeout: time.Second}
	queued := queuedJob(kindStore, []BlockTransferPlan{{Key: "q"}}, w.jobs)
	running := queuedJob(kindLoad, []BlockTransferPlan{{Key: "r"}}, w.jobs)
	w.jobs.add(queued)
	w.jobs.add(running)
	if _, ok := running.begin(-time.Second, false); !ok {
		t.Fatal("begin failed")
	}
	w.leave(nil)
	if _, ok := queued.begin(-time.Second, false); ok {
		t.Fatal("a job queued on the replaced connection began")
	}
	if !errors.Is(queued.Err(), ErrNotAttempted) || !errors.Is(queued.Err(), ErrUnavailable) {
		t.Fatalf("queued job's error %v, want not attempted and unavailable", queued.Err())
	}
	running.expire()
	if ph, _ := running.state(); ph != phaseDetached || w.jobs.blocked.Load() != 0 {
		t.Fatalf("running job in phase %d with %d blocked; want detached, none", ph, w.jobs.blocked.Load())
	}
	running.failRest(nil)
}

// A job that ends from blocked has left the blocked count by the time its
// Done closes, before the rest of its bookkeeping: a transfer submitted as
// soon as Done fires is not refused for it.
func TestEndedJobHoldsNothingUp(t *testing.T) {
	set := newTestSet()
	j := queuedJob(kindStore, []BlockTransferPlan{{Key: "k"}}, set)
	if _, ok := j.begin(-time.Second, false); !ok {
		t.Fatal("begin failed")
	}
	j.expire()
	if set.blocked.Load() != 1 {
		t.Fatalf("blocked %d past the deadline, want 1", set.blocked.Load())
	}
	j.mu.Lock()
	fin := j.endLocked() // what runs after the lock has not run yet
	j.mu.Unlock()
	select {
	case <-j.Done():
	default:
		t.Fatal("the job ended without closing Done")
	}
	if n := set.blocked.Load(); n != 0 {
		t.Fatalf("blocked %d once Done closed, want 0", n)
	}
	fin()
	if n := set.blocked.Load(); n != 0 {
		t.Fatalf("blocked %d after the job's bookkeeping, want 0", n)
	}
}

// A job's error groups key faults by cause, naming the first keys; any
// other error is said once per distinct text; every error stays matched.
func TestJobErrorGroups(t *testing.T) {
	refused := func(k string) error { return &keyFault{cause: ErrRefused, key: k, size: 64} }
	other := fmt.Errorf("%w: connection reset", ErrUnavailable)
	errs := []error{refused("a"), nil, other, refused("b"), other, refused("c"), refused("d"), refused("e")}
	e := newJobError(len(errs), errs)
	want := `7 of 8 keys failed: 5 keys: refused by the server: keys "a", "b", "c" and 2 more: the pool could not take them (full, or smaller than the objects); 2 keys: server unavailable: connection reset`
	if got := e.Error(); got != want {
		t.Errorf("\n got %q\nwant %q", got, want)
	}
	if n := len(e.Unwrap()); n != 6 {
		t.Errorf("Unwrap has %d errors, want the 6 distinct ones", n)
	}
	if !errors.Is(e, ErrRefused) || !errors.Is(e, ErrUnavailable) {
		t.Error("the job's error does not match its causes")
	}
	one := newJobError(2, []error{nil, refused("x")})
	if got, want := one.Error(), `1 of 2 keys failed: refused by the server: store of key "x" (64 bytes): the pool could not take it (full, or smaller than the object)`; got != want {
		t.Errorf("\n got %q\nwant %q", got, want)
	}
}

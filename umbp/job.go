package umbp

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// phase is where a job is in its life, and the source of its status: every
// phase but ended is RUNNING. Every change of phase is a method of
// TransferJob below, made under the job's lock, and these are all of them:
//
//	new ──submit──▶ queued ──begin──▶ stream ──streamReady──▶ inFlight ──expire──▶ blocked
//	 │                │                 │ │                     │                    │
//	 │                │           detach│ │                     └──detach──▶ detached◀┘
//	 │                │                 ▼ │                                    │
//	 │                │            orphaned                                    │
//	 │                │                 │ │                                    │
//	 └────────────────┴─────────────────┴─┴──────(every key has an outcome)─────┴──▶ ended
//
// new: made, not handed to the transfer goroutines; a job refused at once
// (or whose every plan failed in planning) ends from here.
// queued: handed to the transfer goroutines, not started; Cancel, a wait
// that gives up, or a blocked transfer ahead of it end it unsent.
// stream: waiting for the engine's GPU stream (AfterStream), nothing sent.
// orphaned: waiting for the stream when the connection was replaced: it
// fails having sent nothing once the stream gets there (streamReady).
// inFlight: requests sent; the server may use the buffers until it answers.
// blocked: in flight past the deadline; new transfers are refused while a
// job is blocked on the handle's current connection.
// detached: the transport failed under the transfer, or the connection was
// replaced: the buffers stay in use until the old server process has exited
// or answered, but the job holds nothing up on the new server.
// ended: every key has an outcome, or the job was cancelled; its buffers
// are free.
type phase uint8

const (
	phaseNew phase = iota
	phaseQueued
	phaseStream
	phaseOrphaned
	phaseInFlight
	phaseBlocked
	phaseDetached
	phaseEnded
)

// TransferJob is one asynchronous store or load of KV blocks, returned by a
// [WorkerHandle]. Each plan (key) has its own outcome: one failed key never
// fails its siblings. The job is COMPLETED when every key succeeded, FAILED
// when every key has an outcome and one at least failed, CANCELLED when it
// was withdrawn before it started. Its methods are safe for concurrent use,
// and on a nil job they report a job that failed.
type TransferJob struct {
	kind  jobKind
	plans []BlockTransferPlan
	set   jobEvents     // the handle's jobs, told of this one's transitions
	where string        // the endpoint, for its errors
	conn  *conn.Conn    // the connection it runs on; nil if refused at once
	done  chan struct{} // closed when the job ends

	mu        sync.Mutex
	phase     phase
	errs      []error  // each plan's error; nil on success or without an outcome
	sizes     []uint64 // each plan's object size, once resolved (before it runs)
	has       []bool   // which plans have an outcome
	left      int      // plans without an outcome
	cancelled error    // why a CANCELLED job was withdrawn
	failure   error    // a FAILED job's error, built once as it ends
	deadline  time.Time
	timer     *time.Timer // fires expire at the deadline
	// drop releases what the transfer would have released had it run (an
	// AfterStream event); called when the job ends before it starts.
	drop func()
	// queued is the job's run as handed to the transfer goroutines, for a
	// Wait to claim (waited.go); set before the job is returned.
	queued waitRunner
	// pause, while a Wait runs the job (waited.go), hands it on at its
	// deadline.
	pause func()
}

// waitRunner is a queued job's run, which a Wait may make itself
// (waited.go) before it waits for the job.
type waitRunner interface {
	runWaited(ctx context.Context)
}

// jobEvents is told of a job's transitions: the set of a handle's jobs in
// flight (jobset.go), which counts them.
type jobEvents interface {
	// blockedDelta counts a job entering (+1) or leaving (-1) phaseBlocked.
	blockedDelta(d int)
	// count counts a job that ended, from phase was, with status and the
	// bytes it moved.
	count(kind jobKind, was phase, status JobStatus, bytes uint64)
	// forget takes an ended job, which was in phase was, off the set.
	forget(j *TransferJob, was phase)
}

// newJob makes a job of plans, which it keeps: the caller must not change
// them afterwards.
func newJob(kind jobKind, plans []BlockTransferPlan, set jobEvents, where string) *TransferJob {
	return &TransferJob{
		where: where,
		kind:  kind,
		plans: plans, // the job's own: Store and Load clone the caller's
		set:   set,
		done:  make(chan struct{}),
		errs:  make([]error, len(plans)),
		has:   make([]bool, len(plans)),
		left:  len(plans),
	}
}

// errNilJob is what a nil job answers.
var errNilJob = invalid(fmt.Errorf("%w: nil *TransferJob", ErrInvalidPlan))

// closedChan is what Done returns for a nil job.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Status returns the job's current status; JobFailed for a nil job.
func (j *TransferJob) Status() JobStatus {
	if j == nil {
		return JobFailed
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.statusLocked()
}

// statusLocked derives the status from the phase and the outcome.
func (j *TransferJob) statusLocked() JobStatus {
	switch {
	case j.phase != phaseEnded:
		return JobRunning
	case j.cancelled != nil:
		return JobCancelled
	case j.failure != nil:
		return JobFailed
	}
	return JobCompleted
}

// Done returns a channel closed when the job has ended (COMPLETED, FAILED or
// CANCELLED). Only then are its buffers free for the engine to reuse.
func (j *TransferJob) Done() <-chan struct{} {
	if j == nil {
		return closedChan
	}
	return j.done
}

// Plans returns the job's plans, in the order they were given. The slice is
// the job's own: do not modify it.
func (j *TransferJob) Plans() []BlockTransferPlan {
	if j == nil {
		return nil
	}
	return j.plans
}

// Keys returns the keys of the job's plans, in order.
func (j *TransferJob) Keys() []string {
	if j == nil {
		return nil
	}
	keys := make([]string, len(j.plans))
	for i := range j.plans {
		keys[i] = j.plans[i].Key
	}
	return keys
}

// CompletedKeys returns the keys that succeeded so far, in plan order.
func (j *TransferJob) CompletedKeys() []string {
	return j.keysWhere(func(i int) bool { return j.has[i] && j.errs[i] == nil })
}

// FailedKeys returns the keys that failed so far, in plan order: those whose
// KeyErr is not nil. A CANCELLED job's keys are all failed (ErrCancelled),
// but for any that failed before it was withdrawn, with their own error.
func (j *TransferJob) FailedKeys() []string {
	return j.keysWhere(func(i int) bool { return j.errs[i] != nil })
}

// FailedBlockIDs returns the block ids of the plans that failed, in order.
func (j *TransferJob) FailedBlockIDs() []int {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	var ids []int
	for i, err := range j.errs {
		if err != nil {
			ids = append(ids, j.plans[i].BlockID)
		}
	}
	return ids
}

func (j *TransferJob) keysWhere(keep func(i int) bool) []string {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []string
	for i := range j.plans {
		if keep(i) {
			out = append(out, j.plans[i].Key)
		}
	}
	return out
}

// KeyErr returns the error of plan i: nil when it succeeded or has no
// outcome yet (or i is out of range). It matches the package's sentinels
// with errors.Is: ErrNotAttempted, ErrNotInPool, ErrRefused,
// ErrUnavailable, ErrCancelled (a key of a CANCELLED job) and the rest.
func (j *TransferJob) KeyErr(i int) error {
	if j == nil {
		return errNilJob
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if i < 0 || i >= len(j.errs) {
		return nil
	}
	return j.errs[i]
}

// Err returns why the job failed or was cancelled, nil otherwise (a job
// still running included). A FAILED job's error holds every distinct key
// error once, and errors.Is and errors.As see each of them; its text spells
// out the first three, each with how many keys it failed, and counts the
// rest. A CANCELLED job's matches ErrCancelled.
func (j *TransferJob) Err() error {
	if j == nil {
		return errNilJob
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cancelled != nil {
		return opError(j.kind.String(), j.where, j.cancelled)
	}
	return j.failure // nil until it FAILED
}

// failureLocked builds a FAILED job's error from its key errors.
func (j *TransferJob) failureLocked() error {
	return opError(j.kind.String(), j.where, newJobError(len(j.plans), j.errs))
}

// --- transitions -----------------------------------------------------------

// setOutcome records plan i's outcome (err nil on success) once; later
// calls for i are ignored. The job ends when the last plan has one.
func (j *TransferJob) setOutcome(i int, err error) {
	j.mu.Lock()
	j.setLocked(i, err)
	fin := j.finishLocked()
	j.mu.Unlock()
	fin()
}

// setOutcomes records n outcomes under one lock: outcome(k) gives the k-th
// one's plan index and error.
func (j *TransferJob) setOutcomes(n int, outcome func(k int) (int, error)) {
	j.mu.Lock()
	for k := range n {
		j.setLocked(outcome(k))
	}
	fin := j.finishLocked()
	j.mu.Unlock()
	fin()
}

func (j *TransferJob) setLocked(i int, err error) {
	if j.phase == phaseEnded || j.has[i] {
		return
	}
	j.has[i], j.errs[i] = true, err
	j.left--
}

// failRest fails every plan without an outcome with err, ending the job.
func (j *TransferJob) failRest(err error) {
	j.mu.Lock()
	for i := range j.has {
		j.setLocked(i, err)
	}
	fin := j.finishLocked()
	j.mu.Unlock()
	fin()
}

// finishLocked ends the job if every plan has an outcome, and returns what
// to run once the lock is released.
func (j *TransferJob) finishLocked() func() {
	if j.phase == phaseEnded || j.left > 0 {
		return func() {}
	}
	for _, err := range j.errs {
		if err != nil {
			j.failure = j.failureLocked()
			break
		}
	}
	return j.endLocked()
}

// endLocked moves the job to phaseEnded, counts it, and returns what to run
// once the lock is released: taking it off the job's set, and, for a job
// that never started, its drop.
func (j *TransferJob) endLocked() func() {
	was := j.phase
	j.phase = phaseEnded
	if j.timer != nil {
		j.timer.Stop()
	}
	var drop func()
	if was == phaseQueued {
		drop, j.drop = j.drop, nil
	}
	if was == phaseBlocked {
		// Before Done: a job that has ended holds no transfer up.
		j.set.blockedDelta(-1)
	}
	// Before Done too: Stats counts a job Wait has returned for.
	j.set.count(j.kind, was, j.statusLocked(), j.bytesLocked())
	close(j.done)
	return func() {
		if drop != nil {
			drop()
		}
		j.set.forget(j, was)
	}
}

// submit moves a new job to queued: it was handed to the transfer
// goroutines on c, with what to release if it never starts. It reports
// false for a job that ended already.
func (j *TransferJob) submit(c *conn.Conn, drop func()) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.phase != phaseNew {
		return false
	}
	j.phase, j.conn, j.drop = phaseQueued, c, drop
	return true
}

// begin starts a queued transfer: its deadline is timeout from now. With
// stream, it first waits for the engine's stream. It reports false for a
// job that ended while queued (cancelled, or failed behind a blocked one):
// the transfer must not run.
func (j *TransferJob) begin(timeout time.Duration, stream bool) (deadline time.Time, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.phase != phaseQueued {
		return time.Time{}, false
	}
	j.phase = phaseInFlight
	if stream {
		j.phase = phaseStream
	}
	j.drop = nil // the transfer releases what it holds itself
	j.deadline = time.Now().Add(timeout)
	j.timer = time.AfterFunc(timeout, j.expire)
	return j.deadline, true
}

// streamReady: the engine's stream got there. It returns nil when the
// transfer may be sent, and why not when it may not: its deadline has
// passed, or its connection was replaced meanwhile. Such a job is then
// failed having sent nothing.
func (j *TransferJob) streamReady() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.phase != phaseStream:
		return errReconnecting // orphaned: its connection was replaced meanwhile
	case !time.Now().Before(j.deadline):
		return errStreamLate
	}
	j.phase = phaseInFlight
	return nil
}

// expire runs at the deadline: a job still in flight is blocked, and a
// Wait running it hands it on.
func (j *TransferJob) expire() {
	j.mu.Lock()
	late := !time.Now().Before(j.deadline)
	if j.phase == phaseInFlight && late {
		j.phase = phaseBlocked
		j.set.blockedDelta(1) // with the phase: the count never lags it
	}
	pause := j.pause
	j.mu.Unlock()
	if pause != nil && late {
		pause()
	}
}

// setPause sets (or, with nil, clears) what hands the job on at its
// deadline while a Wait runs it; a deadline already past hands it on now.
func (j *TransferJob) setPause(pause func()) {
	j.mu.Lock()
	j.pause = pause
	late := !time.Now().Before(j.deadline)
	j.mu.Unlock()
	if pause != nil && late {
		pause()
	}
}

// detach marks a running transfer as held by a server the handle no longer
// uses: its buffers stay in use until it ends, but it holds nothing up.
func (j *TransferJob) detach() {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch j.phase {
	case phaseStream:
		j.phase = phaseOrphaned // it fails unsent once its stream gets there
	case phaseBlocked:
		j.set.blockedDelta(-1)
		fallthrough
	case phaseInFlight:
		j.phase = phaseDetached
	}
}

// cancelQueued withdraws a job that has not started: it becomes CANCELLED
// with reason. It reports whether it did.
func (j *TransferJob) cancelQueued(reason string) bool {
	j.mu.Lock()
	if j.phase != phaseQueued {
		j.mu.Unlock()
		return false
	}
	j.cancelled = fmt.Errorf("%w (%s)", ErrCancelled, reason)
	for i := range j.has { // each withdrawn key's outcome: FailedKeys lists it
		j.setLocked(i, j.cancelled)
	}
	fin := j.endLocked()
	j.mu.Unlock()
	fin()
	return true
}

// failQueued fails every key of a job that has not started with err, as
// not attempted. It reports whether it did.
func (j *TransferJob) failQueued(err error) bool {
	j.mu.Lock()
	if j.phase != phaseQueued {
		j.mu.Unlock()
		return false
	}
	err = notAttempted(err)
	for i := range j.has {
		j.setLocked(i, err)
	}
	fin := j.finishLocked()
	j.mu.Unlock()
	fin()
	return true
}

// --- reads -----------------------------------------------------------------

// connection returns the connection the job was submitted on.
func (j *TransferJob) connection() *conn.Conn {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.conn
}

// bytesLocked returns the object bytes of the keys that succeeded.
func (j *TransferJob) bytesLocked() (bytes uint64) {
	for i, size := range j.sizes {
		if j.has[i] && j.errs[i] == nil {
			bytes += size
		}
	}
	return bytes
}

// state returns the job's phase and deadline (zero before it started).
func (j *TransferJob) state() (phase, time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.phase, j.deadline
}

// ended reports whether the job has ended.
func (j *TransferJob) ended() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// testHookQueuedWaitRanOut, when set by a test, runs as a wait for a
// queued job gives up on it, before it withdraws the job.
var testHookQueuedWaitRanOut func(*TransferJob)

// waitEnded is wait's answer when ctx ended first: a job still queued fails
// as not attempted; one running is still using its buffers.
func (j *TransferJob) waitEnded(ctx context.Context) error {
	if j.failQueued(fmt.Errorf("the wait for it ended while it was queued: %w", ctx.Err())) || j.ended() {
		return j.Err()
	}
	return opError(j.kind.String(), j.where, fmt.Errorf("%s still running: %w: %w", plural(len(j.plans), "key"), ErrBuffersInUse, ctx.Err()))
}

// wait waits for the job to end, at most until its deadline once it runs
// (until queuedFor from now while it is queued), or until ctx ends; see
// WorkerHandle.Wait. A job still queued when the wait gives up fails as not
// attempted.
func (j *TransferJob) wait(ctx context.Context, queuedFor time.Duration) error {
	if j.ended() {
		return j.Err()
	}
	if ctx.Err() != nil {
		return j.waitEnded(ctx)
	}
	// The wait wakes for the job's end, ctx, or its timer, and no sooner:
	// a job that started while it waited is waited for until its own
	// deadline once the timer for a queued one has run out (that deadline
	// comes later: the transfer's timeout counts from its start).
	bound := queuedFor
	if ph, dl := j.state(); ph != phaseQueued && ph != phaseEnded {
		bound = time.Until(dl)
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case <-j.done:
			return j.Err()
		case <-ctx.Done():
			return j.waitEnded(ctx)
		case <-timer.C:
		}
		if ctx.Err() != nil { // both ended: the context's answer
			return j.waitEnded(ctx)
		}
		ph, dl := j.state()
		if ph != phaseQueued && ph != phaseEnded && time.Now().Before(dl) {
			// It started while the wait for a queued job ran: wait for
			// its own deadline.
			timer.Reset(time.Until(dl))
			continue
		}
		j.expire() // the deadline has passed, whichever timer saw it first
		switch ph {
		case phaseEnded:
			return j.Err()
		case phaseQueued:
			if testHookQueuedWaitRanOut != nil {
				testHookQueuedWaitRanOut(j)
			}
			if j.failQueued(errQueuedBehind) {
				return j.Err()
			}
			// It started just now: wait for its own deadline (the timer
			// has fired; nothing else would end this wait).
			_, dl := j.state()
			timer.Reset(time.Until(dl))
			continue
		case phaseStream, phaseOrphaned:
			// It waits for the engine's stream, having sent nothing, and
			// gives up at this same deadline: as not attempted.
			select {
			case <-j.done:
				return j.Err()
			case <-time.After(streamWaitGrace):
			}
		}
		return opError(j.kind.String(), j.where, fmt.Errorf("%s still running past the deadline: %w", plural(len(j.plans), "key"), ErrBuffersInUse))
	}
}

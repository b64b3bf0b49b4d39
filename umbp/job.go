package umbp

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/daemonpool"
)

// TransferNotAttempted starts the error of every key that failed before its
// transfer touched memory or the server: the engine may reuse those blocks
// at once and recompute.
const TransferNotAttempted = "transfer not attempted"

// JobStatus is the state of a [TransferJob].
type JobStatus int

const (
	// JobPending is a job that has not been submitted.
	JobPending JobStatus = iota
	// JobRunning is a job submitted to the handle's transfer goroutines,
	// queued or in progress. Its buffers may be in use.
	JobRunning
	// JobCompleted is a job whose every key succeeded.
	JobCompleted
	// JobFailed is a job whose every key has an outcome, one at least failed.
	JobFailed
	// JobCancelled is a job cancelled before it started.
	JobCancelled
)

// String returns the status in upper case, as the reference runtime prints it.
func (s JobStatus) String() string {
	switch s {
	case JobPending:
		return "PENDING"
	case JobRunning:
		return "RUNNING"
	case JobCompleted:
		return "COMPLETED"
	case JobFailed:
		return "FAILED"
	case JobCancelled:
		return "CANCELLED"
	}
	return fmt.Sprintf("JobStatus(%d)", int(s))
}

// ended reports whether s is final.
func (s JobStatus) ended() bool { return s >= JobCompleted }

type jobKind int

const (
	kindLoad jobKind = iota
	kindStore
)

func (k jobKind) String() string {
	if k == kindStore {
		return "store"
	}
	return "load"
}

// outcome of one plan of a job.
type outcome struct {
	done bool   // has an outcome
	err  string // empty on success
}

// TransferJob is one asynchronous store or load of KV blocks, returned by a
// [WorkerHandle]. Each plan (key) has its own outcome: one failed key never
// fails its siblings. The job is COMPLETED when every key succeeded, FAILED
// when every key has an outcome and one at least failed, CANCELLED when it
// was cancelled before it started. Its methods are safe for concurrent use.
type TransferJob struct {
	kind  jobKind
	plans []BlockTransferPlan
	done  chan struct{}

	mu       sync.Mutex
	status   JobStatus
	outcomes []outcome
	left     int    // plans without an outcome
	reason   string // why the job was cancelled
	// future runs the transfer; nil until submitted.
	future *daemonpool.Future
	// deadline is set when the transfer starts running.
	deadline time.Time
	// conn is the connection the transfer uses, set at submission.
	conn *conn.Conn
	// dropped releases what the transfer would have released had it run
	// (an AfterStream event); called when it is cancelled before running.
	dropped func()
	// waitingStream is set while the running transfer waits for the
	// engine's stream (AfterStream), having sent nothing.
	waitingStream bool
}

// setWaitingForStream marks whether the transfer waits for the engine's
// stream.
func (j *TransferJob) setWaitingForStream(v bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.waitingStream = v
}

// waitingForStream reports whether the transfer waits for the engine's
// stream: it holds no buffers of the server's then.
func (j *TransferJob) waitingForStream() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.waitingStream
}

// drop runs the job's release for a transfer that will never run.
func (j *TransferJob) drop() {
	j.mu.Lock()
	f := j.dropped
	j.dropped = nil
	j.mu.Unlock()
	if f != nil {
		f()
	}
}

func newJob(kind jobKind, plans []BlockTransferPlan) *TransferJob {
	j := &TransferJob{
		kind:     kind,
		plans:    slices.Clone(plans), // the caller may reuse its slice
		done:     make(chan struct{}),
		outcomes: make([]outcome, len(plans)),
		left:     len(plans),
		status:   JobPending,
	}
	return j
}

// Status returns the job's current status.
func (j *TransferJob) Status() JobStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.status
}

// Done returns a channel closed when the job has ended (COMPLETED, FAILED or
// CANCELLED). Only then are its buffers free for the engine to reuse.
func (j *TransferJob) Done() <-chan struct{} { return j.done }

// Plans returns the job's plans, in the order they were given. The slice is
// the job's own: do not modify it.
func (j *TransferJob) Plans() []BlockTransferPlan { return j.plans }

// Keys returns the keys of the job's plans, in order.
func (j *TransferJob) Keys() []string {
	keys := make([]string, len(j.plans))
	for i := range j.plans {
		keys[i] = j.plans[i].Key
	}
	return keys
}

// CompletedKeys returns the keys that succeeded so far, in plan order.
func (j *TransferJob) CompletedKeys() []string {
	return j.collect(func(o outcome) bool { return o.done && o.err == "" }, func(p *BlockTransferPlan) string { return p.Key })
}

// FailedKeys returns the keys that failed so far, in plan order.
func (j *TransferJob) FailedKeys() []string {
	return j.collect(func(o outcome) bool { return o.done && o.err != "" }, func(p *BlockTransferPlan) string { return p.Key })
}

// FailedBlockIDs returns the block ids of the plans that failed, in order.
func (j *TransferJob) FailedBlockIDs() []int {
	j.mu.Lock()
	defer j.mu.Unlock()
	var ids []int
	for i, o := range j.outcomes {
		if o.done && o.err != "" {
			ids = append(ids, j.plans[i].BlockID)
		}
	}
	return ids
}

// KeyErr returns the error of key i's plan ("" if it succeeded or has no
// outcome yet).
func (j *TransferJob) KeyErr(i int) string {
	j.mu.Lock()
	defer j.mu.Unlock()
	if i < 0 || i >= len(j.outcomes) {
		return ""
	}
	return j.outcomes[i].err
}

// Err summarizes why the job failed or was cancelled: the distinct key
// errors, each once, with the keys it applies to counted. It is "" for a job
// that has not failed.
func (j *TransferJob) Err() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.status == JobCancelled {
		return j.reason
	}
	var order []string
	count := map[string]int{}
	for _, o := range j.outcomes {
		if o.done && o.err != "" {
			if count[o.err] == 0 {
				order = append(order, o.err)
			}
			count[o.err]++
		}
	}
	parts := make([]string, len(order))
	for i, e := range order {
		if count[e] > 1 {
			parts[i] = fmt.Sprintf("%s (%d keys)", e, count[e])
		} else {
			parts[i] = e
		}
	}
	return strings.Join(parts, "; ")
}

func (j *TransferJob) collect(keep func(outcome) bool, get func(*BlockTransferPlan) string) []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []string
	for i, o := range j.outcomes {
		if keep(o) {
			out = append(out, get(&j.plans[i]))
		}
	}
	return out
}

// start marks the job submitted.
func (j *TransferJob) start() {
	j.mu.Lock()
	if j.status == JobPending {
		j.status = JobRunning
	}
	j.mu.Unlock()
}

// setOutcome records plan i's outcome once; later calls for i are ignored.
// The job ends when the last plan has an outcome.
func (j *TransferJob) setOutcome(i int, err string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.setLocked(i, err)
}

func (j *TransferJob) setLocked(i int, err string) {
	if j.status.ended() || j.outcomes[i].done {
		return
	}
	j.outcomes[i] = outcome{done: true, err: err}
	j.left--
	if j.left == 0 {
		j.finishLocked()
	}
}

// failRest fails every plan without an outcome with err; it reports
// whether that ended the job.
func (j *TransferJob) failRest(err string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.status.ended() {
		return false
	}
	for i := range j.outcomes {
		j.setLocked(i, err)
	}
	if j.left == 0 && !j.status.ended() { // a job of no plans
		j.finishLocked()
	}
	return j.status.ended()
}

// connection returns the connection the job was submitted on.
func (j *TransferJob) connection() *conn.Conn {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.conn
}

// finishLocked settles the status once every plan has an outcome.
func (j *TransferJob) finishLocked() {
	j.status = JobCompleted
	for _, o := range j.outcomes {
		if o.err != "" {
			j.status = JobFailed
			break
		}
	}
	close(j.done)
}

// cancel ends a job that never started; it reports whether it ended it.
func (j *TransferJob) cancel(reason string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.status.ended() {
		return false
	}
	j.status = JobCancelled
	j.reason = reason
	close(j.done)
	return true
}

// markRunning records when the transfer started and returns its deadline.
func (j *TransferJob) markRunning(timeout time.Duration) time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.deadline = time.Now().Add(timeout)
	return j.deadline
}

// runState reports whether the transfer started and its deadline.
func (j *TransferJob) runState() (started bool, deadline time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return !j.deadline.IsZero(), j.deadline
}

// fut returns the future running the job's transfer, nil before submission.
func (j *TransferJob) fut() *daemonpool.Future {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.future
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

var errJobNotCompleted = errors.New("umbp: cannot publish a job that is not COMPLETED")

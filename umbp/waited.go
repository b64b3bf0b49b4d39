package umbp

import (
	"context"
	"sync/atomic"
)

// A job that a Wait finds still queued may run on the waiting goroutine
// itself: the handoff to a transfer goroutine, and the one back to the
// Wait when it ends, each wake a goroutine that may sit on another thread,
// for a few microseconds to tens of them a job. Whoever claims the queued
// job first runs it: a transfer goroutine (the job progresses whether or
// not anyone waits) or a Wait.
//
// A Wait runs it only when it is the handle's one job (nothing queued or
// running beside it, blocked or not: a Wait runs no transfer that one
// blocked would hold up, and none out of its turn), on a handle with more
// than one transfer goroutine (with one, transfers run one at a time, in
// turn), and when its items go as one lock-step request on a
// transfer connection idle now (transport.start): nothing but that
// request's reads and writes can wait, and those stop at Wait's bound (the
// job's deadline, or ctx) without losing the request (conn.Transfer's
// Pause). What is left then — the rest of the request, a retry of refused
// stores, a request sent again — goes on on a goroutine of its own
// (handOn), and the Wait waits for it as for any job. The queued job
// itself (queuedRun, the transfer goroutines' side) is transfer.go's.

// testHookWaitClaims, when set by a test, runs as a Wait is about to
// claim a job.
var testHookWaitClaims atomic.Pointer[func(*TransferJob)]

// testHookWaitedRun, when set by a test, runs each time a Wait runs a
// job's request itself.
var testHookWaitedRun atomic.Pointer[func()]

// runWaited runs the job for a Wait that found it queued, when it can run
// here (see above), until it ends or the Wait's bound comes; the Wait then
// waits for the job as for any other (at once, if it has ended).
func (q *queuedRun) runWaited(ctx context.Context) {
	t, job := q.t, q.job
	if q.barrier != nil || ctx.Err() != nil || t.pool.Size() < 2 || !t.jobs.alone(job) {
		return
	}
	s, ok := q.tr.(starter)
	if !ok {
		return
	}
	if h := testHookWaitClaims.Load(); h != nil {
		(*h)(job)
	}
	if !q.claimed.CompareAndSwap(false, true) {
		return // a transfer goroutine runs it: nothing of it is read here
	}
	defer func() {
		// As on a transfer goroutine: a panic fails what has no outcome,
		// and does not reach the caller.
		if v := recover(); v != nil {
			q.panicked(v)
		}
	}()
	// Claimed: the items are this goroutine's to read (a transfer
	// goroutine that ran the job would have given them back).
	mv := s.start(job.kind, q.items)
	if mv == nil {
		// No idle transfer connection: the transfer goroutines' way, the
		// job still queued (Close withdraws it if it never runs).
		if t.pool.Go(q.run) != nil {
			job.failQueued(ErrClosed)
		}
		return
	}
	deadline, ok := job.begin(t.timeout, false)
	if !ok {
		mv.abort()
		q.release()
		return // ended while queued
	}
	if h := testHookWaitedRun.Load(); h != nil {
		(*h)()
	}
	job.setPause(mv.Pause)
	stop := context.AfterFunc(ctx, mv.Pause)
	done := mv.Run(true)
	stop()
	job.setPause(nil)
	if done {
		r := mv.results()
		if r.failure() == nil && (job.kind == kindLoad || !r.refused()) {
			if t.moveAndSettle(job, q.tr, q.items, deadline, &r) {
				q.release()
			}
			return
		}
		// A retry of refused stores, with its pauses, or a failure to
		// look into: not on the Wait's goroutine.
		q.handOn(func() bool { return t.moveAndSettle(job, q.tr, q.items, deadline, &r) })
		return
	}
	q.handOn(func() bool {
		mv.Run(false)
		r := mv.results()
		return t.moveAndSettle(job, q.tr, q.items, deadline, &r)
	})
}

// handOn runs the rest of a job a Wait began on a goroutine of its own:
// not a transfer goroutine, whose queue Close drops, since the job's
// request may be in flight and must be seen to its end.
func (q *queuedRun) handOn(rest func() (done bool)) {
	go func() {
		defer func() {
			if v := recover(); v != nil {
				q.panicked(v)
			}
		}()
		if rest() {
			q.release()
		}
	}()
}

// panicked fails what a job a Wait ran has no outcome for, after a panic
// in its run, as a transfer goroutine's panic handler and moveAndSettle
// do.
func (q *queuedRun) panicked(v any) {
	q.t.log.Error("UMBP standalone transfer panicked; its job failed", "endpoint", q.t.address, "err", v)
	q.job.failRest(errInternal)
}

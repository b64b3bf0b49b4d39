package umbp

import (
	"context"
	"sync/atomic"

	"github.com/umbp-go/umbp-go/internal/conn"
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
// stores, a request sent again — goes on on a transfer goroutine, and the
// Wait waits for it as for any job.

// testHookWaitClaims, when set by a test, runs as a Wait is about to
// claim a job.
var testHookWaitClaims atomic.Pointer[func(*TransferJob)]

// testHookWaitedRun, when set by a test, runs each time a Wait runs a
// job's request itself.
var testHookWaitedRun atomic.Pointer[func()]

// queuedRun is a job handed to the transfer goroutines, with what running
// it needs; claim says who runs it.
type queuedRun struct {
	t       *jobRunner
	job     *TransferJob
	tr      transport
	items   []item
	slab    []conn.Range
	barrier *streamEvent
	claimed atomic.Bool
}

// testHookPoolClaim, when set by a test, runs on a transfer goroutine
// before it claims a job (an atomic: transfer goroutines wake when they
// will, tests or not).
var testHookPoolClaim atomic.Pointer[func(*TransferJob)]

// onPool is the run on a transfer goroutine.
func (q *queuedRun) onPool() {
	if h := testHookPoolClaim.Load(); h != nil {
		(*h)(q.job)
	}
	if q.claimed.CompareAndSwap(false, true) {
		q.run()
	}
}

// run runs the claimed job, from its start.
func (q *queuedRun) run() {
	if q.t.run(q.job, q.tr, q.items, q.barrier) {
		q.release()
	}
}

// release takes back the job's items and ranges once nothing reads them.
func (q *queuedRun) release() {
	rangeSlabs.Put(q.slab)                    // no item is used any more
	itemSlabs.Put(q.items[:len(q.job.plans)]) // every item it may have written
}

// runWaited runs the job for a Wait that found it queued, when it can run
// here (see above). It reports whether the job has ended; when it has
// not, it runs on a transfer goroutine (or one has claimed it), and Wait
// waits for it.
func (q *queuedRun) runWaited(ctx context.Context) (ended bool) {
	t, job := q.t, q.job
	if q.barrier != nil || ctx.Err() != nil || t.pool.Size() < 2 || !t.jobs.alone(job) {
		return false
	}
	s, ok := q.tr.(starter)
	if !ok {
		return false
	}
	if h := testHookWaitClaims.Load(); h != nil {
		(*h)(job)
	}
	if !q.claimed.CompareAndSwap(false, true) {
		return false // a transfer goroutine runs it: nothing of it is read here
	}
	// Claimed: the items are this goroutine's to read (a transfer
	// goroutine that ran the job would have given them back).
	mv := s.start(job.kind, q.items)
	if mv == nil {
		// No idle transfer connection: the transfer goroutines' way, the
		// job still queued (Close withdraws it if it never runs).
		if t.pool.Go(q.run) != nil {
			job.failQueued(ErrClosed)
		}
		return false
	}
	deadline, ok := job.begin(t.timeout, false)
	if !ok {
		mv.Abort()
		q.release()
		return true // ended while queued
	}
	if h := testHookWaitedRun.Load(); h != nil {
		(*h)()
	}
	defer func() {
		// As on a transfer goroutine: a panic fails what has no outcome,
		// and does not reach the caller.
		if v := recover(); v != nil {
			t.log.Error("UMBP standalone transfer panicked in Wait; its job failed", "endpoint", t.address, "err", v)
			job.failRest(errInternal)
			ended = true
		}
	}()
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
			return job.ended()
		}
		// A retry of refused stores, with its pauses, or a failure to
		// look into: not on the Wait's goroutine.
		q.handOn(func() bool { return t.moveAndSettle(job, q.tr, q.items, deadline, &r) })
		return false
	}
	q.handOn(func() bool {
		mv.Run(false)
		r := mv.results()
		return t.moveAndSettle(job, q.tr, q.items, deadline, &r)
	})
	return false
}

// handOn runs the rest of a job a Wait began on a goroutine of its own:
// not a transfer goroutine, whose queue Close drops, since the job's
// request may be in flight and must be seen to its end.
func (q *queuedRun) handOn(rest func() (done bool)) {
	go func() {
		if rest() {
			q.release()
		}
	}()
}

// oneRequest is the move of a job's items as one lock-step request, item
// k its entry k, with the arrays it was begun from (the request is sent
// again from them if it cannot go lock-step after all).
type oneRequest struct {
	*conn.Transfer
	keys []string
	segs []conn.Segment
}

// startSegments begins the move of single-range items as one BatchPut or
// BatchGet.
func startSegments(c *conn.Conn, kind jobKind, items []item) *oneRequest {
	keys := keySlabs.Get(len(items))
	segs := segmentSlabs.Get(len(items))
	for k := range items {
		rg := items[k].obj.Ranges[0]
		keys[k] = items[k].obj.Key
		segs[k] = conn.Segment{RegionBase: rg.RegionBase, Offset: rg.Offset, Size: rg.Size}
	}
	tr := c.StartBatch(kind == kindStore, keys, segs)
	if tr == nil {
		keySlabs.Put(keys)
		segmentSlabs.Put(segs)
		return nil
	}
	return &oneRequest{Transfer: tr, keys: keys, segs: segs}
}

// results is the ended request's answer, item by item.
func (m *oneRequest) results() results {
	ok, errs := m.Result()
	if m.keys != nil {
		keySlabs.Put(m.keys)
		segmentSlabs.Put(m.segs)
		m.keys, m.segs = nil, nil
	}
	return results{ok: ok, errs: errs}
}

// refused reports whether the server answered false for an item.
func (r *results) refused() bool {
	for _, ok := range r.ok {
		if !ok {
			return true
		}
	}
	return false
}

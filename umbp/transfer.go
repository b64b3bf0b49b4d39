package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/daemonpool"
	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/loglimit"
	"github.com/umbp-go/umbp-go/internal/rpc"
)

// jobRunner runs a worker handle's jobs, from submission to every key's
// outcome, on the link's current connection: the transfer goroutines, the
// transport of the current connection (made once for it), the jobs in
// flight (jobSet) and the staging pool. It holds no handle.
type jobRunner struct {
	link    *link
	regions *regionSet
	staging *stagingPool
	pool    *daemonpool.Pool
	jobs    *jobSet
	stats   *transferCounters
	timeout time.Duration
	address string
	log     *slog.Logger

	refusals loglimit.Limiter
	failures loglimit.Limiter

	mu     sync.Mutex // orders submissions with a connection's replacement, and with close
	tr     transport  // the current connection's
	closed bool
}

func newJobRunner(cfg settings, l *link, regions *regionSet, staging *stagingPool, stats *transferCounters) (*jobRunner, error) {
	t := &jobRunner{
		link: l, regions: regions, staging: staging, stats: stats,
		jobs: newJobSet(stats), timeout: cfg.Timeout, address: cfg.Endpoint, log: cfg.Logger,
	}
	pool, err := daemonpool.New(cfg.NumWorkers, "umbp-transfer", func(err error) {
		t.log.Error("UMBP standalone transfer goroutine panicked; its job failed", "endpoint", t.address, "err", err)
	})
	if err != nil {
		return nil, err
	}
	t.pool = pool
	return t, nil
}

// submit builds a job of plans, fails what cannot run, and queues the
// rest. bad, when not nil, holds the planning error of each plan that could
// not be planned (nil for the others). planned says the layout planner made
// the plans: they are valid by construction, and are not validated again.
func (t *jobRunner) submit(kind jobKind, plans []BlockTransferPlan, opts []TransferOption, bad []error, planned bool) *TransferJob {
	var o transferOptions
	for _, opt := range opts {
		opt(&o)
	}
	job := newJob(kind, plans, t.jobs, t.address)
	for i, err := range bad {
		if err != nil {
			job.setOutcome(i, notAttempted(err))
		}
	}
	if len(plans) == 0 {
		job.failRest(nil) // nothing to move: COMPLETED
		return job
	}
	if job.ended() { // every plan failed already
		return job
	}
	// Cheap refusals first, without the lock.
	if t.isClosed() {
		job.failRest(notAttempted(ErrClosed))
		return job
	}
	if _, err := t.link.current(); err != nil {
		job.failRest(notAttempted(err))
		return job
	}
	if n := t.jobs.blocked.Load(); n > 0 {
		t.refuseBlocked(job, n)
		return job
	}
	// The AfterStream event is recorded before the lock: a driver call
	// must not hold up the handle.
	barrier, err := recordStream(o, t.log)
	if err != nil {
		job.failRest(notAttempted(err))
		return job
	}
	var drop func()
	if barrier != nil {
		drop = barrier.release
	}
	refuse := func(err error) *TransferJob {
		if drop != nil {
			drop()
		}
		job.failRest(notAttempted(err))
		return job
	}
	// The connection is read, and the job queued, under the lock: a
	// connection being replaced then either gets this job counted among its
	// users or is not the one it uses.
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return refuse(ErrClosed)
	}
	c, err := t.link.current()
	if err != nil {
		return refuse(err)
	}
	if t.tr == nil || t.tr.conn() != c {
		t.tr = newTransport(c, t.staging)
	}
	tr := t.tr
	items, slab := t.resolve(job, bad, tr.ranged(), planned)
	if len(items) == 0 {
		if drop != nil {
			drop()
		}
		return job // every plan failed already
	}
	q := &queuedRun{t: t, job: job, tr: tr, items: items, slab: slab, barrier: barrier}
	job.queued = q
	job.submit(c, drop)
	t.jobs.add(job) // before it can run, and so before it can end
	if err := t.pool.Go(q.onPool); err != nil {
		job.failQueued(ErrClosed)
	}
	return job
}

// refuseBlocked refuses a job while n transfers are blocked.
func (t *jobRunner) refuseBlocked(job *TransferJob, n int64) {
	job.failRest(notAttempted(errBlocked))
	if t.refusals.Allow(failureLogInterval) {
		t.log.Warn("UMBP standalone transfers are refused while timed-out transfers are still blocked in the server",
			"endpoint", t.address, "blocked", n)
	}
}

// resolve checks each plan, once, and maps its ranges into registered
// regions, under the regions' lock. Each range must lie within memory the
// caller registered on this handle (regionSet.findLocked: the one rule, for
// every transport; the handle's own staging memory is never such memory).
// A plan that failed in planning (bad[i] not nil) is skipped, one that
// fails here gets its outcome now; the rest are returned as items,
// whose ranges lie in one slab taken from rangeSlabs. A plan the layout
// planner made is valid by construction but is resolved all the same; the
// connection sends the items as they are, without checking them again.
func (t *jobRunner) resolve(job *TransferJob, bad []error, ranged, planned bool) ([]item, []conn.Range) {
	t.regions.mu.Lock()
	defer t.regions.mu.Unlock()
	items := itemSlabs.Get(len(job.plans))[:0]
	n := 0
	for i := range job.plans {
		n += len(job.plans[i].Ranges)
	}
	all := rangeSlabs.Get(n)
	slab := all
	job.sizes = make([]uint64, len(job.plans)) // the job runs on no other goroutine yet
	var last *memRegion
	for i := range job.plans {
		p := &job.plans[i]
		if bad != nil && bad[i] != nil {
			continue
		}
		if !planned {
			if err := p.validate(); err != nil {
				job.setOutcome(i, notAttempted(err))
				continue
			}
		}
		// The item is written in place; one refused is taken back.
		nr := len(p.Ranges)
		items = append(items, item{idx: i})
		it := &items[len(items)-1]
		obj := &it.obj
		*obj = conn.Object{Key: p.Key, Size: p.ObjectSize(), Ranges: slab[:nr:nr]}
		job.sizes[i] = obj.Size
		slab = slab[nr:]
		var refused error
		host := true
		for k, r := range p.Ranges {
			reg := last // a plan's ranges mostly lie in the region of the one before
			if reg == nil || !reg.contains(r.BaseAddress, r.Length) {
				reg = t.regions.findLocked(r.BaseAddress, r.Length)
				last = reg
			}
			if reg == nil {
				refused = fmt.Errorf("%w: key %q range %d (%d bytes at %#x, layer %q) is outside registered memory: it %s",
					ErrInvalidPlan, p.Key, k, r.Length, r.BaseAddress, r.LayerName, t.regions.outsideLocked(r.BaseAddress, r.Length))
				break
			}
			host = host && reg.loc == LocationHost
			obj.Ranges[k] = conn.Range{
				RegionBase:   uint64(reg.base),
				Offset:       uint64(r.BaseAddress - reg.base),
				Size:         r.Length,
				ObjectOffset: r.ObjectOffset,
			}
		}
		if refused == nil {
			obj.Ranges = coalesce(obj.Ranges)
		}
		single := len(obj.Ranges) == 1
		if refused == nil && !ranged && !single && !host {
			refused = fmt.Errorf("key %q: %d ranges in GPU memory need a server with ranged I/O: %w", p.Key, len(p.Ranges), ErrNotSupported)
		}
		if refused != nil {
			items = items[:len(items)-1]
			job.setOutcome(i, notAttempted(refused))
			continue
		}
		it.single, it.host = single, host
	}
	return items, all
}

// run performs the job's transfer on a transfer goroutine. Its RPCs carry
// no deadline: the server uses the buffers until it answers. When a request
// is in doubt (inDoubt), the job is detached and settled only once the
// server process is known to be gone. It reports whether it is done with
// items (false while a detached job still holds them).
func (t *jobRunner) run(job *TransferJob, tr transport, items []item, barrier *streamEvent) (done bool) {
	deadline, ok := job.begin(t.timeout, barrier != nil)
	if !ok {
		return true // ended while queued; its drop released the barrier
	}
	if barrier != nil {
		err := barrier.wait(deadline)
		barrier.release()
		if err == nil {
			err = job.streamReady()
		}
		if err != nil {
			job.failRest(notAttempted(fmt.Errorf("waiting for the engine's stream: %w", err)))
			return true
		}
	}
	return t.moveAndSettle(job, tr, items, deadline, nil)
}

// moveAndSettle moves a started job's items, unless one is given the
// results of the move already made (moved), and settles the job with
// them, retrying refused stores while the deadline allows. It reports
// whether it is done with items (false while a detached job still holds
// them).
func (t *jobRunner) moveAndSettle(job *TransferJob, tr transport, items []item, deadline time.Time, moved *results) (done bool) {
	detached := false
	defer func() {
		if !detached { // a panic included: nothing of the job's is in flight then
			job.failRest(errInternal)
		}
	}()
	ctx := context.Background()
	var r results
	if moved != nil {
		r = *moved
	} else {
		r = tr.move(ctx, job.kind, items)
	}
	t.reportFailure(job.kind, r.failure())
	var lost error // a store retry's request in doubt
	if !r.inDoubt() && job.kind == kindStore {
		lost = t.retryStores(ctx, tr, items, &r, deadline)
		t.reportFailure(job.kind, lost)
	}
	// A store ends with its BatchPut's reply, without a Flush: the server
	// has copied the bytes into its pool by then, and what it copies on to
	// a lower tier it reads from the pool, not from the engine's memory.
	settle := func() {
		job.setOutcomes(len(items), func(k int) (int, error) {
			return items[k].idx, keyError(job.kind, &items[k].obj, r.ok[k], r.err(k), lost)
		})
	}
	if lost == nil && !r.inDoubt() {
		settle()
		return true
	}
	// The transport failed, not necessarily the server: one that lives on
	// may still be copying. The job keeps its buffers until that process
	// has exited; the transfer goroutine goes back to the pool meanwhile.
	detached = true
	job.detach()
	c := tr.conn()
	go func() {
		if err := c.WaitPeersGone(context.Background()); err != nil {
			// Nothing can prove that server gone: the job stays running
			// and its buffers in use, for good.
			t.log.Error("UMBP standalone transfer lost with a server that cannot be watched; its buffers stay in use",
				"endpoint", t.address, "kind", job.kind.String(), "keys", len(job.plans), "err", err)
			return
		}
		settle()
	}()
	return false
}

// reportFailure logs a transfer's failure (at most every
// failureLogInterval) and lets the link look at its server.
func (t *jobRunner) reportFailure(kind jobKind, err error) {
	if err == nil {
		return
	}
	if t.failures.Allow(failureLogInterval) {
		t.log.Warn("UMBP standalone transfer failed; its keys fail", "op", kind.String(), "endpoint", t.address, "err", err)
	}
	t.link.failed(err)
}

// errInternal fails what a transfer left without an outcome (a panic).
var errInternal = fmt.Errorf("%w: internal error in the transfer", ErrUnavailable)

// keyError is the outcome of one item: nil when ok; else the error of the
// request that carried it, or lost (a retry in doubt), or a miss (load) or
// refusal (store) when the server answered false.
func keyError(kind jobKind, obj *conn.Object, ok bool, reqErr, lost error) error {
	switch {
	case ok:
		return nil
	case reqErr != nil:
		if errors.Is(reqErr, rpc.ErrNotSent) {
			return notAttempted(reqErr)
		}
		if !isKeySentinel(reqErr) {
			// A reply the handle cannot use (a gRPC code it does not
			// classify, results of the wrong length): the key was sent,
			// and its memory may have been used, as when the transport
			// fails.
			return fmt.Errorf("%w: %w", ErrUnavailable, reqErr)
		}
		return reqErr
	case lost != nil:
		return lost
	case kind == kindLoad:
		return &keyFault{cause: ErrNotInPool, key: obj.Key, size: obj.Size}
	}
	return &keyFault{cause: ErrRefused, key: obj.Key, size: obj.Size}
}

// retryStores retries each refused key on its own, after a Flush and a
// pause (storeRetryBackoff), while the deadline allows; each retried key's
// answer becomes its retry's. It stops at the first retry in doubt and
// returns that error: the server may still be reading the key's memory.
func (t *jobRunner) retryStores(ctx context.Context, tr transport, items []item, r *results, deadline time.Time) error {
	for _, pause := range storeRetryBackoff {
		if time.Until(deadline) < pause { // no retry may make the job late
			return nil
		}
		var failed []int
		for k, ok := range r.ok {
			if !ok {
				failed = append(failed, k)
			}
		}
		if len(failed) == 0 {
			return nil
		}
		if err := tr.flush(ctx); errors.Is(err, errdefs.ErrUnavailable) {
			return nil // a Flush names no memory
		}
		time.Sleep(pause)
		for _, k := range failed {
			got := tr.move(ctx, kindStore, items[k:k+1])
			r.set(k, got.ok[0], got.err(0))
			if got.inDoubt() {
				return got.err(0)
			}
		}
	}
	return nil
}

// leave takes the jobs off old, the connection being replaced, and returns
// them: a job still queued there fails as not attempted; one already
// running is detached: its buffers stay in use until it ends, but it holds
// nothing up on the new server.
func (t *jobRunner) leave(old *conn.Conn) []*TransferJob {
	// Under t.mu: a submit that read the old connection has queued its job
	// by now, and a later one reads the new connection.
	t.mu.Lock()
	on := t.jobs.on(old)
	t.mu.Unlock()
	for _, j := range on {
		if !j.failQueued(errReconnecting) {
			j.detach()
		}
	}
	return on
}

func (t *jobRunner) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// close refuses submissions from now on, stops the transfer goroutines
// (queued jobs stay queued until withdrawn), and reports whether this was
// the first close.
func (t *jobRunner) close() bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	t.closed = true
	t.mu.Unlock()
	return true
}

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

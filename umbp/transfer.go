package umbp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// TransferOption adjusts one transfer: a store or a load.
type TransferOption func(*transferOptions)

type transferOptions struct {
	stream *streamDep // AfterStream
}

// submit builds a job, fails what cannot run, and queues the rest. bad,
// when not nil, holds the planning error of each plan that could not be
// planned (nil for the others). planned says the layout planner made the
// plans: they are valid by construction, and are not validated again.
func (w *WorkerHandle) submit(kind jobKind, plans []BlockTransferPlan, opts []TransferOption, bad []error, planned bool) *TransferJob {
	var o transferOptions
	for _, opt := range opts {
		opt(&o)
	}
	job := newJob(kind, plans, w.jobs, w.address)
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
	if w.isClosed() {
		job.failRest(notAttempted(ErrClosed))
		return job
	}
	if _, err := w.link.current(); err != nil {
		job.failRest(notAttempted(err))
		return job
	}
	if n := w.jobs.blocked.Load(); n > 0 {
		w.refuseBlocked(job, n)
		return job
	}
	// The AfterStream event is recorded before the lock: a driver call
	// must not hold up the handle.
	barrier, err := w.streamBarrier(o)
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
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return refuse(ErrClosed)
	}
	c, err := w.link.current()
	if err != nil {
		return refuse(err)
	}
	tr := w.transport(c)
	items, slab := w.resolvePlans(job, tr.ranged(), planned)
	if len(items) == 0 {
		if drop != nil {
			drop()
		}
		return job // every plan failed already
	}
	job.submit(c, drop)
	w.jobs.add(job) // before it can run, and so before it can end
	if err := w.pool.Go(func() {
		if w.run(job, tr, items, barrier) {
			rangeSlabs.Put(slab) // no item is used any more
		}
	}); err != nil {
		job.failQueued(ErrClosed)
	}
	return job
}

// refuseBlocked refuses a job while n transfers are blocked.
func (w *WorkerHandle) refuseBlocked(job *TransferJob, n int64) {
	job.failRest(notAttempted(errBlocked))
	if w.refusals.allow() {
		w.log.Warn("UMBP standalone transfers are refused while timed-out transfers are still blocked in the server",
			"endpoint", w.address, "blocked", n)
	}
}

// resolvePlans validates each plan and maps its ranges into registered
// regions, under the regions' lock. Plans that fail get their outcome now;
// the rest are returned. Every item's ranges lie in one slab, taken from
// rangeSlabs.
func (w *WorkerHandle) resolvePlans(job *TransferJob, ranged, planned bool) ([]item, []conn.Range) {
	w.regions.mu.Lock()
	defer w.regions.mu.Unlock()
	items := make([]item, 0, len(job.plans))
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
		if job.hasOutcome(i) { // failed in planning
			continue
		}
		if !planned {
			if err := p.validate(); err != nil {
				job.setOutcome(i, notAttempted(err))
				continue
			}
		}
		nr := len(p.Ranges)
		obj := conn.Object{Key: p.Key, Size: p.ObjectSize(), Ranges: slab[:nr:nr]}
		job.sizes[i] = obj.Size
		slab = slab[nr:]
		var bad error
		host := true
		for k, r := range p.Ranges {
			reg := last // a plan's ranges mostly lie in the region of the one before
			if reg == nil || !reg.contains(r.BaseAddress, r.Length) {
				reg = w.regions.findLocked(r.BaseAddress, r.Length)
				last = reg
			}
			if reg == nil {
				bad = fmt.Errorf("%w: key %q range %d (%d bytes at %#x, layer %q) lies outside registered memory",
					ErrInvalidPlan, p.Key, k, r.Length, r.BaseAddress, r.LayerName)
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
		if bad == nil {
			obj.Ranges = coalesce(obj.Ranges)
		}
		single := len(obj.Ranges) == 1
		if bad == nil && !ranged && !single && !host {
			bad = fmt.Errorf("key %q: %d ranges in GPU memory need a server with ranged I/O: %w", p.Key, len(p.Ranges), ErrNotSupported)
		}
		if bad != nil {
			job.setOutcome(i, notAttempted(bad))
			continue
		}
		items = append(items, item{idx: i, obj: obj, single: single, host: host})
	}
	return items, all
}

// run performs the job's transfer on a transfer goroutine. Its RPCs carry
// no deadline: the server uses the buffers until it answers. When the
// transport fails under an RPC, the job is detached and settled only once
// the server process is known to be gone. It reports whether it is done
// with items (false while a detached job still holds them).
func (w *WorkerHandle) run(job *TransferJob, tr transport, items []item, barrier *streamEvent) (done bool) {
	deadline, ok := job.begin(w.timeout, barrier != nil)
	if !ok {
		return true // ended while queued; its drop released the barrier
	}
	detached := false
	defer func() {
		if !detached { // a panic included: nothing of the job's is in flight then
			job.failRest(errInternal)
		}
	}()
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
	ctx := context.Background()
	results, errs := tr.move(ctx, job.kind, items)
	err := conn.Joined(errs)
	if err != nil {
		w.logFailure(job.kind.String(), err)
		w.link.failed(err)
	}
	doubt := slices.ContainsFunc(errs, inDoubt)
	var lost error // a store retry's transport failure
	if !doubt && job.kind == kindStore {
		lost = w.retryStores(ctx, tr, items, results, &errs, deadline)
		if lost != nil {
			w.logFailure(job.kind.String(), lost)
			w.link.failed(lost)
		}
	}
	// A store ends with its BatchPut's reply, without a Flush: the server
	// has copied the bytes into its pool by then, and what it copies on to
	// a lower tier it reads from the pool, not from the engine's memory.
	settle := func() {
		job.setOutcomes(len(items), func(k int) (int, error) {
			var reqErr error
			if errs != nil {
				reqErr = errs[k]
			}
			return items[k].idx, keyError(job.kind, &items[k].obj, results[k], reqErr, lost)
		})
	}
	if lost == nil && !doubt {
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
			w.log.Error("UMBP standalone transfer lost with a server that cannot be watched; its buffers stay in use",
				"endpoint", w.address, "kind", job.kind.String(), "keys", len(job.plans), "err", err)
			return
		}
		settle()
	}()
	return false
}

// inDoubt reports whether a key's request may have reached the server and
// used its memory although no answer says what became of it: its
// transport failed under it, or was cut off. A key failed as not attempted
// (no staging buffer, say) sent nothing, whatever the reason says.
func inDoubt(err error) bool {
	return errors.Is(err, conn.ErrUnavailable) && !errors.Is(err, ErrNotAttempted)
}

// errInternal fails what a transfer left without an outcome (a panic).
var errInternal = fmt.Errorf("%w: internal error in the transfer", ErrUnavailable)

// keyError is the outcome of one item: nil when ok; else the error of the
// request that carried it, or lost (a retry whose transport failed), or a
// miss (load) or refusal (store) when the server answered false.
func keyError(kind jobKind, obj *conn.Object, ok bool, reqErr, lost error) error {
	switch {
	case ok:
		return nil
	case reqErr != nil:
		if errors.Is(reqErr, conn.ErrNotSent) {
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
		return fmt.Errorf("%w: key %q (%d bytes; or stored with another size)", ErrNotInPool, obj.Key, obj.Size)
	}
	return fmt.Errorf("%w: store of key %q (%d bytes): the pool could not take it (full, or smaller than the object)", ErrRefused, obj.Key, obj.Size)
}

// retryStores retries each refused key on its own, after a Flush and a
// pause (storeRetryBackoff), while the deadline allows; each retried key's
// result and error (*errs, made on first use) become its retry's. It stops
// at the first retry whose request is in doubt and returns that error: the
// server may still be reading the key's memory.
func (w *WorkerHandle) retryStores(ctx context.Context, tr transport, items []item, results []bool, errs *[]error, deadline time.Time) error {
	for _, pause := range storeRetryBackoff {
		if time.Until(deadline) < pause { // no retry may make the job late
			return nil
		}
		var failed []int
		for k, ok := range results {
			if !ok {
				failed = append(failed, k)
			}
		}
		if len(failed) == 0 {
			return nil
		}
		if err := tr.flush(ctx); errors.Is(err, conn.ErrUnavailable) {
			return nil // a Flush names no memory
		}
		time.Sleep(pause)
		for _, k := range failed {
			got, gotErrs := tr.move(ctx, kindStore, items[k:k+1])
			var e error
			if gotErrs != nil {
				e = gotErrs[0]
			}
			if e != nil || *errs != nil {
				setErr(errs, len(items), k, e) // the key's last request's
			}
			results[k] = e == nil && got[0]
			if inDoubt(e) {
				return e
			}
		}
	}
	return nil
}

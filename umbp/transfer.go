package umbp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// TransferOption adjusts one store.
type TransferOption func(*transferOptions)

type transferOptions struct {
	stream *streamDep // AfterStream
}

// storeRetryBackoff is the pause before each retry of the keys a store could
// not place: the server may be evicting to make room.
var storeRetryBackoff = []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}

const (
	refusedBlocked = TransferNotAttempted + ": an earlier UMBP standalone transfer is still blocked"
	refusedClosed  = TransferNotAttempted + ": the worker handle is closed"
)

// item is one plan of a job, resolved against registered memory.
type item struct {
	idx    int // plan index in the job
	obj    conn.Object
	single bool // one range: a plain segment on a server without ranged I/O
}

// submit builds a job, fails what cannot run, and queues the rest.
func (w *WorkerHandle) submit(kind jobKind, plans []BlockTransferPlan, opts []TransferOption) *TransferJob {
	var o transferOptions
	for _, opt := range opts {
		opt(&o)
	}
	job := newJob(kind, plans)
	job.start()
	if len(plans) == 0 {
		job.failRest("") // nothing to move: COMPLETED
		return job
	}
	// Cheap refusals first, without the lock.
	if w.isClosed() {
		w.refuse(job, refusedClosed)
		return job
	}
	if _, err := w.link.current(); err != nil {
		w.refuse(job, TransferNotAttempted+": "+err.Error())
		return job
	}
	if n := w.blockedCount(); n > 0 {
		w.refuseBlocked(job, n)
		return job
	}
	// The AfterStream event is recorded before the lock: a driver call
	// must not hold up the handle.
	barrier, err := w.streamBarrier(o)
	if err != nil {
		w.refuse(job, TransferNotAttempted+": "+err.Error())
		return job
	}
	var dropped func()
	if barrier != nil {
		dropped = barrier.release
	}
	refuse := func(reason string) *TransferJob {
		if dropped != nil {
			dropped()
		}
		w.refuse(job, reason)
		return job
	}
	// The connection is read, and the job queued, under the lock: a
	// connection being replaced then either gets this job counted among its
	// users or is not the one it uses.
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return refuse(refusedClosed)
	}
	c, err := w.link.current()
	if err != nil {
		return refuse(TransferNotAttempted + ": " + err.Error())
	}
	ranged := c.Capabilities().RangedIO
	items := w.resolvePlansLocked(job, ranged)
	if len(items) == 0 {
		if dropped != nil {
			dropped()
		}
		w.stats.refused.Add(1) // every plan failed already
		return job
	}
	job.mu.Lock()
	job.conn = c
	job.dropped = dropped
	job.mu.Unlock()
	f, err := w.pool.Submit(func() (any, error) {
		detached := false
		defer func() {
			if !detached {
				w.finish(job, items)
			}
		}()
		deadline := job.markRunning(w.timeout)
		job.mu.Lock()
		job.dropped = nil // it runs: the barrier is its own
		job.mu.Unlock()
		if barrier != nil {
			job.setWaitingForStream(true)
			err := barrier.wait(deadline)
			job.setWaitingForStream(false)
			barrier.release()
			if err != nil {
				job.failRest(TransferNotAttempted + ": waiting for the engine's stream: " + err.Error())
				return nil, nil
			}
		}
		if settle := w.run(job, c, items, ranged); settle != nil {
			// The transport failed, not necessarily the server: one that
			// lives on may still be copying. The job keeps its buffers
			// until that process has exited; the transfer goroutine goes
			// back to the pool meanwhile.
			detached = true
			go func() {
				if err := c.WaitPeersGone(context.Background()); err != nil {
					// Nothing can prove that server gone: the job stays
					// running and its buffers in use, for good.
					w.log.Error("UMBP standalone transfer lost with a server that cannot be watched; its buffers stay in use",
						"endpoint", w.address, "kind", job.kind.String(), "keys", len(job.plans), "err", err)
					return
				}
				defer w.finish(job, items)
				settle()
			}()
		}
		return nil, nil
	})
	if err != nil {
		return refuse(refusedClosed)
	}
	w.stats.submitted.Add(1)
	job.mu.Lock()
	job.future = f
	job.mu.Unlock()
	w.inflight[job] = struct{}{}
	return job
}

// finish ends a job whose transfer is over, whatever happened (a panic
// included: nothing of the job's is in flight then), and counts it.
func (w *WorkerHandle) finish(job *TransferJob, items []item) {
	if !job.ended() {
		job.failRest("internal error in the UMBP transfer")
	}
	w.account(job, items)
	w.forget(job)
}

// refuseBlocked refuses a job while n transfers are blocked.
func (w *WorkerHandle) refuseBlocked(job *TransferJob, n int) {
	w.refuse(job, refusedBlocked)
	if w.refusals.allow() {
		w.log.Warn("UMBP standalone transfers are refused while timed-out transfers are still blocked in the server",
			"endpoint", w.address, "blocked", n)
	}
}

// refuse fails every key of a job that was not submitted.
func (w *WorkerHandle) refuse(job *TransferJob, reason string) {
	job.failRest(reason)
	w.stats.refused.Add(1)
}

// account counts a finished transfer.
func (w *WorkerHandle) account(job *TransferJob, items []item) {
	switch job.Status() {
	case JobCompleted:
		w.stats.completed.Add(1)
	default:
		w.stats.failed.Add(1)
	}
	var n uint64
	job.mu.Lock()
	for _, it := range items {
		if o := job.outcomes[it.idx]; o.done && o.err == "" {
			n += it.obj.Size
		}
	}
	job.mu.Unlock()
	if job.kind == kindStore {
		w.stats.bytesStored.Add(n)
	} else {
		w.stats.bytesLoaded.Add(n)
	}
}

// resolvePlansLocked validates each plan and maps its ranges into registered
// regions. Plans that fail get their outcome now; the rest are returned.
// w.mu is held.
func (w *WorkerHandle) resolvePlansLocked(job *TransferJob, ranged bool) []item {
	items := make([]item, 0, len(job.plans))
	for i := range job.plans {
		p := &job.plans[i]
		if err := p.Validate(); err != nil {
			job.setOutcome(i, TransferNotAttempted+": "+err.Error())
			continue
		}
		obj := conn.Object{Key: p.Key, Size: p.ObjectSize(), Ranges: make([]conn.Range, len(p.Ranges))}
		bad := ""
		host := true
		for k, r := range p.Ranges {
			reg := w.resolveLocked(r.BaseAddress, r.Length)
			if reg == nil {
				bad = fmt.Sprintf("%s: key %q range %d (%d bytes at %#x, layer %q) lies outside registered memory",
					TransferNotAttempted, p.Key, k, r.Length, r.BaseAddress, r.LayerName)
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
		if bad == "" {
			obj.Ranges = coalesce(obj.Ranges)
		}
		single := len(obj.Ranges) == 1
		if bad == "" && !ranged && !single && !host {
			bad = fmt.Sprintf("%s: key %q: %d ranges in GPU memory need a server with ranged I/O (%v)", TransferNotAttempted, p.Key, len(p.Ranges), ErrNotSupported)
		}
		if bad != "" {
			job.setOutcome(i, bad)
			continue
		}
		items = append(items, item{idx: i, obj: obj, single: single})
	}
	return items
}

// coalesce merges ranges that continue one another both in registered
// memory (same region, next offset) and in the object, so that a block laid
// out contiguously travels as one range however the plan splits it: the
// server makes fewer copies, and a block that becomes one range can move
// with plain BatchPut/BatchGet on a server without ranged I/O. rs is sorted
// by object offset in place; the result shares its array.
func coalesce(rs []conn.Range) []conn.Range {
	if len(rs) < 2 {
		return rs
	}
	byObjectOffset := func(a, b conn.Range) int { return cmp.Compare(a.ObjectOffset, b.ObjectOffset) }
	if !slices.IsSortedFunc(rs, byObjectOffset) {
		slices.SortFunc(rs, byObjectOffset)
	}
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if r.RegionBase == last.RegionBase && r.Offset == last.Offset+last.Size && r.ObjectOffset == last.ObjectOffset+last.Size {
			last.Size += r.Size
			continue
		}
		out = append(out, r)
	}
	return out
}

// run performs the job's transfer on a transfer goroutine. Its RPCs carry
// no deadline: the server uses the buffers until it answers. When the
// transport failed under an RPC, run returns what settles the job, to be
// called once the server process is known to be gone; otherwise nil.
func (w *WorkerHandle) run(job *TransferJob, c *conn.Conn, items []item, ranged bool) (settle func()) {
	ctx := context.Background()
	var results []bool
	var itemErrs []error // the fallback path's error of each item
	var err error
	if ranged {
		results, err = w.rangedBatch(ctx, c, job.kind, items)
	} else {
		results, itemErrs, err = w.fallbackBatch(ctx, c, job.kind, items)
	}
	if err != nil {
		w.logFailure(job.kind.String(), err)
		w.link.failed(err)
	}
	// keyErr is the error of item k: the error of the request (or the part
	// of a split batch) that carried it.
	keyErr := func(k int) string {
		var e error
		if ranged {
			e = conn.ErrFor(err, k)
		} else {
			e = itemErrs[k]
		}
		switch {
		case e == nil:
			return ""
		case errors.Is(e, conn.ErrInvalidArgument) || errors.Is(e, conn.ErrClosed):
			return TransferNotAttempted + ": " + e.Error() // refused before sending
		}
		return e.Error()
	}
	// outcomes sets every item's outcome; lost, when set, is the error of a
	// retry whose transport failed, for the items that are still failed.
	outcomes := func(lost error) {
		for k, it := range items {
			msg := ""
			if !results[k] {
				msg = keyErr(k)
				if msg == "" && lost != nil {
					msg = lost.Error()
				}
			}
			switch {
			case results[k]:
				job.setOutcome(it.idx, "")
			case msg != "":
				job.setOutcome(it.idx, msg)
			case job.kind == kindLoad:
				job.setOutcome(it.idx, fmt.Sprintf("key %q is not in the pool (or its size differs)", it.obj.Key))
			default:
				job.setOutcome(it.idx, fmt.Sprintf("server refused to store key %q", it.obj.Key))
			}
		}
	}
	if errors.Is(err, conn.ErrUnavailable) {
		return func() { outcomes(nil) }
	}
	if job.kind == kindStore {
		_, deadline := job.runState()
		if lost := w.retryStores(ctx, c, items, results, ranged, deadline); lost != nil {
			// As above: a server that lives on may still read the key.
			w.logFailure(job.kind.String(), lost)
			w.link.failed(lost)
			return func() { outcomes(lost) }
		}
		if ok, ferr := c.Flush(ctx); ferr != nil || !ok {
			msg := "final flush failed"
			if ferr != nil {
				msg += ": " + ferr.Error()
			}
			job.failRest(msg)
			return nil
		}
	}
	outcomes(nil)
	return nil
}

// retryStores retries each refused key on its own, after a Flush and a
// pause, twice. It stops at the first retry whose transport failed and
// returns that error: the server may still be reading the key's memory.
func (w *WorkerHandle) retryStores(ctx context.Context, c *conn.Conn, items []item, results []bool, ranged bool, deadline time.Time) error {
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
		if _, err := c.Flush(ctx); err != nil && errors.Is(err, conn.ErrUnavailable) {
			return nil // a Flush names no memory
		}
		time.Sleep(pause)
		for _, k := range failed {
			one := items[k : k+1]
			var got []bool
			var err error
			if ranged {
				got, err = w.rangedBatch(ctx, c, kindStore, one)
			} else {
				got, _, err = w.fallbackBatch(ctx, c, kindStore, one)
			}
			if errors.Is(err, conn.ErrUnavailable) {
				return err
			}
			if err == nil && len(got) == 1 && got[0] {
				results[k] = true
			}
		}
	}
	return nil
}

// A job's ranged transfer goes to the server in parts of about partRanges
// ranges or partBytes bytes, up to partsInFlight at a time, so that the
// server copies one part while the next is encoded, sent and prepared. On an
// H200 a job of 64 blocks of 128 layers of 32 KiB moved at about 23 GB/s in
// one request and 41 to 43 GB/s in parts.
const (
	partRanges    = 1024
	partBytes     = 32 << 20
	partsInFlight = 4
)

// part is the half-open range [lo, hi) of a job's items one request carries.
type part struct{ lo, hi int }

// cutParts cuts objs into consecutive parts of at least one object, each
// closed once it holds partRanges ranges or partBytes bytes.
func cutParts(objs []conn.Object) []part {
	var ps []part
	lo, ranges, bytes := 0, 0, uint64(0)
	for i, o := range objs {
		ranges += len(o.Ranges)
		bytes += o.Size
		if ranges >= partRanges || bytes >= partBytes {
			ps = append(ps, part{lo, i + 1})
			lo, ranges, bytes = i+1, 0, 0
		}
	}
	if lo < len(objs) {
		ps = append(ps, part{lo, len(objs)})
	}
	return ps
}

// rangedBatch moves every item in ranged RPCs, in parts run concurrently
// (each split further by the connection at the message limit). A failed
// part's items carry its error (conn.ErrFor). Parts are independent
// requests: a job that names one new key twice may have it stored once.
func (w *WorkerHandle) rangedBatch(ctx context.Context, c *conn.Conn, kind jobKind, items []item) ([]bool, error) {
	objs := make([]conn.Object, len(items))
	for k := range items {
		objs[k] = items[k].obj
	}
	call := c.BatchGetRanges
	if kind == kindStore {
		call = c.BatchPutRanges
	}
	ps := cutParts(objs)
	if len(ps) == 1 {
		return call(ctx, objs)
	}
	results := make([]bool, len(objs))
	errs := make([]error, len(ps))
	slots := make(chan struct{}, partsInFlight)
	var wg sync.WaitGroup
	for i, p := range ps {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			got, err := call(ctx, objs[p.lo:p.hi])
			copy(results[p.lo:p.hi], got)
			errs[i] = err
		})
	}
	wg.Wait()
	return results, partsError(ps, errs)
}

// partsError combines the errors of a job's parts (errs[i] is part ps[i]'s,
// itself perhaps split) into one whose conn.ErrFor gives each item its own
// part's error; nil when every part was answered.
func partsError(ps []part, errs []error) error {
	var failed []conn.SpanError
	for i, p := range ps {
		if errs[i] == nil {
			continue
		}
		var be *conn.BatchError
		if !errors.As(errs[i], &be) {
			failed = append(failed, conn.SpanError{Start: p.lo, End: p.hi, Err: errs[i]})
			continue
		}
		for _, s := range be.Spans {
			failed = append(failed, conn.SpanError{Start: p.lo + s.Start, End: p.lo + s.End, Err: s.Err})
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &conn.BatchError{Spans: failed}
}

// fallbackBatch moves items on a server without ranged I/O: single-range
// items as plain segments, multi-range items through a staging buffer. It
// returns each item's result, the error of the request that carried each
// item (nil where that request was answered), and all those errors joined.
func (w *WorkerHandle) fallbackBatch(ctx context.Context, c *conn.Conn, kind jobKind, items []item) ([]bool, []error, error) {
	results := make([]bool, len(items))
	itemErrs := make([]error, len(items))
	var keys []string
	var segs []conn.Segment
	var at []int
	var multi []int
	for k := range items {
		if !items[k].single {
			multi = append(multi, k)
			continue
		}
		r := items[k].obj.Ranges[0]
		keys = append(keys, items[k].obj.Key)
		segs = append(segs, conn.Segment{RegionBase: r.RegionBase, Offset: r.Offset, Size: r.Size})
		at = append(at, k)
	}
	var errs []error
	if len(keys) > 0 {
		var got []bool
		var err error
		if kind == kindStore {
			got, err = c.BatchPut(ctx, keys, segs)
		} else {
			got, err = c.BatchGet(ctx, keys, segs)
		}
		if err != nil {
			errs = append(errs, err)
		}
		for i, k := range at {
			results[k] = i < len(got) && got[i]
			itemErrs[k] = conn.ErrFor(err, i)
		}
	}
	if len(multi) > 0 {
		if err := w.staged(ctx, c, kind, items, multi, results, itemErrs); err != nil {
			errs = append(errs, err)
		}
	}
	return results, itemErrs, errors.Join(errs...)
}

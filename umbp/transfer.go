package umbp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// TransferOption adjusts one store.
type TransferOption func(*transferOptions)

type transferOptions struct{}

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
	host   bool // every range in host memory
}

// submit builds a job, fails what cannot run, and queues the rest.
func (w *WorkerHandle) submit(kind jobKind, plans []BlockTransferPlan, opts []TransferOption) *TransferJob {
	var o transferOptions
	for _, opt := range opts {
		opt(&o)
	}
	job := newJob(kind, plans)
	job.start()
	if w.isClosed() {
		job.failRest(refusedClosed)
		return job
	}
	if n := w.blockedCount(); n > 0 {
		job.failRest(refusedBlocked)
		if w.refusals.allow() {
			w.log.Warn("UMBP standalone transfers are refused while timed-out transfers are still blocked in the server",
				"endpoint", w.address, "blocked", n)
		}
		return job
	}
	items := w.resolve(job)
	if len(items) == 0 {
		job.failRest("no valid plans") // only reached for an empty job
		return job
	}
	ranged := w.conn.Capabilities().RangedIO
	// Submit under the lock, so that Close sees every queued job with its
	// future. Submit never blocks.
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		job.failRest(refusedClosed)
		return job
	}
	f, err := w.pool.Submit(func() (any, error) {
		defer w.forget(job)
		job.markRunning(w.timeout)
		w.run(job, items, ranged)
		return nil, nil
	})
	if err != nil {
		job.failRest(refusedClosed)
		return job
	}
	job.mu.Lock()
	job.future = f
	job.mu.Unlock()
	w.inflight[job] = struct{}{}
	return job
}

// resolve validates each plan and maps its ranges into registered regions.
// Plans that fail get their outcome now; the rest are returned.
func (w *WorkerHandle) resolve(job *TransferJob) []item {
	items := make([]item, 0, len(job.plans))
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range job.plans {
		p := &job.plans[i]
		if err := p.Validate(); err != nil {
			job.setLocked(i, TransferNotAttempted+": "+err.Error())
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
		if bad != "" {
			job.setLocked(i, bad)
			continue
		}
		items = append(items, item{idx: i, obj: obj, host: host, single: len(obj.Ranges) == 1 && obj.Ranges[0].ObjectOffset == 0})
	}
	return items
}

// run performs the job's transfer on a transfer goroutine. Its RPCs carry
// no deadline: the server uses the buffers until it answers.
func (w *WorkerHandle) run(job *TransferJob, items []item, ranged bool) {
	ctx := context.Background()
	var results []bool
	var err error
	if ranged {
		results, err = w.rangedBatch(ctx, job.kind, items)
	} else {
		results, err = w.fallbackBatch(ctx, job.kind, items)
	}
	errText := ""
	if err != nil {
		errText = err.Error()
		w.logFailure(job.kind.String(), err)
	}
	if job.kind == kindStore && !errors.Is(err, conn.ErrUnavailable) {
		w.retryStores(ctx, items, results, ranged)
		if ok, ferr := w.conn.Flush(ctx); ferr != nil || !ok {
			msg := "final flush failed"
			if ferr != nil {
				msg += ": " + ferr.Error()
			}
			job.failRest(msg)
			return
		}
	}
	for k, it := range items {
		switch {
		case results[k]:
			job.setOutcome(it.idx, "")
		case errText != "":
			job.setOutcome(it.idx, errText)
		case job.kind == kindLoad:
			job.setOutcome(it.idx, fmt.Sprintf("key %q is not in the pool (or its size differs)", it.obj.Key))
		default:
			job.setOutcome(it.idx, fmt.Sprintf("server refused to store key %q", it.obj.Key))
		}
	}
}

// retryStores retries each refused key on its own, after a Flush and a
// pause, twice.
func (w *WorkerHandle) retryStores(ctx context.Context, items []item, results []bool, ranged bool) {
	for _, pause := range storeRetryBackoff {
		var failed []int
		for k, ok := range results {
			if !ok {
				failed = append(failed, k)
			}
		}
		if len(failed) == 0 {
			return
		}
		if _, err := w.conn.Flush(ctx); err != nil && errors.Is(err, conn.ErrUnavailable) {
			return
		}
		time.Sleep(pause)
		for _, k := range failed {
			one := items[k : k+1]
			var got []bool
			var err error
			if ranged {
				got, err = w.rangedBatch(ctx, kindStore, one)
			} else {
				got, err = w.fallbackBatch(ctx, kindStore, one)
			}
			if err == nil && len(got) == 1 && got[0] {
				results[k] = true
			}
		}
	}
}

// rangedBatch moves every item in ranged RPCs (split by the connection at the
// message limit).
func (w *WorkerHandle) rangedBatch(ctx context.Context, kind jobKind, items []item) ([]bool, error) {
	objs := make([]conn.Object, len(items))
	for k := range items {
		objs[k] = items[k].obj
	}
	if kind == kindStore {
		return w.conn.BatchPutRanges(ctx, objs)
	}
	return w.conn.BatchGetRanges(ctx, objs)
}

// fallbackBatch moves items on a server without ranged I/O: single-range
// items as plain segments, multi-range items through a staging buffer.
func (w *WorkerHandle) fallbackBatch(ctx context.Context, kind jobKind, items []item) ([]bool, error) {
	results := make([]bool, len(items))
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
			got, err = w.conn.BatchPut(ctx, keys, segs)
		} else {
			got, err = w.conn.BatchGet(ctx, keys, segs)
		}
		if err != nil {
			errs = append(errs, err)
		}
		for i, k := range at {
			results[k] = i < len(got) && got[i]
		}
	}
	if len(multi) > 0 {
		if err := w.staged(ctx, kind, items, multi, results); err != nil {
			errs = append(errs, err)
		}
	}
	return results, errors.Join(errs...)
}

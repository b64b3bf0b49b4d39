package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/daemonpool"
)

// WorkerHandle registers an engine worker's KV memory with the server and
// moves KV blocks between that memory and the shared pool as asynchronous
// [TransferJob]s.
//
// Transfers run on the handle's NumWorkers detached goroutines. A job's
// deadline (Timeout) starts when it starts running. The server keeps using
// a job's buffers until its reply arrives, whatever the client does, so a
// job past its deadline is not failed: it is blocked — still RUNNING, its
// buffers still in use — until the server answers. While any transfer is
// blocked, new transfers fail at once as not attempted, so a stalled server
// costs the engine recomputation, never a hung step.
//
// A WorkerHandle is safe for concurrent use.
type WorkerHandle struct {
	link    *link
	address string
	log     *slog.Logger
	timeout time.Duration
	planner *LayoutPlanner // nil without a layout
	pool    *daemonpool.Pool
	staging *stagingPool

	refusals logLimiter
	failures logLimiter
	stats    transferCounters
	jobs     *jobSet // submitted and not yet ended

	regions *regionSet

	mu     sync.Mutex // orders submissions with a connection's replacement, and with Close
	tr     transport  // the current connection's, made once for it
	closed bool
}

// NewWorkerHandle attaches a worker handle to the server, waiting at most
// StartupTimeout (or until ctx ends) for it to answer. layout, when not nil,
// gives [WorkerHandle.StoreBlocks] and [WorkerHandle.LoadBlocks] their
// per-group bases and strides.
func (r *StandaloneRuntime) NewWorkerHandle(ctx context.Context, namespace string, topo RankTopology, layout *KVLayoutDescriptor) (*WorkerHandle, error) {
	if err := checkHandleArgs(namespace, topo, layout); err != nil {
		return nil, err
	}
	var planner *LayoutPlanner
	if layout != nil {
		p, err := NewLayoutPlanner(layout)
		if err != nil {
			return nil, err
		}
		planner = p
	}
	w := &WorkerHandle{
		address: r.cfg.Endpoint,
		log:     r.cfg.Logger,
		timeout: r.cfg.Timeout,
		planner: planner,
		regions: newRegionSet(),
	}
	pool, err := daemonpool.New(r.cfg.NumWorkers, "umbp-standalone-transfer", func(err error) {
		w.log.Error("UMBP standalone transfer goroutine panicked; its job failed", "endpoint", w.address, "err", err)
	})
	if err != nil {
		return nil, err
	}
	w.pool = pool
	w.jobs = newJobSet(&w.stats)
	l, err := newLink(ctx, r.cfg, w.regions, w.replaced)
	if err != nil {
		pool.Shutdown()
		return nil, r.attachError(err)
	}
	w.link = l
	w.staging = newStagingPool(w.regions, l, w.timeout)
	c := l.conn()
	r.cfg.Logger.Debug("UMBP standalone worker attached", "endpoint", r.cfg.Endpoint, "client_id", c.ClientID(), "ranged_io", c.Capabilities().RangedIO)
	return w, nil
}

// replaced runs once the link attached to a new server: the old
// connection's registrations are dropped (in case its server lives on) and
// it closes, once the transfers still using it have returned.
func (w *WorkerHandle) replaced(old *conn.Conn) {
	on := w.leave(old)
	go func() {
		for _, j := range on {
			<-j.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		defer cancel()
		if err := old.Deregister(ctx); errors.Is(err, ErrUnavailable) {
			// Its transport is gone, and a connection never redials: ask
			// the server behind the new one, which may be the same
			// process, living on.
			if c, err := w.link.current(); err == nil && c != old {
				_ = c.DeregisterClient(ctx, old.ClientID())
			}
		}
		_ = old.Close()
	}()
}

// leave takes the handle's jobs off old and returns them: a job still
// queued there fails as not attempted; one already running is detached:
// its buffers stay in use until it ends, but it holds nothing up on the new
// server.
func (w *WorkerHandle) leave(old *conn.Conn) []*TransferJob {
	// Under w.mu: a submit that read the old connection has queued its job
	// by now, and a later one reads the new connection.
	w.mu.Lock()
	on := w.jobs.on(old)
	w.mu.Unlock()
	for _, j := range on {
		if !j.failQueued(errReconnecting) {
			j.detach()
		}
	}
	return on
}

// State reports whether the handle is connected, reconnecting or closed.
func (w *WorkerHandle) State() HandleState { return w.link.st.get() }

// WaitForStateChange waits until the handle's state differs from from, as
// grpc.ClientConn.WaitForStateChange does: it returns true once State()
// is not from, and false if ctx ends first. See
// SchedulerHandle.WaitForStateChange.
func (w *WorkerHandle) WaitForStateChange(ctx context.Context, from HandleState) bool {
	return w.link.st.waitForChange(ctx, from)
}

// Stats returns a snapshot of the handle's health and counters.
func (w *WorkerHandle) Stats() Stats {
	s := Stats{State: w.State(), Capabilities: w.link.capabilities(), Reconnects: w.link.st.reconnects.Load(), Transfers: w.stats.snapshot()}
	s.Transfers.Blocked = int(w.jobs.blocked.Load())
	return s
}

// RegisterBuffers registers the engine's KV memory with the server, by name.
// Each allocation is registered once, however many buffers lie in it. Host
// memory must come from a [HostBuffer]. Buffers that fail do not stop the
// others: the error joins one error per failed buffer, naming it.
// Registration is bounded by Timeout and by ctx.
func (w *WorkerHandle) RegisterBuffers(ctx context.Context, buffers map[string]Buffer) error {
	if w.isClosed() {
		return fmt.Errorf("umbp: register buffers at %s: %w", w.address, ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	names := make([]string, 0, len(buffers))
	for name := range buffers {
		names = append(names, name)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		if err := w.registerBuffer(ctx, name, buffers[name]); err != nil {
			errs = append(errs, fmt.Errorf("buffer %q: %w", name, err))
		}
	}
	w.prepareStaging(ctx)
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("umbp: register buffers at %s: %w", w.address, errs[0])
	}
	// One line a failed buffer.
	return fmt.Errorf("umbp: register buffers at %s: %d of %d failed:\n%w", w.address, len(errs), len(names), errors.Join(errs...))
}

func (w *WorkerHandle) registerBuffer(ctx context.Context, name string, b Buffer) error {
	if b.Ptr == 0 || b.Size == 0 {
		return fmt.Errorf("%w: empty buffer (ptr %#x, size %d)", ErrInvalidBuffer, b.Ptr, b.Size)
	}
	if b.Ptr+uintptr(b.Size) < b.Ptr {
		return fmt.Errorf("%w: buffer at %#x of %d bytes wraps the address space", ErrInvalidBuffer, b.Ptr, b.Size)
	}
	loc := b.Location
	var hb *HostBuffer
	if loc == LocationAuto || loc == LocationHost {
		if hb = hostBuffers.find(b.Ptr, b.Size); hb != nil {
			loc = LocationHost
		} else if in := hostBuffers.at(b.Ptr); in != nil { // the buffer b starts in
			ib := in.Buffer() // under the buffer's lock: it may be closing
			return fmt.Errorf("%w: %d bytes at %#x run past the end of the HostBuffer that holds them (%d bytes at %#x)", ErrInvalidBuffer, b.Size, b.Ptr, ib.Size, ib.Ptr)
		} else if loc == LocationHost {
			return fmt.Errorf("%w: host memory at %#x (%d bytes) does not lie in a HostBuffer: the server can only map memfd-backed memory from NewHostBuffer", ErrInvalidBuffer, b.Ptr, b.Size)
		}
	}
	fresh, err := w.regions.claim(name, b)
	if err != nil || !fresh {
		return err
	}
	if err := w.registerClaimed(ctx, name, b, hb); err != nil {
		w.regions.unclaim(name)
		return err
	}
	return nil
}

// registerClaimed registers b under name, claimed already: hb is the
// HostBuffer holding host memory, nil for GPU memory.
func (w *WorkerHandle) registerClaimed(ctx context.Context, name string, b Buffer, hb *HostBuffer) error {
	if _, err := w.link.current(); err != nil { // fail fast while reconnecting
		return err
	}
	if err := w.regions.lockReg(ctx); err != nil {
		return err
	}
	defer w.regions.unlockReg()
	if w.isClosed() {
		return ErrClosed
	}
	c, err := w.link.current()
	if err != nil {
		return err
	}
	if hb == nil {
		return w.registerGPU(ctx, c, name, b)
	}
	if w.regions.addHostName(name, hb) {
		return nil
	}
	return w.regions.addHost(ctx, c, hb, name)
}

// Store stores the plans' blocks in the pool and returns at once with a
// RUNNING job — or, while an earlier transfer is blocked or for plans that
// are invalid or name unregistered memory, with those keys already failed.
// The plans' source memory must stay unchanged until the job ends.
func (w *WorkerHandle) Store(plans []BlockTransferPlan, opts ...TransferOption) *TransferJob {
	return w.submit(kindStore, slices.Clone(plans), opts, nil, false) // the caller may reuse its slice
}

// Load loads the plans' blocks from the pool into the plans' memory and
// returns at once, under the same rules as Store, with the same options
// ([AfterStream]: wait for the engine's stream before writing the
// destination). A key the pool lacks fails (a miss); its siblings still
// load. The destination memory must not be used until the job ends.
func (w *WorkerHandle) Load(plans []BlockTransferPlan, opts ...TransferOption) *TransferJob {
	return w.submit(kindLoad, slices.Clone(plans), opts, nil, false) // the caller may reuse its slice
}

// StoreBlocks is Store on the bulk path: each plan names a block (Key,
// GroupID, BlockID) and the handle's layout supplies its ranges. A plan the
// layout cannot plan (explicit ranges, a missing group, a block out of
// range) fails its own key as not attempted, with the planner's error; its
// siblings still run. The error is for the call as a whole: a handle
// without a layout (ErrInvalidLayout).
func (w *WorkerHandle) StoreBlocks(plans []BlockTransferPlan, opts ...TransferOption) (*TransferJob, error) {
	if w.planner == nil {
		return nil, errNoLayout
	}
	built := make([]BlockTransferPlan, len(plans))
	var bad []error
	for i, p := range plans {
		var err error
		if len(p.Ranges) > 0 {
			err = fmt.Errorf("%w: key %q: StoreBlocks takes plans without ranges (the layout supplies them): use Store", ErrInvalidPlan, p.Key)
		} else {
			var bp BlockTransferPlan
			if bp, err = w.planner.planForBlock(p.Key, p.GroupID, p.BlockID); err == nil {
				built[i] = bp
				continue
			}
		}
		built[i] = p
		if bad == nil {
			bad = make([]error, len(plans))
		}
		bad[i] = err
	}
	return w.submit(kindStore, built, opts, bad, true), nil
}

// LoadBlocks is Load on the bulk path, for a columnar batch, under the same
// rules as StoreBlocks and with the same options. A batch that fails
// [BlockLoadBatch.Validate] (columns of different lengths, an empty key, a
// negative ID) is refused as a whole (ErrInvalidPlan).
func (w *WorkerHandle) LoadBlocks(batch BlockLoadBatch, opts ...TransferOption) (*TransferJob, error) {
	if w.planner == nil {
		return nil, errNoLayout
	}
	if err := batch.Validate(); err != nil {
		return nil, err
	}
	plans, bad := batch.planRows(w.planner)
	return w.submit(kindLoad, plans, opts, bad, true), nil
}

// errNoLayout refuses the bulk path on a handle created without a layout.
var errNoLayout = fmt.Errorf("%w: the worker handle has no layout: pass one to NewWorkerHandle, or use Store and Load", ErrInvalidLayout)

// Poll reports whether the job has ended. While another transfer is
// blocked, a job still queued behind it is failed as not attempted (it holds
// no buffers), and Poll reports true. A nil job has ended.
func (w *WorkerHandle) Poll(job *TransferJob) bool {
	if job == nil || job.ended() {
		return true
	}
	return w.jobs.blocked.Load() > 0 && job.failQueued(errQueuedBehind)
}

// Wait waits for the job to end, at most until the running job's deadline
// (or Timeout for a job still queued), or until ctx ends. Its answer is the
// engine's whole decision:
//
//   - nil: the job COMPLETED;
//   - the job's error (Err) when it FAILED or was CANCELLED: its buffers are
//     free, and KeyErr tells each key's fate;
//   - an error matching ErrBuffersInUse when the job is still running past
//     its deadline (or ctx ended first; the error then matches ctx's error
//     too): the job stays RUNNING and its buffers must not be reused.
//
// A job still queued when Wait gives up is failed as not attempted instead.
func (w *WorkerHandle) Wait(ctx context.Context, job *TransferJob) error {
	if job == nil {
		return errNilJob
	}
	return job.wait(ctx, w.timeout)
}

// Cancel withdraws a job. A job still queued becomes CANCELLED
// ("preempted"). A running store is left to finish: it only reads memory the
// engine keeps pinned. A running load is waited for as Wait does, since the
// engine is about to reuse its destination.
func (w *WorkerHandle) Cancel(job *TransferJob) {
	if job == nil || job.cancelQueued("preempted") || job.ended() || job.kind == kindStore {
		return
	}
	if err := w.Wait(context.Background(), job); err != nil && !job.ended() {
		w.log.Warn("UMBP standalone load cancelled while still running", "endpoint", w.address, "err", err)
	}
}

// Publish makes a completed store's blocks visible to other engines. On the
// standalone server a stored object is visible as soon as its store
// completes, so Publish only checks that the job COMPLETED: otherwise its
// error wraps the job's (ErrBuffersInUse while it runs).
func (w *WorkerHandle) Publish(job *TransferJob) error {
	if job == nil {
		return errNilJob
	}
	switch s := job.Status(); s {
	case JobCompleted:
		return nil
	case JobRunning:
		return fmt.Errorf("umbp: cannot publish a store to %s that is still running: %w", w.address, ErrBuffersInUse)
	default:
		return fmt.Errorf("%w (so it cannot be published)", job.Err())
	}
}

func (w *WorkerHandle) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// Close releases the handle without ever hanging: it returns within about
// three times Timeout at worst (a registration under way, the running jobs'
// deadlines, deregistration). Queued jobs are cancelled; running ones get
// until their own deadlines. If any is still in flight then, nothing is
// deregistered yet: every registered buffer stays registered (a HostBuffer
// refuses to close) and Close returns ErrBuffersAbandoned naming them — the
// engine must not free that memory. Once those transfers have ended (the
// server answered, or its process exited) the handle deregisters the
// buffers and gives them back: a HostBuffer closes again, and
// Stats().Transfers.AbandonedBytes falls to zero. Otherwise the handle
// deregisters its memory and closes its connection at once, on a goroutine
// bounded by Timeout, abandoning the buffers the same way if that does not
// return. A failed deregistration is logged, not returned: the server may be
// gone.
func (w *WorkerHandle) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	w.link.shutdown()
	// A registration under way finishes (within Timeout) before the regions
	// are taken; later ones see the handle closed.
	regCtx, regCancel := context.WithTimeout(context.Background(), w.timeout)
	if err := w.regions.lockReg(regCtx); err == nil {
		w.regions.unlockReg() // every later holder sees the handle closed
	}
	regCancel()
	w.pool.Shutdown()
	jobs := w.jobs.on(nil)
	c := w.link.conn()

	now := time.Now()
	until := now
	var running []*TransferJob
	for _, j := range jobs {
		if j.cancelQueued("handle closed") {
			continue
		}
		ph, dl := j.state() // not queued: it began, so it has a deadline
		if ph == phaseEnded {
			continue
		}
		until = later(until, dl)
		running = append(running, j)
	}
	timer := time.NewTimer(time.Until(until))
	defer timer.Stop()
	inFlight := 0
	for _, j := range running {
		select {
		case <-j.done:
			continue
		case <-timer.C:
			timer.Reset(0)
		}
		if !j.ended() {
			inFlight++
		}
	}
	if inFlight > 0 {
		// Deregistration and the connection's close wait until the blocked
		// transfers return: neither would stop the server from using their
		// buffers.
		regions, err := w.abandon(fmt.Sprintf("%s still blocked in the server", plural(inFlight, "transfer")))
		go func() {
			for _, j := range running {
				<-j.done
			}
			w.release(c)
			w.reclaim(regions)
		}()
		return err
	}

	released := make(chan struct{})
	go func() {
		defer close(released)
		w.release(c)
	}()
	select {
	case <-released:
	case <-time.After(w.timeout):
		reason := fmt.Sprintf("deregistration did not return in %v", w.timeout)
		regions, err := w.abandon(reason)
		go func() {
			<-released
			w.reclaim(regions)
		}()
		return err
	}
	regions := w.regions.take()
	for _, r := range regions {
		if r.host != nil {
			r.host.release()
		}
	}
	w.staging.close()
	return nil
}

// release deregisters the handle's memory from c's server and closes c,
// bounded by Timeout.
func (w *WorkerHandle) release(c *conn.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	if err := c.Deregister(ctx); err != nil {
		w.log.Warn("UMBP standalone deregistration failed", "endpoint", w.address, "err", err)
	}
	if err := c.Close(); err != nil {
		w.log.Warn("UMBP standalone worker client close failed", "endpoint", w.address, "err", err)
	}
}

// abandon takes the handle's regions and marks them abandoned: their memory
// must not be freed until reclaim gives them back. It returns them, and
// Close's error naming them.
func (w *WorkerHandle) abandon(reason string) ([]*memRegion, error) {
	regions := w.regions.take()
	var names []string
	for _, r := range regions {
		names = append(names, r.names...)
		if r.host != nil {
			r.host.abandon()
		}
		w.stats.abandoned.Add(int64(len(r.names)))
		w.stats.abandonedBytes.Add(int64(r.size))
	}
	w.log.Warn("UMBP standalone worker closed with transfers in flight; its buffers must not be freed until they end",
		"endpoint", w.address, "reason", reason, "buffers", names)
	return regions, fmt.Errorf("umbp: close the worker handle of %s: %w: %s; buffers kept registered until it ends: %s", w.address, ErrBuffersAbandoned, reason, strings.Join(names, ", "))
}

// reclaim gives back abandoned regions once nothing of the server's uses
// them: every transfer that held them has ended and they were deregistered.
func (w *WorkerHandle) reclaim(regions []*memRegion) {
	var names []string
	for _, r := range regions {
		names = append(names, r.names...)
		if r.host != nil {
			r.host.reclaim()
		}
		w.stats.abandoned.Add(-int64(len(r.names)))
		w.stats.abandonedBytes.Add(-int64(r.size))
	}
	w.staging.close()
	w.log.Info("UMBP standalone worker's abandoned buffers are free again", "endpoint", w.address, "buffers", names)
}

func (w *WorkerHandle) logFailure(op string, err error) {
	if w.failures.allow() {
		w.log.Warn("UMBP standalone transfer failed; its keys fail", "op", op, "endpoint", w.address, "err", err)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

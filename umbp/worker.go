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
	stats    counters

	// regSem (a mutex that honours contexts) orders registrations with the
	// re-registration that follows a server restart, and with Close, so
	// that no region is registered with one server only or after Close.
	regSem chan struct{}

	mu       sync.Mutex
	regions  []*memRegion // sorted by base
	inflight map[*TransferJob]struct{}
	closed   bool
}

// memRegion is one registered allocation.
type memRegion struct {
	names []string // the buffers registered in it
	base  uintptr
	size  uint64
	loc   MemoryLocation
	host  *HostBuffer // host memory
	gpu   *gpuAlloc   // GPU memory
}

func (r *memRegion) contains(addr uintptr, n uint64) bool {
	return addr >= r.base && uint64(addr-r.base) <= r.size && n <= r.size-uint64(addr-r.base)
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
	pool, err := daemonpool.New(r.cfg.NumWorkers, "umbp-standalone-transfer")
	if err != nil {
		return nil, err
	}
	w := &WorkerHandle{
		address:  r.cfg.Endpoint,
		log:      r.cfg.Logger,
		timeout:  r.cfg.Timeout,
		planner:  planner,
		pool:     pool,
		inflight: map[*TransferJob]struct{}{},
		regSem:   make(chan struct{}, 1),
	}
	w.staging = &stagingPool{w: w}
	l, err := newLink(ctx, r, w.reregister, w.replaced)
	if err != nil {
		pool.Shutdown(false, true)
		return nil, err
	}
	w.link = l
	c := l.conn()
	r.cfg.Logger.Info("UMBP standalone worker attached", "endpoint", r.cfg.Endpoint, "client_id", c.ClientID(), "ranged_io", c.Capabilities().RangedIO)
	return w, nil
}

// reregister registers every region of the handle with the server behind
// c: the attach hook of the handle's link, run after a server restart.
func (w *WorkerHandle) reregister(ctx context.Context, c *conn.Conn) error {
	if err := w.lockReg(ctx); err != nil {
		return err
	}
	defer w.unlockReg()
	w.mu.Lock()
	regions := slices.Clone(w.regions)
	w.mu.Unlock()
	for _, r := range regions {
		var err error
		switch {
		case r.host != nil:
			err = c.RegisterHost(ctx, r.host.fd, r.base, r.size)
		case r.gpu != nil:
			err = r.gpu.register(ctx, c, r.base, r.size)
		}
		if err != nil {
			return fmt.Errorf("re-register %s: %w", strings.Join(r.names, ", "), err)
		}
	}
	return nil
}

// replaced runs once the link attached to a new server: the old connection
// deregisters (in case its server lives on) and closes when the transfers
// still using it have returned.
func (w *WorkerHandle) replaced(old *conn.Conn) {
	w.mu.Lock()
	var on []*TransferJob
	for j := range w.inflight {
		if j.conn == old {
			on = append(on, j)
		}
	}
	w.mu.Unlock()
	go func() {
		for _, j := range on {
			<-j.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		defer cancel()
		_ = old.Deregister(ctx)
		_ = old.Close()
	}()
}

// State reports whether the handle is connected, reconnecting or closed.
func (w *WorkerHandle) State() HandleState { return HandleState(w.link.state.Load()) }

// Stats returns a snapshot of the handle's health and counters.
func (w *WorkerHandle) Stats() Stats {
	s := Stats{State: w.State(), Capabilities: w.link.capabilities(), Reconnects: w.link.reconnects.Load()}
	w.stats.fill(&s)
	s.TransfersBlocked = w.blockedCount()
	return s
}

// RegisterBuffers registers the engine's KV memory with the server, by name.
// Each allocation is registered once, however many buffers lie in it. Host
// memory must come from a [HostBuffer]. Buffers that fail do not stop the
// others: the error joins one error per failed buffer, naming it.
// Registration is bounded by Timeout and by ctx.
func (w *WorkerHandle) RegisterBuffers(ctx context.Context, buffers map[string]Buffer) error {
	if w.isClosed() {
		return ErrClosed
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
			errs = append(errs, fmt.Errorf("umbp: register buffer %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func (w *WorkerHandle) registerBuffer(ctx context.Context, name string, b Buffer) error {
	if b.Ptr == 0 || b.Size == 0 {
		return fmt.Errorf("empty buffer (ptr %#x, size %d)", b.Ptr, b.Size)
	}
	if b.Ptr+uintptr(b.Size) < b.Ptr {
		return fmt.Errorf("buffer at %#x of %d bytes wraps the address space", b.Ptr, b.Size)
	}
	loc := b.Location
	var hb *HostBuffer
	if loc == LocationAuto || loc == LocationHost {
		hb = hostBuffers.find(b.Ptr, b.Size)
		if hb != nil {
			loc = LocationHost
		} else if loc == LocationHost {
			return fmt.Errorf("host memory at %#x (%d bytes) does not lie in a HostBuffer: the server can only map memfd-backed memory from NewHostBuffer", b.Ptr, b.Size)
		}
	}
	if _, err := w.link.current(); err != nil { // fail fast while reconnecting
		return err
	}
	if err := w.lockReg(ctx); err != nil {
		return err
	}
	defer w.unlockReg()
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
	w.mu.Lock()
	for _, r := range w.regions {
		if r.host == hb {
			r.names = append(r.names, name)
			w.mu.Unlock()
			return nil
		}
	}
	w.mu.Unlock()
	if err := hb.acquire(); err != nil {
		return err
	}
	if err := c.RegisterHost(ctx, hb.fd, hb.base(), hb.mappedSize()); err != nil {
		hb.release()
		return err
	}
	w.addRegion(&memRegion{names: []string{name}, base: hb.base(), size: hb.mappedSize(), loc: LocationHost, host: hb})
	return nil
}

// lockReg takes the registration lock, or gives up when ctx ends.
func (w *WorkerHandle) lockReg(ctx context.Context) error {
	select {
	case w.regSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for another registration: %w", ctx.Err())
	}
}

func (w *WorkerHandle) unlockReg() { <-w.regSem }

func (w *WorkerHandle) addRegion(r *memRegion) {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := sort.Search(len(w.regions), func(i int) bool { return w.regions[i].base > r.base })
	w.regions = slices.Insert(w.regions, i, r)
}

// resolveLocked finds the registered region that holds [addr, addr+n).
func (w *WorkerHandle) resolveLocked(addr uintptr, n uint64) *memRegion {
	i := sort.Search(len(w.regions), func(i int) bool { return w.regions[i].base > addr })
	if i == 0 {
		return nil
	}
	if r := w.regions[i-1]; r.contains(addr, n) {
		return r
	}
	return nil
}

// Store stores the plans' blocks in the pool and returns at once with a
// RUNNING job — or, while an earlier transfer is blocked or for plans that
// are invalid or name unregistered memory, with those keys already failed.
// The plans' source memory must stay unchanged until the job ends.
func (w *WorkerHandle) Store(plans []BlockTransferPlan, opts ...TransferOption) *TransferJob {
	return w.submit(kindStore, plans, opts)
}

// Load loads the plans' blocks from the pool into the plans' memory and
// returns at once, under the same rules as Store. A key the pool lacks fails
// (a miss); its siblings still load. The destination memory must not be
// used until the job ends.
func (w *WorkerHandle) Load(plans []BlockTransferPlan) *TransferJob {
	return w.submit(kindLoad, plans, nil)
}

// StoreBlocks is Store on the bulk path: each plan names a block (Key,
// GroupID, BlockID) and the handle's layout supplies its ranges. It answers
// (nil, false) when it cannot: no layout, a plan with explicit ranges, a
// missing group or a block out of range; use Store then.
func (w *WorkerHandle) StoreBlocks(plans []BlockTransferPlan, opts ...TransferOption) (*TransferJob, bool) {
	if w.planner == nil {
		return nil, false
	}
	built := make([]BlockTransferPlan, len(plans))
	for i, p := range plans {
		if len(p.Ranges) > 0 {
			return nil, false
		}
		bp, err := w.planner.PlanForBlock(p.Key, p.GroupID, p.BlockID)
		if err != nil {
			return nil, false
		}
		bp.RequestID, bp.BlockHash, bp.TokenIDs = p.RequestID, p.BlockHash, p.TokenIDs
		built[i] = bp
	}
	return w.Store(built, opts...), true
}

// LoadBlocks is Load on the bulk path, for a columnar batch. It answers
// (nil, false) when the layout cannot plan the batch; use Load then.
func (w *WorkerHandle) LoadBlocks(batch BlockLoadBatch) (*TransferJob, bool) {
	if w.planner == nil || batch.Validate() != nil {
		return nil, false
	}
	plans, err := batch.Plans(w.planner)
	if err != nil {
		return nil, false
	}
	return w.Load(plans), true
}

// Poll reports whether the job has ended. While another transfer is
// blocked, a job still queued behind it is failed as not attempted (it holds
// no buffers), and Poll reports true.
func (w *WorkerHandle) Poll(job *TransferJob) bool {
	if job.ended() {
		return true
	}
	if w.blockedCount() > 0 && w.failIfQueued(job) {
		return true
	}
	return false
}

// Wait waits for the job to end, at most until the running job's deadline
// (or Timeout for a job still queued), or until ctx ends. It returns nil once
// the job has ended — its Status tells how. A job still running past its
// deadline makes Wait return ErrBuffersInUse: the job stays RUNNING and its
// buffers must not be reused. A job still queued then is failed as not
// attempted instead.
func (w *WorkerHandle) Wait(ctx context.Context, job *TransferJob) error {
	queuedUntil := time.Now().Add(w.timeout)
	for {
		if job.ended() {
			return nil
		}
		started, deadline := job.runState()
		wake := queuedUntil
		if started {
			wake = deadline
		}
		timer := time.NewTimer(time.Until(wake))
		select {
		case <-job.done:
			timer.Stop()
			return nil
		case <-ctx.Done():
			timer.Stop()
			if job.ended() || w.failIfQueued(job) {
				return nil // it ended: the buffers are free
			}
			return fmt.Errorf("%w: %s job of %d keys still running: %w", ErrBuffersInUse, job.kind, len(job.plans), ctx.Err())
		case <-timer.C:
		}
		if job.ended() {
			return nil
		}
		if s, _ := job.runState(); !s {
			if w.failIfQueued(job) {
				return nil
			}
			continue // it started just now: wait for its own deadline
		}
		if !started {
			continue
		}
		if job.waitingForStream() {
			// It waits for the engine's stream, having sent nothing, and
			// gives up at this same deadline: as not attempted.
			select {
			case <-job.done:
				return nil
			case <-time.After(streamWaitGrace):
			}
		}
		return fmt.Errorf("%w: %s job of %d keys is still running %v after it started", ErrBuffersInUse, job.kind, len(job.plans), w.timeout)
	}
}

// Cancel withdraws a job. A job still queued becomes CANCELLED
// ("preempted"). A running store is left to finish: it only reads memory the
// engine keeps pinned. A running load is waited for as Wait does, since the
// engine is about to reuse its destination.
func (w *WorkerHandle) Cancel(job *TransferJob) {
	if w.cancelQueued(job, "preempted") || job.ended() || job.kind == kindStore {
		return
	}
	if err := w.Wait(context.Background(), job); err != nil {
		w.log.Warn("UMBP standalone load cancelled while still running", "endpoint", w.address, "err", err)
	}
}

// Publish makes a completed store's blocks visible to other engines. On the
// standalone server a stored object is visible as soon as its store
// completes, so Publish only checks that the job COMPLETED.
func (w *WorkerHandle) Publish(job *TransferJob) error {
	if s := job.Status(); s != JobCompleted {
		return fmt.Errorf("%w (status %s: %s)", errJobNotCompleted, s, job.Err())
	}
	return nil
}

// cancelQueued cancels a job whose transfer has not started.
func (w *WorkerHandle) cancelQueued(job *TransferJob, reason string) bool {
	f := job.fut()
	if f == nil || !f.Cancel() {
		return false
	}
	if job.cancel(reason) {
		w.stats.failed.Add(1)
	}
	job.drop()
	w.forget(job)
	return true
}

// failIfQueued fails a job still waiting for a transfer goroutine.
func (w *WorkerHandle) failIfQueued(job *TransferJob) bool {
	f := job.fut()
	if f == nil || !f.Cancel() {
		return false
	}
	if job.failRest(TransferNotAttempted + ": queued behind a blocked UMBP standalone transfer") {
		w.stats.failed.Add(1)
	}
	job.drop()
	w.forget(job)
	return true
}

func (w *WorkerHandle) forget(job *TransferJob) {
	w.mu.Lock()
	delete(w.inflight, job)
	w.mu.Unlock()
}

// blockedCount counts transfers running past their deadline on the
// current connection. One still on a replaced connection keeps its own
// buffers, but holds nothing up on the new server.
func (w *WorkerHandle) blockedCount() int {
	cur := w.link.conn()
	now := time.Now()
	n := 0
	w.mu.Lock()
	defer w.mu.Unlock()
	for j := range w.inflight {
		if started, dl := j.runState(); started && !now.Before(dl) && !j.ended() && !j.waitingForStream() && j.connection() == cur {
			n++
		}
	}
	return n
}

func (w *WorkerHandle) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// Close releases the handle without ever hanging: it returns within about
// three times Timeout at worst (a registration under way, the running jobs'
// deadlines, deregistration). Queued jobs are cancelled; running ones get
// until their own deadlines. If any is still in flight
// then, nothing is deregistered: every registered buffer is kept alive (a
// HostBuffer refuses to close) and Close returns ErrBuffersAbandoned naming
// them — the engine must not free that memory. Otherwise the handle
// deregisters its memory and closes its connection on a goroutine bounded by
// Timeout, abandoning the buffers the same way if that does not return. A
// failed deregistration is logged, not returned: the server may be gone.
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
	if err := w.lockReg(regCtx); err == nil {
		w.unlockReg() // every later holder sees the handle closed
	}
	regCancel()
	w.mu.Lock()
	jobs := make([]*TransferJob, 0, len(w.inflight))
	for j := range w.inflight {
		jobs = append(jobs, j)
	}
	w.mu.Unlock()
	c := w.link.conn()

	w.pool.Shutdown(false, true)
	now := time.Now()
	until := now
	var running []*TransferJob
	for _, j := range jobs {
		if f := j.fut(); f != nil && f.Cancelled() {
			if j.cancel("handle closed") {
				w.stats.failed.Add(1)
			}
			j.drop()
			continue
		}
		started, dl := j.runState()
		if !started {
			dl = now.Add(w.timeout)
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
		// The connection stays open until the blocked transfers return:
		// closing it would not stop the server from using their buffers.
		go func() {
			for _, j := range running {
				<-j.done
			}
			_ = c.Close()
		}()
		return w.abandon(fmt.Sprintf("%d transfer(s) are still blocked in the server", inFlight))
	}

	released := make(chan struct{})
	go func() {
		defer close(released)
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		defer cancel()
		if err := c.Deregister(ctx); err != nil {
			w.log.Warn("UMBP standalone deregistration failed", "endpoint", w.address, "err", err)
		}
		if err := c.Close(); err != nil {
			w.log.Warn("UMBP standalone worker client close failed", "endpoint", w.address, "err", err)
		}
	}()
	select {
	case <-released:
	case <-time.After(w.timeout):
		return w.abandon(fmt.Sprintf("deregistration did not return in %v", w.timeout))
	}
	w.mu.Lock()
	regions := w.regions
	w.regions = nil
	w.mu.Unlock()
	for _, r := range regions {
		if r.host != nil {
			r.host.release()
		}
	}
	w.staging.close()
	return nil
}

func (w *WorkerHandle) abandon(reason string) error {
	w.mu.Lock()
	regions := w.regions
	w.regions = nil
	var names []string
	for _, r := range regions {
		names = append(names, r.names...)
	}
	w.mu.Unlock()
	for _, r := range regions {
		if r.host != nil {
			r.host.abandon()
		}
	}
	// Nothing unmaps an abandoned buffer: its mapping is not the garbage
	// collector's, and the HostBuffer refuses to close.
	w.stats.abandoned.Add(int64(len(names)))
	w.log.Warn("UMBP standalone worker client left open at shutdown; its buffers must not be freed",
		"endpoint", w.address, "reason", reason, "buffers", names)
	return fmt.Errorf("%w: %s; buffers kept registered: %s", ErrBuffersAbandoned, reason, strings.Join(names, ", "))
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

package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/proto/umbppb"
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
	xfer    *jobRunner
	regions *regionSet
	staging *stagingPool
	planner *LayoutPlanner // nil without a layout
	address string
	log     *slog.Logger
	timeout time.Duration
	stats   transferCounters
}

// NewWorkerHandle attaches a worker handle to the server, waiting at most
// StartupTimeout (or until ctx ends) for it to answer. layout, when not nil,
// gives [WorkerHandle.StoreBlocks] and [WorkerHandle.LoadBlocks] the ranges
// of each block.
func (r *StandaloneRuntime) NewWorkerHandle(ctx context.Context, layout *KVLayoutDescriptor) (*WorkerHandle, error) {
	w := &WorkerHandle{
		address: r.cfg.Endpoint,
		log:     r.cfg.Logger,
		timeout: r.cfg.Timeout,
		regions: newRegionSet(),
	}
	if layout != nil {
		p, err := newLayoutPlanner(layout)
		if err != nil {
			return nil, invalid(err)
		}
		w.planner = p
	}
	l, err := newLink(ctx, r.cfg, w.regions, w.replaced)
	if err != nil {
		return nil, opError("attach", w.address, err)
	}
	w.link = l
	w.staging = newStagingPool(w.regions, l, w.timeout)
	if w.xfer, err = newJobRunner(r.cfg, l, w.regions, w.staging, &w.stats); err != nil {
		l.shutdown()
		w.release(l.conn())
		return nil, opError("attach", w.address, err)
	}
	c := l.conn()
	w.log.Debug("UMBP standalone worker attached", "endpoint", w.address, "client_id", c.ClientID(), "ranged_io", c.Capabilities().RangedIO)
	return w, nil
}

// replaced runs once the link attached to a new server: the old
// connection's registrations are dropped (in case its server lives on) and
// it closes, once the transfers still using it have returned.
func (w *WorkerHandle) replaced(old *conn.Conn) {
	on := w.xfer.leave(old)
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
	s.Transfers.Blocked = int(w.xfer.jobs.blocked.Load())
	return s
}

// RegisterBuffers registers the engine's KV memory with the server, by name.
// Each allocation is registered once, however many buffers lie in it. Host
// memory must come from a [HostBuffer]. Buffers that fail do not stop the
// others: the error joins one error per failed buffer, naming it.
// Registration is bounded by Timeout and by ctx.
func (w *WorkerHandle) RegisterBuffers(ctx context.Context, buffers map[string]Buffer) error {
	const op = "register buffers"
	if w.xfer.isClosed() {
		return opError(op, w.address, ErrClosed)
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
		return opError(op, w.address, errs[0])
	}
	// One line a failed buffer.
	return opError(op, w.address, fmt.Errorf("%d of %d failed:\n%w", len(errs), len(names), errors.Join(errs...)))
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
		if in := hostBuffers.at(b.Ptr); in != nil && in.own {
			return fmt.Errorf("%w: %d bytes at %#x lie in memory the package uses for itself (a staging buffer), not in a HostBuffer of the caller's", ErrInvalidBuffer, b.Size, b.Ptr)
		}
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
	if w.xfer.isClosed() {
		return ErrClosed
	}
	c, err := w.link.current()
	if err != nil {
		return err
	}
	if hb == nil {
		return w.regions.addGPU(ctx, c, name, b, w.log)
	}
	if w.regions.addHostName(name, hb) {
		return nil
	}
	return w.regions.addHost(ctx, c, hb, name, false)
}

// prepareStaging readies, within ctx, the staging buffer that the first
// multi-range transfer on a server without ranged I/O would otherwise
// make on the engine's step: sized for the layout's largest job (every
// block of its multi-range groups).
func (w *WorkerHandle) prepareStaging(ctx context.Context) {
	c, err := w.link.current()
	if err != nil || w.planner == nil {
		return
	}
	var size uint64
	for _, g := range w.planner.groups {
		if w.planner.rangesPerBlock(g) > 1 {
			size += w.planner.objectSize(g) * uint64(w.planner.NumBlocks(g))
		}
	}
	w.staging.prepare(ctx, c, size, w.log.With("endpoint", w.address))
}

// Store stores the plans' blocks in the pool and returns at once with a
// RUNNING job — or, while an earlier transfer is blocked or for plans that
// are invalid or name unregistered memory, with those keys already failed.
// The plans' source memory must stay unchanged until the job ends.
func (w *WorkerHandle) Store(plans []BlockTransferPlan, opts ...TransferOption) *TransferJob {
	return w.xfer.submit(kindStore, slices.Clone(plans), opts, nil, false) // the caller may reuse its slice
}

// Load loads the plans' blocks from the pool into the plans' memory and
// returns at once, under the same rules as Store, with the same options
// ([AfterStream]: wait for the engine's stream before writing the
// destination). A key the pool lacks fails (a miss); its siblings still
// load. The destination memory must not be used until the job ends.
func (w *WorkerHandle) Load(plans []BlockTransferPlan, opts ...TransferOption) *TransferJob {
	return w.xfer.submit(kindLoad, slices.Clone(plans), opts, nil, false) // the caller may reuse its slice
}

// StoreBlocks is Store of whole blocks: the handle's layout supplies each
// block's ranges. A block the layout cannot plan (a missing group, a block
// out of range, an empty key) fails its own key as not attempted, with the
// planner's error; its siblings still run. On a handle made without a
// layout every key fails so (ErrInvalidLayout).
func (w *WorkerHandle) StoreBlocks(blocks []Block, opts ...TransferOption) *TransferJob {
	plans, bad := w.planBlocks(blocks)
	return w.xfer.submit(kindStore, plans, opts, bad, true)
}

// LoadBlocks is Load of whole blocks, under the same rules as StoreBlocks
// and with the same options.
func (w *WorkerHandle) LoadBlocks(blocks []Block, opts ...TransferOption) *TransferJob {
	plans, bad := w.planBlocks(blocks)
	return w.xfer.submit(kindLoad, plans, opts, bad, true)
}

// planBlocks plans blocks with the handle's layout; without one, every
// block is bad.
func (w *WorkerHandle) planBlocks(blocks []Block) ([]BlockTransferPlan, []error) {
	if w.planner != nil {
		return w.planner.planBlocks(blocks)
	}
	plans := make([]BlockTransferPlan, len(blocks))
	bad := make([]error, len(blocks))
	for i, b := range blocks {
		plans[i] = BlockTransferPlan{Key: b.Key, GroupID: b.GroupID, BlockID: b.BlockID}
		bad[i] = errNoLayout
	}
	return plans, bad
}

// errNoLayout fails the blocks of the block-wise calls on a handle made
// without a layout.
var errNoLayout = fmt.Errorf("%w: the worker handle has no layout: pass one to NewWorkerHandle, or use Store and Load", ErrInvalidLayout)

// Poll reports whether the job has ended. While another transfer is
// blocked, a job still queued behind it is failed as not attempted (it holds
// no buffers), and Poll reports true. A nil job has ended.
func (w *WorkerHandle) Poll(job *TransferJob) bool {
	if job == nil || job.ended() {
		return true
	}
	return w.xfer.jobs.blocked.Load() > 0 && job.failQueued(errQueuedBehind)
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
// A Wait that finds the job queued as the handle's one job may run its
// request itself, on the caller's goroutine, within the same bound: at
// the bound the request is paused and goes on on a goroutine of its own.
func (w *WorkerHandle) Wait(ctx context.Context, job *TransferJob) error {
	if job == nil {
		return errNilJob
	}
	if q := job.queued; q != nil && !job.ended() {
		q.runWaited(ctx)
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
		return opError("publish", w.address, fmt.Errorf("the store is still running: %w", ErrBuffersInUse))
	default:
		return job.Err()
	}
}

// ReportExternalKv tells the pool's master, through the server, that this
// engine holds the blocks hashes on tier, so that routers find them
// (MatchExternalKv). A server in distributed mode forwards the report under
// Config.NodeID, the identity it registers with the master when this
// handle registers memory (before that, MORI's server refuses: ErrRefused);
// a local one accepts and forgets it, as MORI's does. Requests carry at
// most 4096 hashes each (the master's batch limit); the call is bounded by
// ctx and Timeout, and its error says why the report did not land:
// unreachable (ErrUnavailable), refused (ErrRefused), no reply in time
// (context.DeadlineExceeded).
func (w *WorkerHandle) ReportExternalKv(ctx context.Context, tier Tier, hashes []string) error {
	return w.externalKv(ctx, "report external KV", tier, func(ctx context.Context, c *conn.Conn) (bool, error) {
		return c.ReportExternalKvBlocks(ctx, hashes, umbppb.TierType(tier))
	})
}

// RevokeExternalKv withdraws blocks reported on tier: the engine evicted
// them. Bounded and reported as ReportExternalKv.
func (w *WorkerHandle) RevokeExternalKv(ctx context.Context, tier Tier, hashes []string) error {
	return w.externalKv(ctx, "revoke external KV", tier, func(ctx context.Context, c *conn.Conn) (bool, error) {
		return c.RevokeExternalKvBlocks(ctx, hashes, umbppb.TierType(tier))
	})
}

// RevokeAllExternalKv withdraws every block this engine reported on tier.
func (w *WorkerHandle) RevokeAllExternalKv(ctx context.Context, tier Tier) error {
	return w.externalKv(ctx, "revoke all external KV", tier, func(ctx context.Context, c *conn.Conn) (bool, error) {
		return c.RevokeAllExternalKvBlocksAtTier(ctx, umbppb.TierType(tier))
	})
}

func (w *WorkerHandle) externalKv(ctx context.Context, op string, tier Tier, fn func(context.Context, *conn.Conn) (bool, error)) error {
	if err := checkTier(tier); err != nil {
		return opError(op, w.address, err)
	}
	ok, err := withConn(ctx, w, fn)
	if err == nil && !ok {
		err = fmt.Errorf("%w: the server answered that it did not", ErrRefused)
	}
	return opError(op, w.address, err)
}

// MatchExternalKv asks, through the server, which nodes hold hashes in the
// external KV index, without counting hits: one request of at most 4096
// hashes, bounded by ctx and Timeout. A local server finds nothing.
func (w *WorkerHandle) MatchExternalKv(ctx context.Context, hashes []string) ([]NodeBlocks, error) {
	out, err := withConn(ctx, w, func(ctx context.Context, c *conn.Conn) ([]NodeBlocks, error) {
		nm, err := standaloneSource{c: c, l: w.link}.match(ctx, hashes)
		if err != nil {
			return nil, err
		}
		out := make([]NodeBlocks, len(nm))
		for i, m := range nm {
			out[i] = nodeBlocksOf(m)
		}
		return out, nil
	})
	return out, opError("match external KV", w.address, err)
}

// withConn runs fn on the current connection, bounded by ctx and Timeout;
// a transport failure makes the link look at its server.
func withConn[T any](ctx context.Context, w *WorkerHandle, fn func(context.Context, *conn.Conn) (T, error)) (T, error) {
	var zero T
	if w.xfer.isClosed() {
		return zero, ErrClosed
	}
	c, err := w.link.current()
	if err != nil {
		return zero, err
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	v, err := fn(ctx, c)
	w.link.failed(err)
	return v, err
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
	if !w.xfer.close() {
		return nil
	}
	w.link.shutdown()
	// A registration under way finishes (within Timeout) before the regions
	// are taken; later ones see the handle closed.
	regCtx, regCancel := context.WithTimeout(context.Background(), w.timeout)
	if err := w.regions.lockReg(regCtx); err == nil {
		w.regions.unlockReg() // every later holder sees the handle closed
	}
	regCancel()
	w.xfer.pool.Shutdown()
	jobs := w.xfer.jobs.on(nil)
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
	for _, r := range w.regions.take() {
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
	return regions, opError("close", w.address, fmt.Errorf("%w: %s; buffers kept registered until it ends: %s", ErrBuffersAbandoned, reason, strings.Join(names, ", ")))
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

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

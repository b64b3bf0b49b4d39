package server

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// errClosed refuses registrations that arrive while the server closes.
var errClosed = errors.New("server: closed")

// regionKind tells how a region's memory is reached.
type regionKind int

const (
	// hostRegion: a memfd mapped MAP_SHARED into this process.
	hostRegion regionKind = iota
	// gpuRegion: device memory opened from an IPC handle.
	gpuRegion
)

func (k regionKind) String() string {
	if k == gpuRegion {
		return "gpu"
	}
	return "host"
}

// region is one registered buffer of a client, named by the client's
// address of it (base). Data ops hold a reference while they copy; a region
// replaced or deregistered meanwhile is retired and released (unmapped, its
// IPC handle dropped) by the last of them.
type region struct {
	client string
	base   uint64 // worker_base
	size   uint64
	kind   regionKind

	mem []byte // host: the mapping

	// gpu: the device, the region's device address (handle base + offset),
	// and the open handle it holds a reference on.
	device    int
	ptr       uintptr
	ipcOffset uint64
	allocBase uint64
	handle    *ipcHandle

	refs    int // data ops using it; guarded by regionTable.mu
	retired bool

	// owner is the process that registered it, when known; guarded by
	// regionTable.mu. Set to nil when the region leaves the table.
	owner *owner
}

// fits reports whether [off, off+size) lies inside r.
func (r *region) fits(off, size uint64) bool {
	return size <= r.size && off <= r.size-size
}

// ipcKey names an opened allocation: handles are opened once per client,
// device and allocation base.
type ipcKey struct {
	client    string
	device    int
	allocBase uint64
}

// ipcHandle is an opened IPC allocation shared by every region of it.
type ipcHandle struct {
	key    ipcKey
	handle [IPCHandleSize]byte
	ptr    uintptr // mapped base
	refs   int     // regions holding it; guarded by regionTable.mu
}

// clientRegions are one client's regions in registration order (the order
// "first region that fits" searches).
type clientRegions struct {
	list   []*region
	byBase map[uint64]*region
}

// regionTable holds every client's regions and the open IPC handles.
type regionTable struct {
	log *slog.Logger
	gpu GPUBackend

	// gpuMu serialises IPC opens and closes (a handle must not be opened
	// again while its previous mapping is being closed). It is taken before
	// mu, never while mu is held.
	gpuMu sync.Mutex

	bg sync.WaitGroup // handle releases in flight

	mu      sync.Mutex
	clients map[string]*clientRegions
	handles map[ipcKey]*ipcHandle
	closed  bool

	// owners are the client processes holding regions, by pid; toClose the
	// pidfds of those that hold none any more, closed (which ends their
	// watchers) outside the lock by releaseAll.
	owners  map[int32]*owner
	toClose []*os.File
	// reclaimedProcs and reclaimedRegions count the processes that exited
	// holding regions and the regions retired for them.
	reclaimedProcs, reclaimedRegions uint64

	watchers sync.WaitGroup // one per owner being watched
	watching atomic.Int32   // watchers running
}

func newRegionTable(log *slog.Logger, gpu GPUBackend) *regionTable {
	return &regionTable{
		log:     log,
		gpu:     gpu,
		clients: make(map[string]*clientRegions),
		handles: make(map[ipcKey]*ipcHandle),
		owners:  make(map[int32]*owner),
	}
}

// loc is a resolved range of memory: an offset into a referenced region.
type loc struct {
	r   *region
	off uint64
}

// lease holds references on the regions a data op resolved.
type lease struct {
	t       *regionTable
	regions []*region
}

// resolve maps the memory ranges a data op of client names, as its request
// does — range i is sizes[i] bytes at offs[i] of the region at bases[i] —
// to regions, taking one reference on each distinct region, and writes the
// results to out (len(out) == len(offs) == len(sizes)). A range with base 0,
// or every range when bases is empty, goes to the first region it fits.
// With allowEmpty a zero-size range resolves when its offset lies inside
// the region (ranged calls); otherwise size 0 fails. It returns false,
// holding nothing, when any range fails.
func (t *regionTable) resolve(client string, bases, offs, sizes []uint64, allowEmpty bool, out []loc) (*lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cr := t.clients[client]
	if cr == nil || t.closed {
		return nil, false
	}
	for i, off := range offs {
		size := sizes[i]
		if size == 0 && !allowEmpty {
			return nil, false
		}
		var r *region
		if len(bases) != 0 && bases[i] != 0 {
			if c := cr.byBase[bases[i]]; c != nil && c.fits(off, size) {
				r = c
			}
		} else {
			for _, c := range cr.list {
				if c.fits(off, size) {
					r = c
					break
				}
			}
		}
		if r == nil {
			return nil, false
		}
		out[i] = loc{r: r, off: off}
	}
	l := &lease{t: t}
	for _, lc := range out {
		if !containsRegion(l.regions, lc.r) {
			l.regions = append(l.regions, lc.r)
		}
	}
	for _, r := range l.regions {
		r.refs++
	}
	return l, true
}

func containsRegion(rs []*region, r *region) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// release drops the lease's references.
func (l *lease) release() {
	if l == nil {
		return
	}
	t := l.t
	var done []*region
	t.mu.Lock()
	for _, r := range l.regions {
		r.refs--
		if r.refs == 0 && r.retired {
			done = append(done, r)
		}
	}
	t.mu.Unlock()
	l.regions = nil
	if len(done) == 0 {
		return
	}
	// Unmapping (or closing a handle) is kept off the op's reply.
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		t.releaseAll(done)
	}()
}

// hasHost reports whether client registered a host region at base, by fd
// handoff, of at least size bytes.
func (t *regionTable) hasHost(client string, base, size uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	cr := t.clients[client]
	if cr == nil {
		return false
	}
	r := cr.byBase[base]
	return r != nil && r.kind == hostRegion && r.size >= size
}

// addHost records a mapped memfd as client's region at base, replacing any
// region there; p (nil when unknown, else taken over) is the process that
// registered it. On error the caller still owns mem.
func (t *regionTable) addHost(client string, base uint64, mem []byte, p *proc) error {
	r := &region{client: client, base: base, size: uint64(len(mem)), kind: hostRegion, mem: mem}
	old, err := t.install(r, p)
	t.releaseAll(old)
	return err
}

// install inserts r, owned by p (nil when unknown, else taken over),
// retiring a region at the same base (which keeps its position in the search
// order). It returns the retired regions that no op holds, for the caller to
// release outside the lock (releaseAll, which the caller must call, even
// with none).
func (t *regionTable) install(r *region, p *proc) ([]*region, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		if p != nil {
			t.toClose = append(t.toClose, p.pidfd)
		}
		return nil, errClosed
	}
	t.attachLocked(r, p)
	cr := t.clients[r.client]
	if cr == nil {
		cr = &clientRegions{byBase: make(map[uint64]*region)}
		t.clients[r.client] = cr
	}
	old := cr.byBase[r.base]
	cr.byBase[r.base] = r
	if old == nil {
		cr.list = append(cr.list, r)
		return nil, nil
	}
	for i, x := range cr.list {
		if x == old {
			cr.list[i] = r
			break
		}
	}
	old.retired = true
	t.detachLocked(old)
	if old.refs == 0 {
		return []*region{old}, nil
	}
	return nil, nil
}

// gpuRegistration is a validated GPU_IPC RegisterMemory.
type gpuRegistration struct {
	client    string
	base      uint64
	size      uint64
	device    int
	handle    [IPCHandleSize]byte
	ipcOffset uint64
	allocBase uint64
}

// addGPU registers a GPU region, opening its allocation's handle unless the
// client already has it open on that device; p (nil when unknown, else taken
// over) is the process that registered it. An identical registration is a
// no-op. A handle that differs from the one open for the same allocation base
// means the allocation was replaced: the regions on the old one are retired.
func (t *regionTable) addGPU(g gpuRegistration, p *proc) (err error) {
	if t.gpu == nil {
		p.close()
		return errors.New(MsgGPUUnsupported)
	}
	var done []*region
	defer func() {
		p.close() // unless install took it over
		t.releaseAll(done)
	}() // after gpuMu is unlocked
	t.gpuMu.Lock()
	defer t.gpuMu.Unlock()

	key := ipcKey{client: g.client, device: g.device, allocBase: g.allocBase}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errClosed
	}
	cr := t.clients[g.client]
	if cr != nil {
		if old := cr.byBase[g.base]; old != nil && old.kind == gpuRegion && old.size == g.size &&
			old.device == g.device && old.ipcOffset == g.ipcOffset && old.allocBase == g.allocBase &&
			old.handle.handle == g.handle {
			t.mu.Unlock()
			return nil
		}
	}
	h := t.handles[key]
	if h != nil && h.handle != g.handle {
		delete(t.handles, key)
		if cr != nil {
			done = append(done, t.retireLocked(cr, g.client, func(r *region) bool { return r.handle == h })...)
		}
		h = nil
	}
	if h != nil {
		h.refs++ // for the new region
	}
	t.mu.Unlock()

	if h == nil {
		ptr, err := t.gpu.OpenIPC(g.device, g.handle[:])
		if err != nil {
			return fmt.Errorf("hipIpcOpenMemHandle failed on device %d: %w", g.device, err)
		}
		h = &ipcHandle{key: key, handle: g.handle, ptr: ptr, refs: 1}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			if cerr := t.gpu.CloseIPC(g.device, ptr); cerr != nil {
				t.log.Warn("umbp server: close IPC handle", "device", g.device, "err", cerr)
			}
			return errClosed
		}
		t.handles[key] = h
		t.mu.Unlock()
	}
	r := &region{
		client: g.client, base: g.base, size: g.size, kind: gpuRegion,
		device: g.device, ptr: h.ptr + uintptr(g.ipcOffset),
		ipcOffset: g.ipcOffset, allocBase: g.allocBase, handle: h,
	}
	old, err := t.install(r, p)
	p = nil // install took it over
	if err != nil {
		done = append(done, r)
		return err
	}
	done = append(done, old...)
	return nil
}

// retireLocked removes the client's regions matching pred and returns those
// no op holds. t.mu must be held.
func (t *regionTable) retireLocked(cr *clientRegions, client string, pred func(*region) bool) []*region {
	var done []*region
	kept := cr.list[:0]
	for _, r := range cr.list {
		if !pred(r) {
			kept = append(kept, r)
			continue
		}
		delete(cr.byBase, r.base)
		r.retired = true
		t.detachLocked(r)
		if r.refs == 0 {
			done = append(done, r)
		}
	}
	clear(cr.list[len(kept):])
	cr.list = kept
	if len(cr.list) == 0 {
		delete(t.clients, client)
	}
	return done
}

// dropClient retires every region of client. Unknown clients are fine.
func (t *regionTable) dropClient(client string) int {
	t.mu.Lock()
	cr := t.clients[client]
	if cr == nil {
		t.mu.Unlock()
		return 0
	}
	n := len(cr.list)
	done := t.retireLocked(cr, client, func(*region) bool { return true })
	t.mu.Unlock()
	t.releaseAll(done)
	return n
}

// closeAll retires every region and refuses later registrations. Regions
// still held by an op are left to it (the server waits for ops first).
func (t *regionTable) closeAll() {
	t.mu.Lock()
	t.closed = true
	var done []*region
	for client, cr := range t.clients {
		done = append(done, t.retireLocked(cr, client, func(*region) bool { return true })...)
	}
	t.mu.Unlock()
	t.releaseAll(done)
}

// releaseAll unmaps host regions and drops GPU regions' handle references
// (in the background), closing handles that no region holds any more, and
// closes the pidfds of processes that hold no region any more. Neither lock
// may be held.
func (t *regionTable) releaseAll(rs []*region) {
	t.mu.Lock()
	closing := t.toClose
	t.toClose = nil
	t.mu.Unlock()
	for _, f := range closing {
		_ = f.Close() // ends its watcher
	}
	for _, r := range rs {
		switch r.kind {
		case hostRegion:
			if err := unix.Munmap(r.mem); err != nil {
				t.log.Warn("umbp server: unmap region", "client", r.client, "base", r.base, "err", err)
			}
			r.mem = nil
		case gpuRegion:
			// Closing a handle synchronises the device: keep it off the
			// caller's path (often a data op's reply). gpuMu keeps a later
			// open of the same allocation behind the close.
			h := r.handle
			r.handle = nil
			t.bg.Add(1)
			go func() {
				defer t.bg.Done()
				t.dropHandle(h)
			}()
		}
	}
}

// wait blocks until every release started so far has finished.
func (t *regionTable) wait() { t.bg.Wait() }

// waitWatchers blocks until every watcher has ended (after closeAll).
func (t *regionTable) waitWatchers() { t.watchers.Wait() }

func (t *regionTable) dropHandle(h *ipcHandle) {
	t.gpuMu.Lock()
	defer t.gpuMu.Unlock()
	t.mu.Lock()
	h.refs--
	last := h.refs == 0
	if last && t.handles[h.key] == h {
		delete(t.handles, h.key)
	}
	t.mu.Unlock()
	if !last {
		return
	}
	if err := t.gpu.CloseIPC(h.key.device, h.ptr); err != nil {
		t.log.Warn("umbp server: close IPC handle", "client", h.key.client, "device", h.key.device, "err", err)
	}
}

// stats fills the region part of s.
func (t *regionTable) stats(s *Stats) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.Clients = len(t.clients)
	for _, cr := range t.clients {
		s.Regions += len(cr.list)
	}
	s.GPUHandles = len(t.handles)
	s.ClientProcesses = len(t.owners)
	s.ReclaimedProcesses = t.reclaimedProcs
	s.ReclaimedRegions = t.reclaimedRegions
}

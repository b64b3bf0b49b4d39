package server

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// evictionReportEvery is how often, at most, the server logs that it
// evicted objects to make room: the first eviction is said at once, the
// ones after it summed at most this often (the metrics count each).
const evictionReportEvery = 30 * time.Second

// errNoSpace is matched by every reservation failure.
var errNoSpace = errors.New("DRAM tier has no room")

// object is one stored value: an extent of the arena. Its bytes are written
// once, before it is published, and only read afterwards.
type object struct {
	key   string
	off   uint64 // arena offset
	size  uint64 // object size (the extent is size rounded up to allocAlign)
	batch uint64 // the batch that stored it; 0 for single puts
	refs  int    // in-flight readers
	// dead: dropped (evicted, cleared or replaced) while readers held it;
	// its extent is freed by the last one.
	dead       bool
	prev, next *object // LRU list, most recent first
}

// pool is the DRAM tier: one anonymous mapping (the arena) reserved once,
// carved by an allocator, indexed by key, with LRU eviction. Capacity is
// counted in object bytes; extents are rounded up to allocAlign, so a pool
// full of tiny odd-sized objects may evict a little before its byte count is
// reached.
//
// One arena rather than one mapping per object lets a GPU backend pin the
// whole pool with a single host-register call, and keeps the Go heap out of
// it. Readers reference-count objects: an object evicted or cleared while a
// Get still copies out of it keeps its extent until that copy ends.
type pool struct {
	arena    []byte
	capacity uint64

	mu        sync.Mutex
	alloc     *allocator
	objects   map[string]*object
	head      *object // most recently used
	tail      *object // least recently used
	used      uint64  // bytes of stored, reserved and dead-but-read objects
	stored    uint64  // bytes of stored objects: what eviction can give back
	evictions uint64
	evicted   uint64 // bytes evicted
	// What the last eviction report said (evictionReportEvery apart at
	// least); log receives it.
	reported   evictionReport
	lastReport time.Time
	log        *slog.Logger

	batchSeq atomic.Uint64
	closed   bool
}

// newPool maps a pool of capacity bytes. With prefault every page is mapped
// now, at start-up, as a server that owns its pool outright would. log
// (when not nil) hears how a prefault goes, for it takes seconds a GiB,
// and what the pool evicts.
func newPool(capacity uint64, prefault bool, log *slog.Logger) (*pool, error) {
	page := uint64(os.Getpagesize())
	if capacity > math.MaxInt64-page {
		return nil, fmt.Errorf("server: capacity %d bytes is too large", capacity)
	}
	arenaLen := (capacity + page - 1) / page * page
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE
	if prefault {
		flags = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS // committed now
	}
	arena, err := unix.Mmap(-1, 0, int(arenaLen), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("server: map a DRAM pool of %d bytes: %w", arenaLen, err)
	}
	// Huge pages: a first write into the pool then faults once per 2 MiB,
	// not once per 4 KiB, which dominates a fresh pool's store throughput.
	// Best effort: kernels without transparent huge pages refuse it. The
	// advice comes before any page is mapped, or it has none to apply to.
	_ = unix.Madvise(arena, unix.MADV_HUGEPAGE)
	if prefault {
		populate(arena, page, log)
	}
	return &pool{
		arena:    arena,
		capacity: capacity,
		alloc:    newAllocator(arenaLen),
		objects:  make(map[string]*object),
		log:      log,
	}, nil
}

// Prefaulting goes in parts of prefaultPart bytes; progress is logged at
// most every prefaultReportEvery.
const (
	prefaultPart        = 64 << 20
	prefaultReportEvery = time.Second
)

// populate maps every page of arena now: MADV_POPULATE_WRITE (Linux 5.14),
// else a write to each page; it says on log (when not nil) how it goes.
func populate(arena []byte, page uint64, log *slog.Logger) {
	start := time.Now()
	total := uint64(len(arena))
	if log != nil {
		log.Info("umbp server: prefaulting the DRAM pool: every page is mapped before the server listens (-prefault=false skips it)", "bytes", total)
	}
	last := start
	for off := uint64(0); off < total; off += prefaultPart {
		part := arena[off:min(off+prefaultPart, total)]
		if unix.Madvise(part, unix.MADV_POPULATE_WRITE) != nil {
			for i := uint64(0); i < uint64(len(part)); i += page {
				part[i] = 0
			}
		}
		if now := time.Now(); log != nil && now.Sub(last) >= prefaultReportEvery && off+uint64(len(part)) < total {
			last = now
			done := off + uint64(len(part))
			log.Info("umbp server: prefaulting the DRAM pool", "done_bytes", done, "bytes", total, "percent", done*100/total)
		}
	}
	if log != nil {
		log.Info("umbp server: DRAM pool prefaulted", "bytes", total, "took", time.Since(start).Round(time.Millisecond))
	}
}

// base is the arena's address, for GPU copies and pinning.
func (p *pool) base() uintptr { return uintptr(unsafe.Pointer(&p.arena[0])) }

// close unmaps the arena. Every object must be released.
func (p *pool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.objects = nil
	p.head, p.tail = nil, nil
	if err := unix.Munmap(p.arena); err != nil {
		return fmt.Errorf("server: unmap the DRAM pool: %w", err)
	}
	p.arena = nil
	return nil
}

// newBatch returns a fresh non-zero batch id.
func (p *pool) newBatch() uint64 { return p.batchSeq.Add(1) }

// view is the arena bytes [o.off+off, o.off+off+n); the caller checked the range.
func (p *pool) view(o *object, off, n uint64) []byte {
	start := o.off + off
	return p.arena[start : start+n : start+n]
}

// addr is the arena address of byte off of o.
func (p *pool) addr(o *object, off uint64) uintptr {
	return p.base() + uintptr(o.off+off)
}

// wants reports whether a put of key by batch must store its value: false
// when the key is already stored by someone else (first writer wins). A key
// stored earlier by the same batch is stored again (the later value wins).
func (p *pool) wants(key string, batch uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.objects[key]
	return !ok || (batch != 0 && o.batch == batch)
}

// contains reports whether key is stored, touching it in the LRU order.
func (p *pool) contains(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.objects[key]
	if ok {
		p.touch(o)
	}
	return ok
}

// containsAll answers contains for every key under one lock. With leading,
// it stops at the first missing key and returns the count in n.
func (p *pool) containsAll(keys []string, leading bool) (found []bool, n int) {
	if !leading {
		found = make([]bool, len(keys))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, k := range keys {
		o, ok := p.objects[k]
		if ok {
			p.touch(o)
			n++
		}
		if leading {
			if !ok {
				break
			}
			continue
		}
		found[i] = ok
	}
	return found, n
}

// acquire returns the stored object for key with a reader reference, touched
// in the LRU order, or nil. The caller must release it.
func (p *pool) acquire(key string) *object {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.objects[key]
	if !ok {
		return nil
	}
	p.touch(o)
	o.refs++
	return o
}

// release drops a reader reference taken by acquire.
func (p *pool) release(o *object) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o.refs--
	if o.refs == 0 && o.dead {
		p.free(o)
	}
}

// reserve allocates an unpublished object of size bytes for batch, evicting
// least-recently-used objects until it fits. An object larger than the tier,
// or than what reservations in flight leave of it, is refused with nothing
// evicted.
func (p *pool) reserve(size, batch uint64) (*object, error) {
	p.mu.Lock()
	o, err := p.reserveLocked(size, batch)
	report := p.evictionReportLocked(time.Now())
	p.mu.Unlock()
	if report.objects > 0 && p.log != nil {
		p.log.Info("umbp server: the pool is full: least recently used objects were evicted to make room",
			"evicted", report.objects, "evicted_bytes", report.bytes, "over", report.over.Round(time.Millisecond),
			"capacity", p.capacity)
	}
	return o, err
}

// evictionReport is what the pool evicted over a stretch of time.
type evictionReport struct {
	objects, bytes uint64
	over           time.Duration
}

// evictionReportLocked returns the evictions to report now: those since
// the last report, if there are any and the last was evictionReportEvery
// ago at least (the first at once); else none. p.mu is held.
func (p *pool) evictionReportLocked(now time.Time) evictionReport {
	if p.evictions == p.reported.objects || (!p.lastReport.IsZero() && now.Sub(p.lastReport) < evictionReportEvery) {
		return evictionReport{}
	}
	r := evictionReport{objects: p.evictions - p.reported.objects, bytes: p.evicted - p.reported.bytes}
	if !p.lastReport.IsZero() {
		r.over = now.Sub(p.lastReport)
	}
	p.reported = evictionReport{objects: p.evictions, bytes: p.evicted}
	p.lastReport = now
	return r
}

// reserveLocked is reserve under p.mu.
func (p *pool) reserveLocked(size, batch uint64) (*object, error) {
	if p.closed {
		return nil, fmt.Errorf("%w: the pool is closed", errNoSpace)
	}
	if size == 0 {
		return nil, fmt.Errorf("%w: empty object", errNoSpace)
	}
	// Refuse what eviction cannot make room for before evicting anything.
	if size > p.capacity {
		return nil, fmt.Errorf("%w: an object of %d bytes is larger than the DRAM tier (%d bytes)", errNoSpace, size, p.capacity)
	}
	if held := p.used - p.stored; held > p.capacity-size {
		return nil, fmt.Errorf("%w: %d bytes wanted, %d of %d bytes held by transfers in flight", errNoSpace, size, held, p.capacity)
	}
	for {
		if p.used <= p.capacity-size {
			if off, ok := p.alloc.alloc(size); ok {
				p.used += size
				return &object{off: off, size: size, batch: batch}, nil
			}
		}
		victim := p.tail
		if victim == nil {
			break
		}
		p.unlink(victim)
		p.evictions++
		p.evicted += victim.size
	}
	return nil, fmt.Errorf("%w: %d bytes wanted, %d of %d bytes held by transfers and readers", errNoSpace, size, p.used, p.capacity)
}

// abort frees an object reserve returned that will not be published.
func (p *pool) abort(o *object) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free(o)
}

// publish stores a reserved, filled object under key. When key is already
// stored by someone else the first value stays, o is freed and publish
// returns false; a value stored earlier by o's own batch is replaced.
func (p *pool) publish(key string, o *object) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.objects[key]; ok {
		if o.batch == 0 || old.batch != o.batch {
			p.free(o)
			return false
		}
		p.unlink(old)
	}
	if p.closed {
		p.free(o)
		return false
	}
	// The pool's own copy: a request's key is a view of the whole request
	// (codec.go), which the pool must not keep for as long as the object.
	key = strings.Clone(key)
	o.key = key
	p.objects[key] = o
	p.pushFront(o)
	p.stored += o.size
	return true
}

// clear drops every stored object.
func (p *pool) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.head != nil {
		p.unlink(p.head)
	}
}

// stats fills the pool's part of s.
func (p *pool) stats(s *Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s.Objects = len(p.objects)
	s.BytesUsed = p.used
	s.Capacity = p.capacity
	s.ArenaBytes = uint64(len(p.arena))
	s.Evictions = p.evictions
}

// unlink removes a stored object from the map and the LRU list, freeing it
// unless a reader holds it.
func (p *pool) unlink(o *object) {
	delete(p.objects, o.key)
	p.remove(o)
	p.stored -= o.size
	if o.refs > 0 {
		o.dead = true
		return
	}
	p.free(o)
}

func (p *pool) free(o *object) {
	if p.closed {
		return
	}
	p.alloc.release(o.off, o.size)
	p.used -= o.size
}

func (p *pool) touch(o *object) {
	if p.head == o {
		return
	}
	p.remove(o)
	p.pushFront(o)
}

func (p *pool) pushFront(o *object) {
	o.prev = nil
	o.next = p.head
	if p.head != nil {
		p.head.prev = o
	}
	p.head = o
	if p.tail == nil {
		p.tail = o
	}
}

func (p *pool) remove(o *object) {
	if o.prev != nil {
		o.prev.next = o.next
	} else if p.head == o {
		p.head = o.next
	}
	if o.next != nil {
		o.next.prev = o.prev
	} else if p.tail == o {
		p.tail = o.prev
	}
	o.prev, o.next = nil, nil
}

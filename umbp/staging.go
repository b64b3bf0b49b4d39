package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// A server without ranged I/O stores each object from one contiguous
// segment, so the ranges of a multi-range plan are gathered into (or
// scattered from) a staging HostBuffer that the handle registers itself.

// stagingPool hands out registered staging buffers, one per concurrent use.
// It registers a new one itself, as one more of the handle's regions, with
// the server of the link's current connection.
//
// Two rules keep a staged transfer's bytes its own:
//   - A buffer is lent to one chunk at a time: get takes it off the free
//     list under the pool's lock, and only the chunk that holds it gives it
//     back (put), or sets it aside while a request on it is in doubt; put
//     refuses a buffer that is free already. Within a chunk, its items lie
//     at disjoint offsets (moveChunk lays them end to end).
//   - No plan can name a staging buffer: its region is the handle's own
//     (memRegion.own), never among those a plan resolves against
//     (regionSet.findLocked), and no caller may register it on any handle
//     (its HostBuffer is own too). So the server writes into a staging
//     buffer only for the chunk that holds it.
type stagingPool struct {
	regions *regionSet
	link    *link
	timeout time.Duration // bounds a new buffer's registration

	mu     sync.Mutex
	free   []*HostBuffer
	all    []*HostBuffer
	count  int
	closed bool
	// aside ends at close: it stops the waits of buffers set aside.
	aside       context.Context
	cancelAside context.CancelFunc
}

// newStagingPool returns a pool that registers its buffers into regions,
// on l's connection, each within timeout.
func newStagingPool(regions *regionSet, l *link, timeout time.Duration) *stagingPool {
	s := &stagingPool{regions: regions, link: l, timeout: timeout}
	s.aside, s.cancelAside = context.WithCancel(context.Background())
	return s
}

// register registers the staging buffer b with c's server as one more
// region, under the registration lock: with the current server only (a
// transfer still on a replaced connection gets none: errReconnecting), and
// then, as every region, with every later one. A closed handle's link
// refuses it (ErrClosed).
func (s *stagingPool) register(ctx context.Context, c *conn.Conn, b *HostBuffer, name string) error {
	if err := s.regions.lockReg(ctx); err != nil {
		return err
	}
	defer s.regions.unlockReg()
	cur, err := s.link.current()
	if err != nil {
		return err
	}
	if cur != c {
		return errReconnecting
	}
	return s.regions.addHost(ctx, c, b, name, true)
}

// get returns a registered staging buffer of at least size bytes; a new one
// is registered within ctx and the pool's timeout.
func (s *stagingPool) get(ctx context.Context, c *conn.Conn, size uint64) (*HostBuffer, error) {
	s.mu.Lock()
	for i, b := range s.free {
		if b.mappedSize() >= size {
			s.free = append(s.free[:i], s.free[i+1:]...)
			s.mu.Unlock()
			return b, nil
		}
	}
	s.count++
	n := s.count
	s.mu.Unlock()

	want := max(size, stagingMin)
	b, err := newHostBuffer(int(want), true)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.register(ctx, c, b, fmt.Sprintf("staging-%d", n)); err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("staging buffer: %w", err)
	}
	s.mu.Lock()
	s.all = append(s.all, b)
	s.mu.Unlock()
	return b, nil
}

// prepare readies, within ctx, on c's server, the staging buffer of size
// bytes (at most stagingChunk) that the first multi-range transfer on a
// server without ranged I/O would otherwise create, register and fault in
// on the engine's step: its pages touched, the server's mapping of it
// faulted in too. Failures are left to the first transfer, which makes the
// buffer itself; what failed goes to log at Debug.
func (s *stagingPool) prepare(ctx context.Context, c *conn.Conn, size uint64, log *slog.Logger) {
	size = min(size, stagingChunk)
	if size == 0 || c.Capabilities().RangedIO || s.has(size) {
		return
	}
	b, err := s.get(ctx, c, size)
	if err != nil {
		log.Debug("UMBP standalone staging buffer not prepared; the first staged transfer makes it", "err", err)
		return
	}
	b.prefault()
	switch err := warmStaging(ctx, c, b); {
	case err == nil:
	case errors.Is(err, errWarmUpAnswered):
		// The server answered: nothing of the warm-up is in flight, and
		// the buffer is used, if colder.
		log.Debug("UMBP standalone staging buffer not warmed up", "err", err)
	default:
		// The server may still be writing into it: used again only once
		// that server process has exited.
		log.Debug("UMBP standalone staging buffer not warmed up; the first staged transfer makes another", "err", err)
		s.setAside(c, b)
		return
	}
	s.put(b)
}

// errWarmUpAnswered is warmStaging's error when the server answered but did
// not store or load the warm-up object (a full pool, say).
var errWarmUpAnswered = errors.New("the server did not keep the warm-up object")

// warmStaging has the server write every page of the new staging buffer b
// once, within ctx (RegisterBuffers bounds it by Timeout): a server maps a
// registration lazily and takes a fault a page on its first write into it,
// which would otherwise fall on the first staged load (the first store's
// reads fault in a page run at a time, and cost little). It loads one small
// object of zeros into every part of b; the pool keeps that one object. An
// error leaves b in an unknown state: the server may still be writing into
// it, unless the error matches errWarmUpAnswered: the server answered every
// request, and b is free.
func warmStaging(ctx context.Context, c *conn.Conn, b *HostBuffer) error {
	base, n := uint64(b.base()), b.mappedSize()/warmUpSize
	if n == 0 {
		return nil
	}
	// b is all zeros: it was just created.
	stored, errs := c.BatchPut(ctx, []string{warmUpKey}, []conn.Segment{{RegionBase: base, Size: warmUpSize}})
	if errs != nil {
		return errs[0]
	}
	if !stored[0] {
		return fmt.Errorf("%w: the warm-up object was not stored", errWarmUpAnswered)
	}
	keys := make([]string, n)
	segs := make([]conn.Segment, n)
	for i := range keys {
		keys[i] = warmUpKey
		segs[i] = conn.Segment{RegionBase: base, Offset: uint64(i) * warmUpSize, Size: warmUpSize}
	}
	loaded, errs := c.BatchGet(ctx, keys, segs)
	if err := conn.Joined(errs); err != nil {
		return err
	}
	if slices.Contains(loaded, false) {
		return fmt.Errorf("%w: the warm-up object was not loaded everywhere", errWarmUpAnswered)
	}
	return nil
}

// has reports whether a free staging buffer of at least size bytes exists.
func (s *stagingPool) has(size uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.free {
		if b.mappedSize() >= size {
			return true
		}
	}
	return false
}

// put gives back the buffer b, which its holder no longer uses.
func (s *stagingPool) put(b *HostBuffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if slices.Contains(s.free, b) {
		// Two chunks would be handed the same memory: never continue.
		panic("umbp: a staging buffer was given back twice")
	}
	s.free = append(s.free, b)
}

// setAside keeps b, used by a request whose transport failed under it, out
// of use until the server process behind c, which may still be copying into
// or out of it, has exited; then b is free again (it stays registered, with
// the handle's other regions, on every later server). A server that cannot
// be watched, or one in this process (whose exit would never come), keeps
// it aside until close.
func (s *stagingPool) setAside(c *conn.Conn, b *HostBuffer) {
	if c.ServedInProcess() {
		return
	}
	go func() {
		if c.WaitPeersGone(s.aside) == nil {
			s.put(b)
		}
	}()
}

// close unmaps every staging buffer; the handle has released them.
func (s *stagingPool) close() {
	s.mu.Lock()
	all := s.all
	s.all, s.free, s.closed = nil, nil, true
	s.mu.Unlock()
	s.cancelAside()
	for _, b := range all {
		_ = b.Close()
	}
}

// hostBytes views n bytes of registered host memory at addr. The memory is
// a HostBuffer mapping, outside the Go heap.
func hostBytes(addr uintptr, n uint64) []byte {
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// move moves the multi-range items at indexes multi through staging
// buffers, chunk by chunk, recording each item's answer in r: a chunk that
// got no staging buffer sent nothing, and its items fail as not attempted.
func (s *stagingPool) move(ctx context.Context, c *conn.Conn, kind jobKind, items []item, multi []int, r *results) {
	for start := 0; start < len(multi); {
		end, total := start, uint64(0)
		for end < len(multi) && (end == start || total+items[multi[end]].obj.Size <= stagingChunk) {
			total += items[multi[end]].obj.Size
			end++
		}
		chunk := multi[start:end]
		if buf, err := s.get(ctx, c, total); err != nil {
			for _, k := range chunk {
				r.set(k, false, notAttempted(err))
			}
		} else {
			s.moveChunk(ctx, c, kind, buf, items, chunk, r)
		}
		start = end
	}
}

// moveChunk moves the items at indexes idx through buf, in one BatchPut or
// BatchGet, and gives buf back — once its server has exited, if a request
// is in doubt (that server may still be copying).
func (s *stagingPool) moveChunk(ctx context.Context, c *conn.Conn, kind jobKind, buf *HostBuffer, items []item, idx []int, r *results) {
	stage := buf.mem
	keys := make([]string, len(idx))
	segs := make([]conn.Segment, len(idx))
	var off uint64
	for i, k := range idx {
		obj := &items[k].obj
		keys[i] = obj.Key
		segs[i] = conn.Segment{RegionBase: uint64(buf.base()), Offset: off, Size: obj.Size}
		if kind == kindStore {
			for _, rg := range obj.Ranges {
				copy(stage[off+rg.ObjectOffset:off+rg.ObjectOffset+rg.Size], hostBytes(uintptr(rg.RegionBase+rg.Offset), rg.Size))
			}
		}
		off += obj.Size
	}
	ok, errs := segments(ctx, c, kind, keys, segs)
	for i, k := range idx {
		if ok[i] && kind == kindLoad {
			obj := &items[k].obj
			base := segs[i].Offset
			for _, rg := range obj.Ranges {
				copy(hostBytes(uintptr(rg.RegionBase+rg.Offset), rg.Size), stage[base+rg.ObjectOffset:base+rg.ObjectOffset+rg.Size])
			}
		}
	}
	r.from(idx, ok, errs)
	if slices.ContainsFunc(errs, inDoubt) {
		s.setAside(c, buf)
	} else {
		s.put(buf)
	}
}

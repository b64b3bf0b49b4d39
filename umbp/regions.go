package umbp

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/hip"
)

// memRegion is one registered allocation: a HostBuffer's mapping, or a
// whole GPU allocation.
type memRegion struct {
	names []string // the buffers registered in it
	base  uintptr
	size  uint64
	loc   MemoryLocation
	host  *HostBuffer // host memory
	gpu   *gpuAlloc   // GPU memory
	// own marks memory the handle registered for itself (a staging
	// buffer): registered with every server as the others are, but no
	// plan may name it.
	own bool
}

func (r *memRegion) contains(addr uintptr, n uint64) bool {
	return addr >= r.base && uint64(addr-r.base) <= r.size && n <= r.size-uint64(addr-r.base)
}

// register registers r's memory with the server behind c.
func (r *memRegion) register(ctx context.Context, c *conn.Conn) error {
	switch {
	case r.host != nil:
		return c.RegisterHost(ctx, r.host.fd, r.base, r.size)
	case r.gpu != nil:
		return r.gpu.register(ctx, c, r.base, r.size)
	}
	return nil
}

// gpuAlloc is a device allocation registered with the server: what its
// registration sent, kept so that the region can be registered again (with
// a restarted server).
type gpuAlloc struct {
	device    int
	allocBase uintptr
	allocSize uint64
	handle    hip.IpcMemHandle // exported from allocBase
}

// register registers size bytes at base, inside the allocation, with the
// server c is attached to.
func (g *gpuAlloc) register(ctx context.Context, c *conn.Conn, base uintptr, size uint64) error {
	if base < g.allocBase || size > g.allocSize || uint64(base-g.allocBase) > g.allocSize-size {
		return fmt.Errorf("GPU region %#x+%d lies outside its allocation %#x+%d", base, size, g.allocBase, g.allocSize)
	}
	return c.RegisterGPU(ctx, conn.GPURegion{
		Device:    g.device,
		Base:      base,
		Size:      size,
		Handle:    [conn.IPCHandleSize]byte(g.handle),
		IPCOffset: uint64(base - g.allocBase),
		AllocBase: g.allocBase,
	})
}

// regionSet is a worker handle's registered memory: its regions, sorted by
// base, and the buffers registered in them by name, under its own lock.
// Its registration lock (a mutex that honours contexts) orders
// registrations with the re-registration that follows a server restart,
// and with Close, so that no region is registered with one server only or
// after Close.
//
// A plan resolves against the caller's regions alone: the allocations that
// hold the buffers the caller registered on this handle (a whole
// HostBuffer, a whole GPU allocation). The handle's own regions (its
// staging buffers) are registered with every server as the others are but
// are not among them, so no plan can name them.
type regionSet struct {
	sem chan struct{} // the registration lock

	mu     sync.Mutex
	list   []*memRegion      // every region, sorted by base, the handle's own included
	caller []*memRegion      // the caller's regions, sorted by base: what plans resolve against
	named  map[string]Buffer // each registered buffer, by name
}

func newRegionSet() *regionSet {
	return &regionSet{sem: make(chan struct{}, 1), named: map[string]Buffer{}}
}

// lockReg takes the registration lock, or gives up when ctx ends.
func (s *regionSet) lockReg(ctx context.Context) error {
	select {
	case s.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for another registration: %w", ctx.Err())
	}
}

func (s *regionSet) unlockReg() { <-s.sem }

// claim records that name registers b, and reports whether that is new.
// The same name and memory again is accepted and changes nothing; a name
// already given to other memory, or memory already registered under another
// name, is refused. (Buffers may overlap: a whole KV cache and a layer of
// it, say.)
func (s *regionSet) claim(name string, b Buffer) (fresh bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.named[name]; ok {
		if prev.Ptr != b.Ptr || prev.Size != b.Size {
			return false, fmt.Errorf("%w: the name is already registered for %d bytes at %#x", ErrInvalidBuffer, prev.Size, prev.Ptr)
		}
		return false, nil
	}
	for other, o := range s.named {
		if o.Ptr == b.Ptr && o.Size == b.Size {
			return false, fmt.Errorf("%w: the same %d bytes at %#x are already registered as %q", ErrInvalidBuffer, b.Size, b.Ptr, other)
		}
	}
	s.named[name] = b
	return true, nil
}

// registerAll registers every region with the server behind c, under the
// registration lock: what a new connection of the link carries before it
// is used.
func (s *regionSet) registerAll(ctx context.Context, c *conn.Conn) error {
	if err := s.lockReg(ctx); err != nil {
		return err
	}
	defer s.unlockReg()
	for _, r := range s.all() {
		if err := r.register(ctx, c); err != nil {
			return fmt.Errorf("register %s again: %w", strings.Join(r.names, ", "), err)
		}
	}
	return nil
}

// addHost registers the HostBuffer b, named name, with the server behind c
// and adds it as a region; own says the handle registers it for itself (a
// staging buffer, which no plan may name). The caller holds the
// registration lock.
func (s *regionSet) addHost(ctx context.Context, c *conn.Conn, b *HostBuffer, name string, own bool) error {
	if err := b.acquire(); err != nil {
		return err
	}
	r := &memRegion{names: []string{name}, base: b.base(), size: b.mappedSize(), loc: LocationHost, host: b, own: own}
	if err := r.register(ctx, c); err != nil {
		b.release()
		return err
	}
	s.add(r)
	return nil
}

// unclaim forgets a name whose registration failed.
func (s *regionSet) unclaim(name string) {
	s.mu.Lock()
	delete(s.named, name)
	s.mu.Unlock()
}

// add inserts a newly registered region.
func (s *regionSet) add(r *memRegion) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = insertByBase(s.list, r)
	if !r.own {
		s.caller = insertByBase(s.caller, r)
	}
}

func insertByBase(list []*memRegion, r *memRegion) []*memRegion {
	i := sort.Search(len(list), func(i int) bool { return list[i].base > r.base })
	return slices.Insert(list, i, r)
}

// addHostName adds name to the region of hb if there is one, and reports
// whether there was.
func (s *regionSet) addHostName(name string, hb *HostBuffer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.list {
		if r.host == hb {
			r.names = append(r.names, name)
			return true
		}
	}
	return false
}

// addGPUName adds name to the region of the allocation g describes if it
// is registered, and reports whether it was. With replace, a region at the
// same device and address takes g (the server has replaced it); without,
// only a region of that very allocation (same handle and size) counts.
func (s *regionSet) addGPUName(name string, g *gpuAlloc, replace bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.list {
		if r.gpu == nil || r.gpu.device != g.device || r.gpu.allocBase != g.allocBase {
			continue
		}
		if replace {
			r.gpu, r.size = g, g.allocSize
		} else if r.gpu.handle != g.handle || r.gpu.allocSize != g.allocSize {
			return false
		}
		r.names = append(r.names, name)
		return true
	}
	return false
}

// all returns the regions, in order.
func (s *regionSet) all() []*memRegion {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.list)
}

// take returns the regions and leaves none: the handle is releasing them.
func (s *regionSet) take() []*memRegion {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.list
	s.list, s.caller = nil, nil
	return list
}

// findLocked returns the caller's region that holds [addr, addr+n), or
// nil; s.mu is held. It is the one place a plan's range is resolved, for
// every transport.
func (s *regionSet) findLocked(addr uintptr, n uint64) *memRegion {
	i := sort.Search(len(s.caller), func(i int) bool { return s.caller[i].base > addr })
	if i == 0 {
		return nil
	}
	if r := s.caller[i-1]; r.contains(addr, n) {
		return r
	}
	return nil
}

// outsideLocked says why [addr, addr+n), which no caller region holds,
// cannot be named by a plan; s.mu is held.
func (s *regionSet) outsideLocked(addr uintptr, n uint64) string {
	end := addr + uintptr(n)
	if end < addr {
		end = ^uintptr(0)
	}
	var caller *memRegion
	for _, r := range s.list {
		if addr >= r.base+uintptr(r.size) || end <= r.base {
			continue
		}
		if r.own {
			return "overlaps memory the handle registered for itself (" + strings.Join(r.names, ", ") + "), not memory registered on it"
		}
		caller = r
	}
	if caller != nil {
		return "runs past the memory registered as " + strings.Join(caller.names, ", ")
	}
	return "lies in no memory registered on the handle"
}

package server

import (
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// safeCopy copies src to dst, turning a memory fault into an error. A client
// may shrink its memfd after registering it; touching the pages past the new
// end raises SIGBUS, which must fail the op, not crash the server.
func safeCopy(dst, src []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("server: memory fault while copying %d bytes: %v", len(src), r)
		}
	}()
	copy(dst, src)
	return nil
}

// copyBatch makes one request's copies between regions and the pool. Host
// copies happen at once; GPU copies are queued and made together by wait, so
// that an object of many ranges, or a batch of many objects, costs the GPU
// one synchronisation rather than one per range. Every copy belongs to an
// item (an object of the request): wait reports failures per item. Pool
// memory a queued copy touches must stay reserved or acquired, and the
// regions leased, until wait returns. Items queue in order: an item's copies
// are queued before the next item's.
type copyBatch struct {
	s     *Server
	gpu   []GPUCopy
	items []int // per queued GPU copy, its item
}

// toPool copies n bytes at l into o at objOff for item. A host copy's error
// is returned; a GPU copy's comes from wait.
func (b *copyBatch) toPool(item int, l loc, o *object, objOff, n uint64) error {
	r := l.r
	if r.kind == gpuRegion {
		b.queue(item, GPUCopy{Device: r.device, GPU: r.ptr + uintptr(l.off), Pool: b.s.pool.addr(o, objOff), N: n, ToPool: true})
		return nil
	}
	return safeCopy(b.s.pool.view(o, objOff, n), r.mem[l.off:l.off+n])
}

// fromPool copies n bytes of o at objOff to l for item, as toPool.
func (b *copyBatch) fromPool(item int, o *object, objOff uint64, l loc, n uint64) error {
	r := l.r
	if r.kind == gpuRegion {
		b.queue(item, GPUCopy{Device: r.device, GPU: r.ptr + uintptr(l.off), Pool: b.s.pool.addr(o, objOff), N: n})
		return nil
	}
	return safeCopy(r.mem[l.off:l.off+n], b.s.pool.view(o, objOff, n))
}

func (b *copyBatch) queue(item int, c GPUCopy) {
	b.gpu = append(b.gpu, c)
	b.items = append(b.items, item)
}

// wait makes the queued GPU copies and calls failed once for each item one
// of whose copies failed, with that copy's error. The batch is then empty.
func (b *copyBatch) wait(failed func(item int, err error)) {
	if len(b.gpu) == 0 {
		return
	}
	errs := b.s.gpu.Copy(b.gpu)
	if errs != nil && len(errs) != len(b.gpu) {
		// A backend that miscounts: no copy can be trusted.
		err := fmt.Errorf("server: the GPU backend returned %d results for %d copies", len(errs), len(b.gpu))
		errs = make([]error, len(b.gpu))
		for i := range errs {
			errs[i] = err
		}
	}
	last := -1
	for i, err := range errs {
		if err == nil || b.items[i] == last {
			continue
		}
		last = b.items[i]
		c := b.gpu[i]
		dir := "from"
		if !c.ToPool {
			dir = "to"
		}
		failed(last, fmt.Errorf("server: copy %d bytes %s device %d: %w", c.N, dir, c.Device, err))
	}
	b.gpu, b.items = b.gpu[:0], b.items[:0]
}

// toPool copies n bytes at l into o at objOff.
func (s *Server) toPool(l loc, o *object, objOff, n uint64) error {
	b := copyBatch{s: s}
	return b.one(b.toPool(0, l, o, objOff, n))
}

// fromPool copies n bytes of o at objOff to l.
func (s *Server) fromPool(o *object, objOff uint64, l loc, n uint64) error {
	b := copyBatch{s: s}
	return b.one(b.fromPool(0, o, objOff, l, n))
}

// one ends a batch of one copy: the host copy's error err, or else the
// queued GPU copy's.
func (b *copyBatch) one(err error) error {
	b.wait(func(_ int, e error) { err = e })
	return err
}

// opTracker counts the handlers that touch regions or the pool, so that
// Close unmaps nothing while one runs, and refuses new ones once Close began.
type opTracker struct {
	mu      sync.Mutex
	n       int
	closing bool
	idle    chan struct{} // closed once closing and n == 0
}

func newOpTracker() *opTracker { return &opTracker{idle: make(chan struct{})} }

// begin registers an op; false means the server is shutting down.
func (t *opTracker) begin() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return false
	}
	t.n++
	return true
}

func (t *opTracker) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.closing && t.n == 0 {
		close(t.idle)
	}
}

func (t *opTracker) isClosing() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closing
}

// shutdown refuses new ops.
func (t *opTracker) shutdown() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return
	}
	t.closing = true
	if t.n == 0 {
		close(t.idle)
	}
}

// wait reports whether every op ended within d (after shutdown).
func (t *opTracker) wait(d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-t.idle:
		return true
	case <-tm.C:
		return false
	}
}

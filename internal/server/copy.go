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

// toPool copies n bytes at l into o at objOff.
func (s *Server) toPool(l loc, o *object, objOff, n uint64) error {
	r := l.r
	if r.kind == gpuRegion {
		if err := s.gpu.CopyToPool(r.device, s.pool.addr(o, objOff), r.ptr+uintptr(l.off), n); err != nil {
			return fmt.Errorf("server: copy %d bytes from device %d: %w", n, r.device, err)
		}
		return nil
	}
	return safeCopy(s.pool.view(o, objOff, n), r.mem[l.off:l.off+n])
}

// fromPool copies n bytes of o at objOff to l.
func (s *Server) fromPool(o *object, objOff uint64, l loc, n uint64) error {
	r := l.r
	if r.kind == gpuRegion {
		if err := s.gpu.CopyFromPool(r.device, r.ptr+uintptr(l.off), s.pool.addr(o, objOff), n); err != nil {
			return fmt.Errorf("server: copy %d bytes to device %d: %w", n, r.device, err)
		}
		return nil
	}
	return safeCopy(r.mem[l.off:l.off+n], s.pool.view(o, objOff, n))
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

package server

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/umbp-go/umbp-go/internal/slicepool"
)

// copyBatch makes one request's copies between regions and the pool. Copies
// are queued and made together by wait: GPU copies in one call of the
// backend, so that an object of many ranges, or a batch of many objects,
// costs the GPU one synchronisation rather than one per range; host copies
// spread over several goroutines once there are enough bytes, so that one
// large request is copied as fast as several. Every copy belongs to an item
// (an object of the request): wait reports failures per item. Pool memory a
// queued copy touches must stay reserved or acquired, and the regions
// leased, until wait returns. Items queue in order: an item's copies are
// queued before the next item's.
type copyBatch struct {
	s     *Server
	gpu   []GPUCopy
	items []int // per queued GPU copy, its item
	host  []hostCopy
	bytes uint64 // of the queued host copies
}

// hostCopy is a queued copy between host memory and the pool.
type hostCopy struct {
	item     int
	dst, src []byte
}

// Host copies of a batch are spread over up to maxCopyWorkers goroutines
// (and GOMAXPROCS) once they hold parallelCopyMin bytes, in chunks of at
// most copyChunk bytes.
const (
	maxCopyWorkers  = 8
	parallelCopyMin = 2 << 20
	copyChunk       = 1 << 20
)

// Copies of at least coldCopyMin bytes (their pieces included) are made
// with non-temporal stores (copyCold), which write whole cache lines to
// memory without first reading them into the cache: on a 2-core AMD EPYC
// host two goroutines moved 256 MiB between memfd memory and the pool at
// 1.6–1.75 times the rate of cached stores, in pieces of 64 KiB to 1 MiB.
// The runtime's copy makes such stores only in calls of 1 MiB or more, and
// on Intel CPUs with fast string moves uses REP MOVS for an aligned
// destination instead, so the server does not leave the choice to it.
// Smaller copies (ranges of a few KiB) stay with copy.
const coldCopyMin = 64 << 10

// toPool queues the copy of n bytes at l into o at objOff for item.
func (b *copyBatch) toPool(item int, l loc, o *object, objOff, n uint64) {
	r := l.r
	if r.kind == gpuRegion {
		b.queue(item, GPUCopy{Device: r.device, GPU: r.ptr + uintptr(l.off), Pool: b.s.pool.addr(o, objOff), N: n, ToPool: true})
		return
	}
	b.queueHost(item, b.s.pool.view(o, objOff, n), r.mem[l.off:l.off+n])
}

// fromPool queues the copy of n bytes of o at objOff to l for item.
func (b *copyBatch) fromPool(item int, o *object, objOff uint64, l loc, n uint64) {
	r := l.r
	if r.kind == gpuRegion {
		b.queue(item, GPUCopy{Device: r.device, GPU: r.ptr + uintptr(l.off), Pool: b.s.pool.addr(o, objOff), N: n})
		return
	}
	b.queueHost(item, r.mem[l.off:l.off+n], b.s.pool.view(o, objOff, n))
}

func (b *copyBatch) queue(item int, c GPUCopy) {
	b.gpu = append(b.gpu, c)
	b.items = append(b.items, item)
}

// newCopyBatch returns a batch for a request of about n copies; the
// request releases it when it is done with it.
func (s *Server) newCopyBatch(n int) copyBatch {
	return copyBatch{s: s, host: hostCopyLists.Get(n)[:0]}
}

// hostCopyLists recycles batches' host copy lists (a ranged request of 8192
// ranges makes a list of half a MiB); lists of up to 64 Ki copies (3.5 MiB)
// are kept.
var hostCopyLists = slicepool.New[hostCopy](1 << 16)

// release gives the batch's copy list back for another request. The batch
// is not used again.
func (b *copyBatch) release() {
	hostCopyLists.Put(b.host)
	b.host = nil
}

func (b *copyBatch) queueHost(item int, dst, src []byte) {
	b.host = append(b.host, hostCopy{item: item, dst: dst, src: src})
	b.bytes += uint64(len(src))
}

// copyHost makes the queued host copies and returns each one's error (nil
// when all succeeded). The copies are cut into units of about copyChunk
// bytes (many small copies, or a piece of a large one); with enough bytes,
// several goroutines take units in turn.
func (b *copyBatch) copyHost() []error {
	if len(b.host) == 0 {
		return nil
	}
	if b.s != nil { // nil in tests of the copier alone
		if h := b.s.hostCopyHook.Load(); h != nil {
			(*h)() // tests: a copy that stalls
		}
	}
	workers := min(runtime.GOMAXPROCS(0), maxCopyWorkers, int(b.bytes/copyChunk)+1)
	if b.bytes < parallelCopyMin || workers < 2 {
		// One goroutine: the whole batch is one unit.
		last := len(b.host) - 1
		return b.faultErrors(b.runUnit(copyUnit{first: 0, lo: 0, last: last, hi: len(b.host[last].src)}))
	}
	var units []copyUnit
	cur := copyUnit{first: 0, lo: 0}
	var curBytes int
	for i, c := range b.host {
		for lo := 0; lo < len(c.src); {
			hi := min(len(c.src), lo+copyChunk-curBytes)
			curBytes += hi - lo
			lo = hi
			if curBytes >= copyChunk {
				cur.last, cur.hi = i, hi
				units = append(units, cur)
				cur, curBytes = copyUnit{first: i, lo: hi}, 0
				if hi == len(c.src) {
					cur = copyUnit{first: i + 1, lo: 0}
				}
			}
		}
	}
	if curBytes > 0 {
		last := len(b.host) - 1
		cur.last, cur.hi = last, len(b.host[last].src)
		units = append(units, cur)
	}
	var mu sync.Mutex
	var faults []copyFault
	workers = min(workers, len(units))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				k := int(next.Add(1)) - 1
				if k >= len(units) {
					return
				}
				if f := b.runUnit(units[k]); f != nil {
					mu.Lock()
					faults = append(faults, f...)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return b.faultErrors(faults)
}

// faultErrors turns faults into copyHost's answer: nil without faults.
func (b *copyBatch) faultErrors(faults []copyFault) []error {
	if len(faults) == 0 {
		return nil
	}
	errs := make([]error, len(b.host))
	for _, f := range faults {
		errs[f.copy] = f.err
	}
	return errs
}

// copyFault is a queued host copy that a memory fault stopped.
type copyFault struct {
	copy int
	err  error
}

// copyUnit is the bytes of queued host copies first to last that one
// goroutine copies: from byte lo of copy first to byte hi of copy last.
type copyUnit struct {
	first, lo int
	last, hi  int
}

// runUnit makes u's copies and returns those a memory fault stopped (a
// client may shrink its memfd after registering it: touching the pages
// past its new end must fail the op, not crash the server).
func (b *copyBatch) runUnit(u copyUnit) (faults []copyFault) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	i := u.first
	for i <= u.last {
		if err := b.copyFrom(u, &i); err != nil {
			faults = append(faults, copyFault{i, err})
			i++
		}
	}
	return faults
}

// copyFrom copies u's copies from *i on, advancing *i; a memory fault
// stops it with *i at the copy that faulted.
func (b *copyBatch) copyFrom(u copyUnit, i *int) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("server: memory fault while copying %d bytes: %v", len(b.host[*i].src), r)
		}
	}()
	for ; *i <= u.last; *i++ {
		c := b.host[*i]
		lo, hi := 0, len(c.src)
		if *i == u.first {
			lo = u.lo
		}
		if *i == u.last {
			hi = u.hi
		}
		if len(c.src) >= coldCopyMin {
			copyCold(c.dst[lo:hi], c.src[lo:hi])
		} else {
			copy(c.dst[lo:hi], c.src[lo:hi])
		}
	}
	return nil
}

// wait makes the queued copies and calls failed for each item one of whose
// copies failed, with that copy's error: at most once for its host copies
// and once for its GPU copies. The batch is then empty.
func (b *copyBatch) wait(failed func(item int, err error)) {
	hostErrs := b.copyHost()
	last := -1
	for i, err := range hostErrs {
		if err != nil && b.host[i].item != last {
			last = b.host[i].item
			failed(last, err)
		}
	}
	clear(b.host)
	b.host, b.bytes = b.host[:0], 0
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
	last = -1
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
	b.toPool(0, l, o, objOff, n)
	return b.one()
}

// fromPool copies n bytes of o at objOff to l.
func (s *Server) fromPool(o *object, objOff uint64, l loc, n uint64) error {
	b := copyBatch{s: s}
	b.fromPool(0, o, objOff, l, n)
	return b.one()
}

// one makes a batch of one copy and returns its error.
func (b *copyBatch) one() (err error) {
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

package umbp_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
)

// soakLookupConns bounds a handle's lock-step connections (a scheduler's
// lookups, a worker's transfers): h2call's default, 4 or GOMAXPROCS when
// that is more.
func soakLookupConns() int { return max(4, runtime.GOMAXPROCS(0)) }

// fdCounts are this process's open pidfds and sockets.
type fdCounts struct{ pidfds, sockets int }

func countFDs(t *testing.T) fdCounts {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var c fdCounts
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		switch {
		case err != nil: // closed since it was listed
		case target == "anon_inode:[pidfd]":
			c.pidfds++
		case strings.HasPrefix(target, "socket:"):
			c.sockets++
		}
	}
	return c
}

// soakLayer is one region of an engine's layout.
type soakLayer struct {
	blockBytes, stride uint64
	sub                int
}

// soakLayouts differ per engine, each making objects of soakObjectSize: so
// an object stored through one layout is scattered into another's on load.
var soakLayouts = [][]soakLayer{
	{{2048, 2048, 0}, {2048, 2048, 0}},                                   // two layers, packed
	{{1024, 1536, 0}, {1024, 1536, 0}, {1024, 1536, 0}, {1024, 1536, 0}}, // four layers, gaps between blocks
	{{4096, 1024, 4}}, // one layer of four sub-blocks each
}

// soakKeyHash seeds a key's content.
func soakKeyHash(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

// soakContent is byte off of the object stored under the key whose hash is
// h. Every engine stores the same bytes under a key, so whatever engine
// stored it, a load that completes can be checked byte for byte.
func soakContent(h, off uint64) byte {
	v := h ^ (off+1)*0x9E3779B97F4A7C15
	v ^= v >> 31
	v *= 0xBF58476D1CE4E5B9
	v ^= v >> 29
	return byte(v)
}

// soakPoison is written into a load's destination first, so that a load
// reported complete that wrote nothing is caught.
const soakPoison = 0xA5

func soakKey(i int) string { return fmt.Sprintf("soak/blk-%04d", i) }

// soakBound is what a kind of call may take.
type soakBound struct {
	bound   time.Duration // its documented bound; 0 means "at once"
	allowed time.Duration // bound plus scheduling margin: beyond is a hang
}

// soakRun collects the soak's figures. Its methods are safe for concurrent
// use; none calls t.Fatal, so they serve every goroutine.
type soakRun struct {
	bounds map[string]soakBound

	mu         sync.Mutex
	ops        map[string]int
	longest    map[string]time.Duration
	overruns   []string
	mismatches int // keys whose bytes differed
	badBytes   int
	verified   int // loaded keys checked byte for byte
	errs       []string
}

func (s *soakRun) count(name string, n int) {
	s.mu.Lock()
	s.ops[name] += n
	s.mu.Unlock()
}

// timed records how long the call named name took since start.
func (s *soakRun) timed(name string, start time.Time) time.Duration {
	d := time.Since(start)
	b, ok := s.bounds[name]
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok {
		s.errs = append(s.errs, "no bound for call "+name)
		return d
	}
	s.ops["call/"+name]++
	if d > s.longest[name] {
		s.longest[name] = d
	}
	if d > b.allowed && len(s.overruns) < 20 {
		s.overruns = append(s.overruns, fmt.Sprintf("%s took %v (bound %v, allowed %v) at %s", name, d, b.bound, b.allowed, time.Now().Format("15:04:05.000")))
	}
	return d
}

// fail records a failure; the test goroutine reports it.
func (s *soakRun) fail(format string, args ...any) {
	s.mu.Lock()
	if len(s.errs) < 50 {
		s.errs = append(s.errs, fmt.Sprintf(format, args...))
	}
	s.mu.Unlock()
}

func (s *soakRun) checked(key, engine string, bad int, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.verified++
	if bad == 0 {
		return
	}
	s.mismatches++
	s.badBytes += bad
	if len(s.errs) < 50 {
		s.errs = append(s.errs, fmt.Sprintf("byte mismatch: engine %s key %s: %d bytes differ (%s)", engine, key, bad, detail))
	}
}

// soakEngine is one worker handle with its own memory and layout. Its
// blocks and jobs are touched only by the goroutine driving it.
type soakEngine struct {
	name string
	w    *umbp.WorkerHandle
	buf  *umbp.HostBuffer
	plan *umbp.LayoutPlanner
	rng  *rand.Rand

	busy [soakBlocks]bool // a job that has not ended holds the block
	out  []*soakJob       // jobs not seen ended yet
}

type soakJob struct {
	job    *umbp.TransferJob
	kind   string // "store" or "load"
	blocks []int
}

func newSoakEngine(t *testing.T, rt *umbp.StandaloneRuntime, name string, layers []soakLayer, seed uint64) *soakEngine {
	t.Helper()
	spans := make([]uint64, len(layers))
	total := uint64(0)
	for i, l := range layers {
		sub := uint64(max(l.sub, 1))
		spans[i] = (soakBlocks*sub-1)*l.stride + l.blockBytes/sub
		total += (spans[i] + 63) &^ 63
	}
	buf, err := umbp.NewHostBuffer(int(total))
	if err != nil {
		t.Fatal(err)
	}
	layout := &umbp.KVLayoutDescriptor{}
	at := buf.Buffer().Ptr
	for i, l := range layers {
		layout.Regions = append(layout.Regions, umbp.KVRegion{
			LayerName:   fmt.Sprintf("%s.layer%d", name, i),
			BaseAddress: at,
			NumBlocks:   soakBlocks,
			BlockBytes:  l.blockBytes,
			Stride:      l.stride,
			SubBlocks:   l.sub,
		})
		at += uintptr((spans[i] + 63) &^ 63)
	}
	if got := layout.ObjectSize(0); got != soakObjectSize {
		t.Fatalf("engine %s: object size %d, want %d", name, got, soakObjectSize)
	}
	plan, err := umbp.NewLayoutPlanner(layout)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w, err := rt.NewWorkerHandle(ctx, layout)
	if err != nil {
		_ = buf.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { // on failure; the soak closes them itself
		_ = w.Close()
		_ = buf.Close()
	})
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{name: buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	return &soakEngine{name: name, w: w, buf: buf, plan: plan, rng: rand.New(rand.NewPCG(seed, uint64(len(name))))}
}

// fill writes each plan's key content into its ranges.
func (e *soakEngine) fill(plans []umbp.BlockTransferPlan) {
	mem, base := e.buf.Bytes(), e.buf.Buffer().Ptr
	for _, p := range plans {
		h := soakKeyHash(p.Key)
		for _, r := range p.Ranges {
			off := uint64(r.BaseAddress - base)
			for i := range r.Length {
				mem[off+i] = soakContent(h, r.ObjectOffset+i)
			}
		}
	}
}

// poison overwrites the plans' ranges with soakPoison.
func (e *soakEngine) poison(plans []umbp.BlockTransferPlan) {
	mem, base := e.buf.Bytes(), e.buf.Buffer().Ptr
	for _, p := range plans {
		for _, r := range p.Ranges {
			off := uint64(r.BaseAddress - base)
			for i := range r.Length {
				mem[off+i] = soakPoison
			}
		}
	}
}

// verify checks a loaded plan's bytes against its key's content.
func (e *soakEngine) verify(s *soakRun, p umbp.BlockTransferPlan, how string) int {
	mem, base := e.buf.Bytes(), e.buf.Buffer().Ptr
	h := soakKeyHash(p.Key)
	bad, detail := 0, ""
	for _, r := range p.Ranges {
		off := uint64(r.BaseAddress - base)
		for i := range r.Length {
			got, want := mem[off+i], soakContent(h, r.ObjectOffset+i)
			if got != want {
				if bad == 0 {
					detail = fmt.Sprintf("%s; first at object offset %d of block %d: got %#x want %#x", how, r.ObjectOffset+i, p.BlockID, got, want)
				}
				bad++
			}
		}
	}
	s.checked(p.Key, e.name, bad, detail)
	return bad
}

// take reserves up to n random free blocks.
func (e *soakEngine) take(n int) []int {
	var free []int
	for b, busy := range e.busy {
		if !busy {
			free = append(free, b)
		}
	}
	e.rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	free = free[:min(n, len(free))]
	for _, b := range free {
		e.busy[b] = true
	}
	return free
}

// keys picks n distinct keys.
func (e *soakEngine) keys(n int) []string {
	idx := e.rng.Perm(soakKeySpace)[:n]
	keys := make([]string, n)
	for i, k := range idx {
		keys[i] = soakKey(k)
	}
	return keys
}

// run drives the engine until stop, then waits for its jobs to end.
func (e *soakEngine) run(s *soakRun, timeout time.Duration, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			e.drain(s)
			return
		default:
		}
		e.reap(s)
		e.step(s, timeout)
		time.Sleep(time.Duration(e.rng.IntN(3000)) * time.Microsecond)
	}
}

// step submits one job and waits for it in one of the ways an engine does.
func (e *soakEngine) step(s *soakRun, timeout time.Duration) {
	blocks := e.take(1 + e.rng.IntN(4))
	if len(blocks) == 0 { // all held by blocked jobs
		s.count("engine/no free block", 1)
		time.Sleep(5 * time.Millisecond)
		return
	}
	keys := e.keys(len(blocks))
	plans := make([]umbp.BlockTransferPlan, len(blocks))
	for i, b := range blocks {
		p, err := e.plan.PlanForBlock(keys[i], 0, b)
		if err != nil {
			s.fail("engine %s: plan: %v", e.name, err)
			e.release(blocks)
			return
		}
		plans[i] = p
	}
	sj := &soakJob{blocks: blocks}
	bulk := e.rng.IntN(2) == 0
	var start time.Time
	if e.rng.IntN(2) == 0 {
		sj.kind = "store"
		e.fill(plans)
		if bulk {
			bare := make([]umbp.Block, len(plans))
			for i, p := range plans {
				bare[i] = umbp.Block{Key: p.Key, BlockID: p.BlockID}
			}
			start = time.Now()
			sj.job = e.w.StoreBlocks(bare)
			s.timed("StoreBlocks", start)
		} else {
			start = time.Now()
			sj.job = e.w.Store(plans)
			s.timed("Store", start)
		}
	} else {
		sj.kind = "load"
		e.poison(plans)
		if bulk {
			bare := make([]umbp.Block, len(blocks))
			for i, b := range blocks {
				bare[i] = umbp.Block{Key: keys[i], BlockID: b}
			}
			start = time.Now()
			sj.job = e.w.LoadBlocks(bare)
			s.timed("LoadBlocks", start)
		} else {
			start = time.Now()
			sj.job = e.w.Load(plans)
			s.timed("Load", start)
		}
	}
	e.out = append(e.out, sj)

	switch r := e.rng.IntN(100); {
	case r < 40:
		start := time.Now()
		err := e.w.Wait(context.Background(), sj.job)
		s.timed("Wait", start)
		switch {
		case errors.Is(err, umbp.ErrBuffersInUse):
			s.count("wait/buffers in use", 1)
		case !jobEnded(sj.job):
			s.fail("engine %s: Wait = %v for a job still %s", e.name, err, sj.job.Status())
		case (err == nil) != (sj.job.Status() == umbp.JobCompleted):
			s.fail("engine %s: Wait = %v for a %s job", e.name, err, sj.job.Status())
		}
	case r < 80:
		until := time.Now().Add(2 * timeout)
		for {
			start := time.Now()
			done := e.w.Poll(sj.job)
			s.timed("Poll", start)
			if done {
				break
			}
			if time.Now().After(until) {
				s.count("poll/gave up", 1)
				break
			}
			time.Sleep(time.Duration(2+e.rng.IntN(6)) * time.Millisecond)
		}
	case r < 86:
		start := time.Now()
		e.w.Cancel(sj.job)
		s.timed("Cancel", start)
	default: // left running; reaped later
	}
	e.reap(s)
}

// reap settles every job that has ended.
func (e *soakEngine) reap(s *soakRun) {
	keep := e.out[:0]
	for _, sj := range e.out {
		select {
		case <-sj.job.Done():
			e.finish(s, sj)
		default:
			keep = append(keep, sj)
		}
	}
	clear(e.out[len(keep):])
	e.out = keep
}

// finish classifies an ended job, checks what a load brought, and frees its
// blocks.
func (e *soakEngine) finish(s *soakRun, sj *soakJob) {
	job := sj.job
	plans := job.Plans()
	st := job.Status()
	var outcome string
	switch st {
	case umbp.JobCompleted:
		outcome = "completed"
	case umbp.JobCancelled:
		outcome = "cancelled"
	case umbp.JobFailed:
		okKeys := len(job.CompletedKeys())
		notAttempted := true
		for i := range plans {
			if err := job.KeyErr(i); err != nil && !errors.Is(err, umbp.ErrNotAttempted) {
				notAttempted = false
			}
		}
		switch {
		case okKeys > 0:
			outcome = "partial"
		case notAttempted:
			outcome = "not attempted"
		default:
			outcome = "failed"
		}
	default:
		s.fail("engine %s: %s job reported ended with status %s", e.name, sj.kind, st)
		outcome = st.String()
	}
	s.count(sj.kind+"/"+outcome, 1)
	if st != umbp.JobCancelled {
		ok := 0
		for i, p := range plans {
			if job.KeyErr(i) != nil {
				continue
			}
			ok++
			if sj.kind == "load" {
				e.verify(s, p, "load "+outcome)
			}
		}
		s.count(sj.kind+" keys/ok", ok)
		s.count(sj.kind+" keys/failed", len(plans)-ok)
	}
	e.release(sj.blocks)
}

func (e *soakEngine) release(blocks []int) {
	for _, b := range blocks {
		e.busy[b] = false
	}
}

// drain waits for every outstanding job to end: the server is running
// again, so every transfer must return.
func (e *soakEngine) drain(s *soakRun) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		e.reap(s)
		if len(e.out) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.fail("engine %s: %d job(s) did not end within 20s of the server running again", e.name, len(e.out))
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

package umbp_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
)

// The soak: several engines and a scheduler hammer one server process while
// it is stalled (SIGSTOP/SIGCONT), killed and restarted at random. Every
// call must return within its bound, every load that completes must hold
// exactly the bytes stored under its key, goroutines and heap must stay
// bounded, and after the last restart the same handles must work again.

const (
	// soakObjectSize is the size of every object, in every engine's layout.
	soakObjectSize = 4096
	// soakBlocks is the number of KV blocks of each engine.
	soakBlocks = 24
	// soakKeySpace is the number of distinct keys; the server's 1 MiB pool
	// holds about 256 of them, so it evicts.
	soakKeySpace = 320
	// soakMargin is what a call may take beyond its bound before the soak
	// calls it a hang.
	soakMargin = time.Second
	// soakReattachWithin bounds how long a handle may take to attach to a
	// restarted server: a failed attempt backs off at most a second.
	soakReattachWithin = 5 * time.Second
	// soakSettleWithin bounds how long the descriptors of a server that
	// went away may stay open once every handle is on its successor.
	soakSettleWithin = 10 * time.Second
)

// soakLookupConns bounds the scheduler handle's lock-step lookup
// connections: h2call's default, 4 or GOMAXPROCS when that is more.
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

// soakScheduler drives lookups until stop.
func soakScheduler(s *soakRun, h *umbp.SchedulerHandle, rng *rand.Rand, stop <-chan struct{}) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		default:
		}
		n := 1 + rng.IntN(16)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = soakKey(rng.IntN(soakKeySpace))
		}
		switch r := rng.IntN(1000); {
		case r < 600:
			start := time.Now()
			got := h.Lookup(ctx, keys)
			s.timed("Lookup", start)
			if len(got) != n {
				s.fail("Lookup of %d keys answered %d", n, len(got))
			}
			hits := 0
			for _, g := range got {
				if g {
					hits++
				}
			}
			s.count("lookup keys/hit", hits)
			s.count("lookup keys/miss", n-hits)
		case r < 997:
			start := time.Now()
			got := h.LookupPrefix(ctx, keys)
			s.timed("LookupPrefix", start)
			if got < 0 || got > n {
				s.fail("LookupPrefix of %d keys answered %d", n, got)
			}
			if got > 0 {
				s.count("prefix/nonzero", 1)
			}
		default:
			start := time.Now()
			ok := h.Clear(ctx) == nil
			s.timed("Clear", start)
			s.count("clear/"+strconv.FormatBool(ok), 1)
		}
		if rng.IntN(4) == 0 {
			start := time.Now()
			_ = h.Stats()
			_ = h.State()
			s.timed("Stats", start)
		}
		time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond)
	}
}

// soakSampler samples goroutines and heap until stop.
type soakSampler struct {
	mu         sync.Mutex
	goroutines []int
	heap       []uint64
}

func (m *soakSampler) run(stop <-chan struct{}) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var ms runtime.MemStats
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		g := runtime.NumGoroutine()
		m.mu.Lock()
		m.goroutines = append(m.goroutines, g)
		m.mu.Unlock()
		if i%5 == 0 {
			runtime.ReadMemStats(&ms)
			m.mu.Lock()
			m.heap = append(m.heap, ms.HeapAlloc)
			m.mu.Unlock()
		}
	}
}

func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("UMBP_SOAK_SECONDS")
	if v == "" {
		return 20 * time.Second
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		t.Fatalf("UMBP_SOAK_SECONDS=%q: want a positive number of seconds", v)
	}
	return time.Duration(f * float64(time.Second))
}

func soakSeed(t *testing.T) uint64 {
	v := os.Getenv("UMBP_SOAK_SEED")
	if v == "" {
		return rand.Uint64()
	}
	seed, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("UMBP_SOAK_SEED=%q: %v", v, err)
	}
	return seed
}

// TestSoak runs engines and a scheduler against a server process that is
// stalled, killed and restarted at random (UMBP_SOAK_SECONDS, default 20;
// UMBP_SOAK_SEED replays a schedule of faults and operations, timing aside).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: runs the server binary for UMBP_SOAK_SECONDS")
	}
	dur := soakDuration(t)
	seed := soakSeed(t)
	t.Logf("soak: seed %d (UMBP_SOAK_SEED=%d replays it), %v of faults", seed, seed, dur)

	const (
		timeout       = 400 * time.Millisecond
		lookupTimeout = 100 * time.Millisecond
	)
	ep := filepath.Join(shortDir(t), "soak.grpc.sock")
	srvArgs := []string{"-prefault=false", "-capacity", "1MiB"}
	srv := startServerProcess(t, ep, srvArgs...)
	goroutines0 := runtime.NumGoroutine()
	heap0 := heapAfterGC()

	rt := newRuntime(t, umbp.Config{
		Endpoint:       ep,
		NumWorkers:     2,
		Timeout:        timeout,
		LookupTimeout:  lookupTimeout,
		StartupTimeout: 5 * time.Second,
		Logger:         testLogger(t),
	})
	now := soakBound{0, soakMargin}
	s := &soakRun{
		bounds: map[string]soakBound{
			"Store": now, "StoreBlocks": now, "Load": now, "LoadBlocks": now, "Poll": now, "Stats": now,
			"Wait":         {timeout, timeout + soakMargin},
			"Cancel":       {timeout, timeout + soakMargin},
			"Lookup":       {lookupTimeout, lookupTimeout + soakMargin},
			"LookupPrefix": {lookupTimeout, lookupTimeout + soakMargin},
			"Clear":        {lookupTimeout, lookupTimeout + soakMargin},
			// Close waits out running jobs' deadlines, then deregisters
			// within Timeout.
			"Close": {2 * timeout, 2*timeout + soakMargin},
		},
		ops:     map[string]int{},
		longest: map[string]time.Duration{},
	}

	engines := make([]*soakEngine, len(soakLayouts))
	for i, layers := range soakLayouts {
		engines[i] = newSoakEngine(t, rt, fmt.Sprintf("e%d", i), layers, seed+uint64(i)+1)
	}
	sched, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sched.Close() })
	// The descriptors the handles hold for their servers: one connection
	// each, with its server's pidfd, and the scheduler's lock-step lookup
	// connections (to the same server: no pidfd of their own), at most
	// soakLookupConns of them. Every fault must give back what it took
	// once it has settled: a handle beside a server that restarts for
	// weeks must not run out.
	fds0 := countFDs(t)
	fds0.sockets += soakLookupConns()

	var sampler soakSampler
	samplerStop := make(chan struct{})
	var samplerWG sync.WaitGroup
	samplerWG.Go(func() { sampler.run(samplerStop) })
	defer func() { // on failure paths too
		select {
		case <-samplerStop:
		default:
			close(samplerStop)
		}
		samplerWG.Wait()
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, e := range engines {
		wg.Go(func() { e.run(s, timeout, stop) })
	}
	for i := range 2 {
		rng := rand.New(rand.NewPCG(seed, 0x5c4ed+uint64(i)))
		wg.Go(func() { soakScheduler(s, sched, rng, stop) })
	}
	stopped := false
	defer func() { // a failed test stops its goroutines before the memory goes
		if !stopped {
			close(stop)
			wg.Wait()
		}
	}()

	// Faults, on the test goroutine: each leaves the server running. After
	// a restart every handle must attach to the new server, on its own,
	// before the next fault.
	all := []interface {
		State() umbp.HandleState
		Stats() umbp.Stats
	}{sched}
	names := []string{"scheduler"}
	for _, e := range engines {
		all = append(all, e.w)
		names = append(names, e.name)
	}
	faults := map[string]int{}
	var slowestReattach, slowestSettle time.Duration
	peakFDs := 0
	frng := rand.New(rand.NewPCG(seed, 0xfa17))
	pause := func(lo, hi int) {
		time.Sleep(time.Duration(lo+frng.IntN(hi-lo+1)) * time.Millisecond)
	}
	restart := func() {
		before := make([]uint64, len(all))
		for i, h := range all {
			before[i] = h.Stats().Reconnects
		}
		srv.kill()
		faults["kill"]++
		pause(0, 300)
		srv = startServerProcess(t, ep, srvArgs...)
		faults["restart"]++
		started := time.Now()
		for i, h := range all {
			for {
				st := h.Stats()
				if st.Reconnects > before[i] && st.State == umbp.StateConnected {
					break
				}
				if time.Since(started) > soakReattachWithin {
					s.fail("restart %d: %s did not attach to the new server within %v (state %s, reconnects %d, as before the kill)",
						faults["restart"], names[i], soakReattachWithin, st.State, st.Reconnects)
					faults["missed restart"]++
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		slowestReattach = max(slowestReattach, time.Since(started))
		// Once every handle is on the new server, what the old one held
		// is given back: its connections close once the transfers that
		// used them end (the old process is gone, so they do soon).
		var fds fdCounts
		for settle := time.Now(); ; time.Sleep(20 * time.Millisecond) {
			if fds = countFDs(t); fds.pidfds <= fds0.pidfds && fds.sockets <= fds0.sockets {
				slowestSettle = max(slowestSettle, time.Since(settle))
				break
			}
			if time.Since(settle) > soakSettleWithin {
				s.fail("restart %d: %d pidfds and %d sockets still open %v after every handle reattached; %d and %d before the faults",
					faults["restart"], fds.pidfds, fds.sockets, soakSettleWithin, fds0.pidfds, fds0.sockets)
				break
			}
		}
		peakFDs = max(peakFDs, fds.pidfds+fds.sockets)
	}
	begin := time.Now()
	for time.Since(begin) < dur {
		pause(100, 800)
		switch r := frng.IntN(100); {
		case r < 50:
			srv.signal(syscall.SIGSTOP)
			faults["stall"]++
			pause(100, 800)
			srv.signal(syscall.SIGCONT)
		case r < 80:
			restart()
		default: // stalled with transfers in it, then killed
			srv.signal(syscall.SIGSTOP)
			faults["stall"]++
			pause(100, 800)
			restart()
		}
	}
	ran := time.Since(begin)
	close(stop)
	stopped = true
	wg.Wait()
	heapRun := heapAfterGC()

	// Restart once more with everything quiet: the same handles must
	// attach again and work, byte for byte.
	for _, h := range all {
		waitState(t, umbp.StateConnected, h)
	}
	restart()
	faults["final restart"]++
	soakFinalCheck(t, s, engines, sched)

	// Close everything; nothing is in flight, so nothing is abandoned.
	start := time.Now()
	if err := sched.Close(); err != nil {
		t.Errorf("close scheduler: %v", err)
	}
	s.timed("Close", start)
	for _, e := range engines {
		start := time.Now()
		if err := e.w.Close(); err != nil {
			t.Errorf("close worker %s: %v", e.name, err)
		}
		s.timed("Close", start)
		if err := e.buf.Close(); err != nil {
			t.Errorf("close buffer %s: %v", e.name, err)
		}
	}
	close(samplerStop)
	samplerWG.Wait()

	// Goroutines come back to where they were before the handles.
	goroutinesEnd := runtime.NumGoroutine()
	for deadline := time.Now().Add(10 * time.Second); goroutinesEnd > goroutines0+10 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		goroutinesEnd = runtime.NumGoroutine()
	}
	heapEnd := heapAfterGC()

	// Report.
	s.mu.Lock()
	defer s.mu.Unlock()
	peakG, peakHeap := maxOf(sampler.goroutines), maxOf(sampler.heap)
	medG := median(sampler.goroutines)
	ops := func(kind string) string {
		total := 0
		var parts []string
		for _, o := range []string{"completed", "partial", "failed", "not attempted", "cancelled"} {
			n := s.ops[kind+"/"+o]
			total += n
			parts = append(parts, fmt.Sprintf("%s %d", o, n))
		}
		return fmt.Sprintf("%s %d (%s; keys ok %d, failed %d)", kind, total, strings.Join(parts, ", "), s.ops[kind+" keys/ok"], s.ops[kind+" keys/failed"])
	}
	t.Logf("soak summary: ran %v with seed %d: 3 worker handles (NumWorkers 2, Timeout %v) and 1 scheduler handle (LookupTimeout %v, 2 goroutines)",
		ran.Round(time.Millisecond), seed, timeout, lookupTimeout)
	t.Logf("soak operations: %s; %s", ops("store"), ops("load"))
	t.Logf("soak calls: Store %d, StoreBlocks %d, Load %d, LoadBlocks %d, Wait %d (ErrBuffersInUse %d), Poll %d (gave up %d), Cancel %d, Lookup %d (keys hit %d, missed %d), LookupPrefix %d (nonzero %d), Clear %d (true %d), no free block %d",
		s.ops["call/Store"], s.ops["call/StoreBlocks"], s.ops["call/Load"], s.ops["call/LoadBlocks"],
		s.ops["call/Wait"], s.ops["wait/buffers in use"], s.ops["call/Poll"], s.ops["poll/gave up"], s.ops["call/Cancel"],
		s.ops["call/Lookup"], s.ops["lookup keys/hit"], s.ops["lookup keys/miss"],
		s.ops["call/LookupPrefix"], s.ops["prefix/nonzero"], s.ops["call/Clear"], s.ops["clear/true"], s.ops["engine/no free block"])
	t.Logf("soak faults: %d stalls (SIGSTOP 100-800ms), %d kills (SIGKILL), %d restarts (incl. the final one); restarts a handle did not notice: %d; slowest reattach of all handles %v",
		faults["stall"], faults["kill"], faults["restart"], faults["missed restart"], slowestReattach.Round(time.Millisecond))
	t.Logf("soak descriptors: %d pidfds and %d sockets before the faults; after each restart settled, back to them within %v at worst (most seen then: %d)",
		fds0.pidfds, fds0.sockets, slowestSettle.Round(time.Millisecond), peakFDs)
	t.Logf("soak byte mismatches: %d keys (%d bytes) of %d loaded keys checked byte for byte", s.mismatches, s.badBytes, s.verified)
	kinds := make([]string, 0, len(s.bounds))
	for n := range s.bounds {
		kinds = append(kinds, n)
	}
	sort.Strings(kinds)
	var calls []string
	for _, n := range kinds {
		b := s.bounds[n]
		bound := "at once"
		if b.bound > 0 {
			bound = b.bound.String()
		}
		calls = append(calls, fmt.Sprintf("%s %v (bound %s, allowed %v)", n, s.longest[n].Round(time.Microsecond), bound, b.allowed))
	}
	t.Logf("soak longest calls: %s", strings.Join(calls, "; "))
	t.Logf("soak goroutines: %d before the handles, median %d, peak %d, %d after Close; heap after GC: %.1f MiB before, %.1f MiB after the faults, %.1f MiB after Close; peak sampled %.1f MiB",
		goroutines0, medG, peakG, goroutinesEnd, mib(heap0), mib(heapRun), mib(heapEnd), mib(peakHeap))
	var hs []string
	for _, e := range engines {
		st := e.w.Stats()
		hs = append(hs, fmt.Sprintf("%s: reconnects %d, submitted %d, completed %d, failed %d, refused %d, abandoned %d",
			e.name, st.Reconnects, st.Transfers.Submitted, st.Transfers.Completed, st.Transfers.Failed, st.Transfers.Refused, st.Transfers.AbandonedBuffers))
	}
	st := sched.Stats()
	hs = append(hs, fmt.Sprintf("scheduler: reconnects %d, lookups %d, timeouts %d, failures %d", st.Reconnects, st.Lookups.Calls, st.Lookups.Timeouts, st.Lookups.Failures))
	t.Logf("soak handles: %s", strings.Join(hs, "; "))

	for _, e := range s.errs {
		t.Error(e)
	}
	for _, o := range s.overruns {
		t.Errorf("call over its bound: %s", o)
	}
	if s.mismatches > 0 {
		t.Errorf("%d loaded keys held wrong bytes", s.mismatches)
	}
	if faults["kill"] == 0 || s.verified == 0 {
		t.Errorf("the soak exercised too little: %d kills, %d keys verified", faults["kill"], s.verified)
	}
	if peakG > goroutines0+400 {
		t.Errorf("goroutines peaked at %d (%d before the handles)", peakG, goroutines0)
	}
	if goroutinesEnd > goroutines0+10 {
		t.Errorf("%d goroutines after Close, %d before the handles", goroutinesEnd, goroutines0)
	}
	if heapRun > heap0+64<<20 || heapEnd > heap0+64<<20 || peakHeap > 512<<20 {
		t.Errorf("heap grew: %.1f MiB before, %.1f MiB after the faults, %.1f MiB after Close, peak %.1f MiB",
			mib(heap0), mib(heapRun), mib(heapEnd), mib(peakHeap))
	}
}

// soakFinalCheck: after the last restart, each engine stores blocks the
// next one loads, byte for byte, and the scheduler finds them.
func soakFinalCheck(t *testing.T, s *soakRun, engines []*soakEngine, sched *umbp.SchedulerHandle) {
	t.Helper()
	ctx := context.Background()
	run := func(e *soakEngine, what string, submit func() *umbp.TransferJob) *umbp.TransferJob {
		t.Helper()
		// A transfer refused or blocked by a scheduling hiccup is retried;
		// a transfer that ends otherwise than COMPLETED is not.
		for attempt := 1; ; attempt++ {
			job := submit()
			if err := e.w.Wait(ctx, job); err != nil {
				select {
				case <-job.Done():
				case <-time.After(10 * time.Second):
					t.Fatalf("final %s on %s never ended: %v", what, e.name, err)
				}
			}
			if job.Status() == umbp.JobCompleted {
				return job
			}
			refused := errors.Is(job.Err(), umbp.ErrNotAttempted)
			if !refused || attempt == 3 {
				t.Fatalf("final %s on %s (attempt %d): %s %v", what, e.name, attempt, job.Status(), job.Err())
			}
			t.Logf("final %s on %s refused (attempt %d): %s", what, e.name, attempt, job.Err())
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i, src := range engines {
		dst := engines[(i+1)%len(engines)]
		keys := []string{}
		for j := range 4 {
			keys = append(keys, fmt.Sprintf("final/%s-%d", src.name, j))
		}
		plansFor := func(e *soakEngine) []umbp.BlockTransferPlan {
			out := make([]umbp.BlockTransferPlan, len(keys))
			for j, k := range keys {
				p, err := e.plan.PlanForBlock(k, 0, j)
				if err != nil {
					t.Fatal(err)
				}
				out[j] = p
			}
			return out
		}
		sp := plansFor(src)
		src.fill(sp)
		run(src, "store", func() *umbp.TransferJob { return src.w.Store(sp) })
		dp := plansFor(dst)
		dst.poison(dp)
		run(dst, "load", func() *umbp.TransferJob { return dst.w.Load(dp) })
		for _, p := range dp {
			if bad := dst.verify(s, p, "final load"); bad > 0 {
				t.Errorf("final load of %s into %s: %d bytes differ", p.Key, dst.name, bad)
			}
		}
		// A lookup that overran LookupTimeout on a busy machine is a miss:
		// ask again a few times.
		var got []bool
		prefix := 0
		for range 5 {
			got = sched.Lookup(ctx, keys)
			prefix = sched.LookupPrefix(ctx, keys)
			if allEqual(got, true) && prefix == len(keys) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !allEqual(got, true) || prefix != len(keys) {
			t.Errorf("after the last restart the scheduler finds %v (prefix %d) of %s's stored keys", got, prefix, src.name)
		}
	}
}

// median returns the middle of v's values (the upper one of an even
// count), 0 for none.
func median[T cmp.Ordered](v []T) T {
	var zero T
	if len(v) == 0 {
		return zero
	}
	c := slices.Clone(v)
	slices.Sort(c)
	return c[len(c)/2]
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

func maxOf[T int | uint64](v []T) T {
	var m T
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

package umbp_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
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
	// each, with its server's pidfd, and each handle's lock-step
	// connections (the scheduler's lookups, the workers' transfers; to the
	// same server: no pidfd of their own), at most soakLookupConns of them
	// a handle. Every fault must give back what it took once it has
	// settled: a handle beside a server that restarts for weeks must not
	// run out.
	fds0 := countFDs(t)
	fds0.sockets += soakLookupConns() * (len(engines) + 1)

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

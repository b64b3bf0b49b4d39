package umbp_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// replicatedPool is three master replicas over one store, with two nodes
// holding keys k0..k(n-1) between them and reporting blocks b0..b3.
type replicatedPool struct {
	m    *umbptest.ReplicatedMaster
	keys []string
}

func newReplicatedPool(t *testing.T, nkeys int, opts umbptest.MasterOptions) *replicatedPool {
	t.Helper()
	opts.ReaperInterval = -1
	m := umbptest.NewReplicatedMaster(t, 3, opts)
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	half := nkeys / 2
	// Each node registers with a replica of its own: all of them see both.
	umbptest.NewNode(t, m.Replica(0).Addr(), umbptest.NodeOptions{ID: "n1",
		Keys: map[umbptest.Tier][]string{umbptest.TierDRAM: keys[:half]}, External: map[umbptest.Tier][]string{umbptest.TierHBM: {"b0", "b1", "b2"}}})
	umbptest.NewNode(t, m.Replica(1).Addr(), umbptest.NodeOptions{ID: "n2",
		Keys: map[umbptest.Tier][]string{umbptest.TierSSD: keys[half:]}, External: map[umbptest.Tier][]string{umbptest.TierDRAM: {"b0"}}})
	return &replicatedPool{m: m, keys: keys}
}

func (p *replicatedPool) config(t *testing.T) umbp.ClusterConfig {
	cfg := clusterConfig(t, "")
	cfg.Masters = p.m.Addrs()
	cfg.LookupTimeout = 2 * time.Second // far above the hedge delay: a miss is a failure of the hedge
	cfg.Timeout = 10 * time.Second
	return cfg
}

// checkLookups makes n lookups of every key from g goroutines and fails on
// any miss or any call past bound; it returns the slowest call.
func (p *replicatedPool) checkLookups(t *testing.T, h *umbp.SchedulerHandle, g, n int, bound time.Duration) time.Duration {
	t.Helper()
	var mu sync.Mutex
	var slowest time.Duration
	var wg sync.WaitGroup
	for range g {
		wg.Go(func() {
			for range n {
				start := time.Now()
				got := h.Lookup(context.Background(), p.keys)
				took := time.Since(start)
				mu.Lock()
				slowest = max(slowest, took)
				mu.Unlock()
				for i, hit := range got {
					if !hit {
						t.Errorf("key %s missed", p.keys[i])
						return
					}
				}
				if took > bound {
					t.Errorf("a lookup took %v, bound %v", took, bound)
					return
				}
			}
		})
	}
	wg.Wait()
	return slowest
}

func replicaCalls(s umbp.Stats) (calls, hedges uint64) {
	for _, r := range s.Replicas {
		calls += r.Calls
		hedges += r.Hedges
	}
	return calls, hedges
}

// Healthy replicas: the calls spread over all of them, and none is asked
// twice for anything (no hedges while every answer comes in time).
func TestReplicasSpreadCalls(t *testing.T) {
	p := newReplicatedPool(t, 64, umbptest.MasterOptions{})
	cfg := p.config(t)
	// Far above any answer of a healthy replica, however loaded the
	// machine running the test: no call is slow enough to be hedged.
	cfg.HedgeDelay = time.Second
	h := newClusterHandle(t, cfg)
	p.checkLookups(t, h, 16, 20, 2*time.Second)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 10 {
				s, err := h.Score(context.Background(), umbp.ScoreRequest{BlockHashes: []string{"b0", "b1", "b2", "b3"}})
				if err != nil || !s.Complete || len(s.Nodes) != 2 || s.Nodes[0].Prefix != 3 {
					t.Errorf("Score = %+v, %v", s, err)
					return
				}
			}
		})
	}
	wg.Wait()
	st := h.Stats()
	calls, hedges := replicaCalls(st)
	made := st.Lookups.Calls*1 + 160 // each Score makes two calls
	if len(st.Replicas) != 3 {
		t.Fatalf("%d replicas in Stats", len(st.Replicas))
	}
	for _, r := range st.Replicas {
		if r.State != umbp.StateConnected || r.Calls == 0 || r.Answers == 0 {
			t.Errorf("replica %+v: want connected and used", r)
		}
	}
	if float64(calls) > 1.05*float64(made) {
		t.Errorf("the replicas saw %d calls for %d made (hedges %d)", calls, made, hedges)
	}
	t.Logf("replicas: %+v", st.Replicas)
}

// A stalled replica (SIGSTOP: it takes connections and answers nothing)
// costs a call the hedge delay, never a miss; it is set aside, and used
// again soon after it resumes.
func TestReplicaStalledIsRoutedAround(t *testing.T) {
	p := newReplicatedPool(t, 64, umbptest.MasterOptions{})
	cfg := p.config(t)
	cfg.HedgeDelay = 50 * time.Millisecond
	h := newClusterHandle(t, cfg)
	p.checkLookups(t, h, 1, 3, time.Second)
	p.m.Replica(0).Suspend()
	resumed := false
	defer func() {
		if !resumed {
			p.m.Replica(0).Resume()
		}
	}()
	slowest := p.checkLookups(t, h, 8, 20, time.Second)
	// It is found stalled while calls are in flight (its beats silent, or
	// overtaken call after call): on a busy host that may take more calls
	// than these, so lookups go on until it is set aside.
	for deadline := time.Now().Add(10 * time.Second); !h.Stats().Replicas[0].SetAside && time.Now().Before(deadline); {
		slowest = max(slowest, p.checkLookups(t, h, 8, 5, time.Second))
	}
	st := h.Stats()
	if r := st.Replicas[0]; !r.SetAside || r.SetAsides == 0 || r.State == umbp.StateConnected {
		t.Errorf("the stalled replica: %+v; want set aside", r)
	}
	// The budget: ten at once, and a tenth of one for every call made.
	if _, hedges := replicaCalls(st); hedges == 0 || hedges > 10+st.Lookups.Calls/10 {
		t.Errorf("%d hedges for %d calls: want a few, within the budget", hedges, st.Lookups.Calls)
	}
	if st.State != umbp.StateConnected || st.Lookups.Misses != 0 || st.Lookups.Timeouts != 0 {
		t.Errorf("handle: %+v", st)
	}
	t.Logf("slowest lookup with a replica stalled: %v (hedge delay %v)", slowest, cfg.HedgeDelay)

	p.m.Replica(0).Resume()
	resumed = true
	back := time.Now()
	waitFor(t, "the resumed replica used again", func() bool { return !h.Stats().Replicas[0].SetAside })
	if d := time.Since(back); d > time.Second {
		t.Errorf("the replica was used again %v after it resumed, want within a second", d)
	}
}

// Calls made one after another go to the replica that answered last (one
// master process asked call after call answers sooner than three in turn);
// one stopped without a hedge to route around it (hedges off, as with the
// budget spent) costs one lookup LookupTimeout, not the stop: the probe
// that follows the call that overran finds the others, later lookups go to
// them, and the stopped one is set aside.
// TestStoppedReplicaHoldsNothingOff stops a replica under eight callers,
// two of them scoring, hedges off: the calls it had are misses at
// LookupTimeout (a score incomplete), each caller's at most once, and no
// other call is held off (answered a miss at once) while two replicas
// answer.
func TestStoppedReplicaHoldsNothingOff(t *testing.T) {
	p := newReplicatedPool(t, 8, umbptest.MasterOptions{})
	cfg := p.config(t)
	cfg.HedgeDelay = -1
	cfg.LookupTimeout = 500 * time.Millisecond
	h := newClusterHandle(t, cfg)
	const callers, scorers = 8, 2
	var mu sync.Mutex
	var slow, fast, calls int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				var ok bool
				if i < scorers {
					s, err := h.Score(context.Background(), umbp.ScoreRequest{BlockHashes: []string{"b0", "b1", "b2", "b3"}, PoolKeys: p.keys})
					ok = err == nil && s.Complete
				} else {
					ok = h.Lookup(context.Background(), p.keys)[0]
				}
				took := time.Since(start)
				mu.Lock()
				calls++
				switch {
				case ok:
				case took < cfg.LookupTimeout/2:
					fast++
				default:
					slow++
				}
				mu.Unlock()
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	waitFor(t, "calls to replica 0", func() bool { return h.Stats().Replicas[0].Calls > 0 })
	p.m.Replica(0).Suspend()
	defer p.m.Replica(0).Resume()
	waitFor(t, "the stopped replica set aside", func() bool { return h.Stats().Replicas[0].SetAside })
	mu.Lock()
	after := calls + 200
	mu.Unlock()
	waitFor(t, "200 calls more", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls >= after
	})
	mu.Lock()
	defer mu.Unlock()
	if fast > 0 || slow > callers {
		t.Errorf("with one replica of three stopped, %d calls failed at once (held off) and %d at LookupTimeout, want none and at most %d (one a caller)", fast, slow, callers)
	}
	t.Logf("%d calls, %d failed at LookupTimeout", calls, slow)
}

func TestStoppedReplicaWithoutHedges(t *testing.T) {
	p := newReplicatedPool(t, 8, umbptest.MasterOptions{})
	cfg := p.config(t)
	cfg.HedgeDelay = -1
	cfg.LookupTimeout = 200 * time.Millisecond
	h := newClusterHandle(t, cfg)
	p.checkLookups(t, h, 1, 10, time.Second)
	used, calls := -1, uint64(0)
	for i, r := range h.Stats().Replicas {
		calls += r.Calls
		if r.Calls > 0 {
			if used >= 0 {
				t.Fatalf("calls one after another went to replicas %d and %d: %+v", used, i, h.Stats().Replicas)
			}
			used = i
		}
	}
	if used < 0 || calls != 10 {
		t.Fatalf("%d calls for 10 lookups: %+v", calls, h.Stats().Replicas)
	}

	p.m.Replica(used).Suspend()
	defer p.m.Replica(used).Resume()
	stopped := time.Now()
	var firstHit time.Duration
	for hits := 0; hits < 50; {
		start := time.Now()
		got := h.Lookup(context.Background(), p.keys)
		if d := time.Since(start); d > cfg.LookupTimeout+margin {
			t.Fatalf("a lookup took %v with a replica stopped", d)
		}
		switch {
		case got[0]:
			if hits == 0 {
				firstHit = time.Since(stopped)
			}
			hits++
		case hits > 0:
			t.Fatalf("a miss after %d hits with a replica stopped", hits)
		case time.Since(stopped) > 5*time.Second:
			t.Fatalf("no hit within 5s of one replica of three stopping: %+v", h.Stats())
		}
	}
	if bound := cfg.LookupTimeout + time.Second; firstHit > bound {
		t.Errorf("lookups hit again %v after one replica of three stopped, want within %v", firstHit, bound)
	}
	waitFor(t, "the stopped replica set aside", func() bool { return h.Stats().Replicas[used].SetAside })
	t.Logf("hits again %v after the stop", firstHit)
}

// A killed replica refuses: its calls fail over at once, and it is used
// again within a second of its restart.
func TestReplicaKilledAndRestarted(t *testing.T) {
	p := newReplicatedPool(t, 64, umbptest.MasterOptions{})
	h := newClusterHandle(t, p.config(t))
	p.m.Replica(2).Kill()
	p.checkLookups(t, h, 8, 20, time.Second)
	if r := h.Stats().Replicas[2]; r.State == umbp.StateConnected {
		t.Errorf("the killed replica: %+v", r)
	}
	if err := p.m.Replica(2).Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitFor(t, "the restarted replica used again", func() bool { return h.Stats().Replicas[2].State == umbp.StateConnected })
	if d := time.Since(back); d > time.Second {
		t.Errorf("the replica was used again %v after it restarted, want within a second", d)
	}
	p.checkLookups(t, h, 4, 10, time.Second)
}

// The store stopped: every replica says so; lookups are misses within
// LookupTimeout, later ones fail fast while the call that overran has
// not returned, one warning names the store (not a replica), and lookups
// are answered again soon after the store comes back.
func TestStoreOutageIsOneFault(t *testing.T) {
	p := newReplicatedPool(t, 8, umbptest.MasterOptions{StoreTimeout: 300 * time.Millisecond})
	var logs lockedBuffer
	cfg := p.config(t)
	cfg.LookupTimeout = 100 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h := newClusterHandle(t, cfg)
	p.checkLookups(t, h, 1, 2, time.Second)
	p.m.FailStore(umbptest.StoreStopped)
	for range 20 {
		start := time.Now()
		if got := h.Lookup(context.Background(), p.keys); got[0] {
			t.Fatal("a hit while the store is stopped")
		}
		if d := time.Since(start); d > cfg.LookupTimeout+margin {
			t.Fatalf("a lookup took %v while the store is stopped", d)
		}
	}
	// The calls that overran end at the store's timeout with its error.
	waitFor(t, "the store's warning", func() bool { return strings.Contains(logs.String(), "metadata store is unavailable") })
	// Said once, the store's outage is a miss at once.
	for range 10 {
		start := time.Now()
		if got := h.Lookup(context.Background(), p.keys); got[0] {
			t.Fatal("a hit while the store is stopped")
		}
		if d := time.Since(start); d >= cfg.LookupTimeout/2 {
			t.Fatalf("a lookup took %v once the store's outage was said, want a miss at once", d)
		}
	}
	p.m.RestoreStore()
	back := time.Now()
	waitFor(t, "hits once the store is back", func() bool { return h.Lookup(context.Background(), p.keys)[0] })
	if d := time.Since(back); d > time.Second {
		t.Errorf("answered again %v after the store came back, want within a second", d)
	}
	text := logs.String()
	if n := strings.Count(text, "metadata store is unavailable"); n != 1 {
		t.Errorf("%d store warnings, want one:\n%s", n, text)
	}
	for _, a := range p.m.Addrs() {
		if strings.Count(text, "replica="+a) > 0 {
			t.Errorf("a warning names replica %s for the store's fault:\n%s", a, text)
		}
	}
	for _, r := range h.Stats().Replicas {
		if r.SetAsides != 0 {
			t.Errorf("replica %s set aside for the store's fault", r.Addr)
		}
	}
}

// Every replica stalled: a miss within LookupTimeout, then misses at once
// without asking, and Close does not wait for the stuck calls.
func TestAllReplicasStalled(t *testing.T) {
	p := newReplicatedPool(t, 8, umbptest.MasterOptions{})
	cfg := p.config(t)
	cfg.LookupTimeout = 200 * time.Millisecond
	rt, err := umbp.NewClusterRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		p.m.Replica(i).Suspend()
		defer p.m.Replica(i).Resume()
	}
	returnsWithin(t, cfg.LookupTimeout+margin, "a lookup with every replica stalled", func() {
		if h.Lookup(context.Background(), p.keys)[0] {
			t.Error("a hit")
		}
	})
	calls, _ := replicaCalls(h.Stats())
	returnsWithin(t, 100*time.Millisecond, "lookups behind a stuck one", func() {
		for range 10 {
			if h.Lookup(context.Background(), p.keys)[0] {
				t.Error("a hit")
			}
		}
	})
	if later, _ := replicaCalls(h.Stats()); later != calls {
		t.Errorf("%d calls sent behind a stuck one, want none", later-calls)
	}
	returnsWithin(t, margin, "Close with calls stuck at every replica", func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
}

// A handle made while some replicas are down attaches to the others and
// picks the rest up as they come.
func TestReplicasSomeDownAtStart(t *testing.T) {
	p := newReplicatedPool(t, 8, umbptest.MasterOptions{})
	p.m.Replica(1).Kill()
	h := newClusterHandle(t, p.config(t))
	p.checkLookups(t, h, 2, 5, time.Second)
	if err := p.m.Replica(1).Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica up at last used", func() bool { return h.Stats().Replicas[1].State == umbp.StateConnected })
}

// lockedBuffer is a strings.Builder safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

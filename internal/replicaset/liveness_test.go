package replicaset_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/replicaset"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// callers runs n goroutines, each making calls lookups (each bounded by
// bound) until stop is closed or it made max calls; it returns the
// errors and the slowest call.
func callers(s *replicaset.Set, n, limit int, bound time.Duration, stop <-chan struct{}) (errs []error, slowest time.Duration) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for range limit {
				select {
				case <-stop:
					return
				default:
				}
				began := time.Now()
				_, err := lookup(s, bound)
				d := time.Since(began)
				mu.Lock()
				slowest = max(slowest, d)
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs, slowest
}

// callsReach waits until every replica of m has had n more BatchLookup
// calls than when it was called.
func callsReach(t *testing.T, m *umbptest.ReplicatedMaster, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range m.Len() {
		r := m.Replica(i)
		if err := r.WaitCalls(ctx, "BatchLookup", r.Calls("BatchLookup")+n); err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
}

// waitAside waits, on the set's Changed events, until replica i is set
// aside, at most within; it reports whether it was.
func waitAside(s *replicaset.Set, changed <-chan bool, i int, within time.Duration) bool {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for !s.Stats()[i].Aside {
		select {
		case <-changed:
		case <-timer.C:
			return false
		}
	}
	return true
}

func sumHedges(s *replicaset.Set) (calls, hedges uint64) {
	for _, st := range s.Stats() {
		calls += st.Calls
		hedges += st.Hedges
	}
	return calls, hedges
}

// busiest is the replica that answered most.
func busiest(s *replicaset.Set) int {
	best := 0
	for i, st := range s.Stats() {
		if st.Answers > s.Stats()[best].Answers {
			best = i
		}
	}
	return best
}

// A replica stopped while calls wait on it is gone as soon as its beat
// goes unanswered while the others answer theirs: every call waiting on
// it is hedged then, whatever its hedge delay (an hour here) and the hedge
// budget, and none waits out its bound.
func TestGoneReplicaIsHedgedAtOnce(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{})
	s, changed := open(t, m, time.Hour)
	m.SlowStore(func() time.Duration { return 20 * time.Millisecond }) // calls in flight when it stops
	if errs, _ := callers(s, 4, 5, 10*time.Second, nil); len(errs) > 0 {
		t.Fatal(errs[0])
	}
	stopped := busiest(s)
	stop := make(chan struct{})
	done := make(chan struct{})
	var errs []error
	var slowest time.Duration
	go func() {
		defer close(done)
		errs, slowest = callers(s, 8, 1000, 10*time.Second, stop)
	}()
	callsReach(t, m, 1) // calls in flight on every replica
	m.Replica(stopped).Suspend()
	defer m.Replica(stopped).Resume()
	waitAside(s, changed, stopped, 10*time.Second) // the checks below say whether it was
	close(stop)
	<-done
	if len(errs) > 0 {
		t.Fatalf("%d calls failed with a replica stopped: %v", len(errs), errs[0])
	}
	if slowest > 5*time.Second {
		t.Fatalf("a call took %v with a replica stopped: it waited for its own bound, not hedged", slowest)
	}
	if st := s.Stats()[stopped]; !st.Aside || st.Beats == 0 {
		t.Fatalf("the stopped replica: %+v; want set aside, found by its beats", st)
	}
}

// A replica stopped while every call is slow (its store is) is set aside
// within a bound set by the beats, not by the calls' own pace: here they
// take 200 ms each, so their hedge delay is 600 ms, and a replica found
// only by its calls would be set aside after that at the earliest.
func TestStoppedReplicaSetAsideWhileCallsAreSlow(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{})
	s, changed := open(t, m, 20*time.Millisecond)
	m.SlowStore(func() time.Duration { return 200 * time.Millisecond })
	if errs, _ := callers(s, 4, 3, 10*time.Second, nil); len(errs) > 0 {
		t.Fatal(errs[0])
	}
	stopped := busiest(s)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = callers(s, 6, 1000, 10*time.Second, stop)
	}()
	defer func() { close(stop); <-done }()
	callsReach(t, m, 1) // calls in flight on every replica
	m.Replica(stopped).Suspend()
	defer m.Replica(stopped).Resume()
	began := time.Now()
	if !waitAside(s, changed, stopped, 450*time.Millisecond) {
		t.Fatalf("the stopped replica not set aside %v after it stopped, with calls of 200 ms: %+v", time.Since(began), s.Stats())
	}
	t.Logf("set aside %v after it stopped", time.Since(began))
}

// A store slow for every replica alike (one answer in ten takes 60 ms,
// the others 2 ms) is not hedged into: the replicas answer their beats,
// so a slow call is as slow on any of them. The extra calls stay under 5 %.
func TestSlowStoreIsNotHedgedInto(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{})
	s, _ := open(t, m, 20*time.Millisecond)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	m.SlowStore(func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		if rng.IntN(10) == 0 {
			return 60 * time.Millisecond
		}
		return 2 * time.Millisecond
	})
	const n, each = 4, 150
	if errs, _ := callers(s, n, each, 10*time.Second, nil); len(errs) > 0 {
		t.Fatal(errs[0])
	}
	calls, hedges := sumHedges(s)
	made := uint64(n * each)
	if extra := float64(calls-made) / float64(made); extra > 0.05 {
		t.Fatalf("%d calls made, the replicas asked %d times (%d hedges): %.1f %% extra, want at most 5 %%", made, calls, hedges, 100*extra)
	}
	t.Logf("%d calls made, %d asked, %d hedges", made, calls, hedges)
}

package replicaset_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/replicaset"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open opens a set on m's replicas and closes it when the test ends;
// changed receives what Options.Changed is told.
func open(t *testing.T, m *umbptest.ReplicatedMaster, hedge time.Duration) (s *replicaset.Set, changed chan bool) {
	t.Helper()
	return openWith(t, m, replicaset.Options{StoreTimeout: 5 * time.Second, HedgeDelay: hedge})
}

// openWith is open with opts, its Addresses and Changed filled in.
func openWith(t *testing.T, m *umbptest.ReplicatedMaster, opts replicaset.Options) (s *replicaset.Set, changed chan bool) {
	t.Helper()
	changed = make(chan bool, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts.Addresses = m.Addrs()
	opts.Changed = func(usable bool) {
		select {
		case changed <- usable:
		default:
		}
	}
	s, err := replicaset.Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, changed
}

// lookup asks the set about one key, bounded by bound as a caller bounds
// it: ended with errdefs.ErrNoReply as its cause.
func lookup(s *replicaset.Set, bound time.Duration) ([]bool, error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	t := time.AfterFunc(bound, func() { cancel(errdefs.ErrNoReply) })
	defer t.Stop()
	defer cancel(nil)
	return replicaset.Ask(ctx, s, replicaset.Lookup, func(c *masterconn.Conn) func(context.Context) ([]bool, error) {
		return func(ctx context.Context) ([]bool, error) { return c.BatchLookup(ctx, []string{"k"}) }
	})
}

func answers(s *replicaset.Set) (n uint64) {
	for _, st := range s.Stats() {
		n += st.Answers
	}
	return n
}

// A stopped replica (it takes connections and answers nothing) costs a
// call its hedge delay, never its answer: another replica answers, and the
// stopped one, overtaken call after call (callers at once spread over the
// replicas), is set aside and asked no more.
func TestStoppedReplicaIsHedgedAndSetAside(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{})
	s, _ := open(t, m, 20*time.Millisecond)
	m.Replica(0).Suspend()
	defer m.Replica(0).Resume()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for i := 0; i < 200 && !s.Stats()[0].Aside; i++ {
				if _, err := lookup(s, 5*time.Second); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a call with one replica of two stopped: %v", err)
	}
	st := s.Stats()
	if !st[0].Aside || st[0].Usable || st[0].SetAsides != 1 || st[0].Answers != 0 {
		t.Fatalf("stats %+v: want the stopped replica set aside once, never answering", st)
	}
	calls := st[0].Calls
	for range 10 {
		if _, err := lookup(s, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if c := s.Stats()[0].Calls; c != calls {
		t.Fatalf("a replica set aside was asked %d more calls", c-calls)
	}
}

// A killed replica refuses: a call fails over to another at once, the
// killed one is set aside, and once it is back the probes use it again.
func TestKilledReplicaFailsOverAndComesBack(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{})
	s, changed := open(t, m, -1) // no hedges: only the failover answers
	if _, err := lookup(s, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	killed := 0
	if s.Stats()[1].Answers > 0 {
		killed = 1
	}
	m.Replica(killed).Kill()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats()[killed].Usable {
		if time.Now().After(deadline) {
			t.Fatalf("the killed replica still usable: %+v", s.Stats())
		}
		if _, err := lookup(s, 5*time.Second); err != nil {
			t.Fatalf("with one replica of two killed: %v", err)
		}
	}
	if err := m.Replica(killed).Restart(); err != nil {
		t.Fatal(err)
	}
	for !s.Stats()[killed].Usable {
		select {
		case <-changed: // its channel up, or a probe answered
		case <-time.After(time.Until(deadline)):
			t.Fatalf("the restarted replica not used again: %+v", s.Stats())
		}
	}
}

// Every replica saying its store is unavailable is one fault, the store's:
// the call fails with ErrStoreUnavailable, later calls answer at once
// without asking (ErrStoreNotAsked), and once the store is back a check
// finds it and calls go out again. Ping's probes are asked throughout.
func TestStoreOutageIsOneFault(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{})
	s, _ := open(t, m, -1)
	m.FailStore(umbptest.StoreDown)
	if _, err := lookup(s, 5*time.Second); !errors.Is(err, replicaset.ErrStoreUnavailable) {
		t.Fatalf("with the store down: %v, want ErrStoreUnavailable", err)
	}
	before := m.Calls("BatchLookup")
	if _, err := lookup(s, 5*time.Second); !errors.Is(err, replicaset.ErrStoreNotAsked) {
		t.Fatalf("again: %v, want ErrStoreNotAsked", err)
	}
	if _, err := replicaset.Ask(context.Background(), s, replicaset.Probe, func(c *masterconn.Conn) func(context.Context) (struct{}, error) {
		return func(ctx context.Context) (struct{}, error) { return struct{}{}, c.Probe(ctx, false) }
	}); err != nil {
		t.Fatalf("a probe while the store is out: %v", err)
	}
	m.RestoreStore()
	answeredAgain(t, s)
	if m.Calls("BatchLookup") == before {
		t.Fatal("no call reached a replica after the store came back")
	}
}

// A check of the store that hears nothing (its own bound passed first,
// the replicas still waiting on a stopped store) says nothing of it: calls
// go on answering at once, no replica asked, until a replica answers a
// check otherwise.
func TestUnheardStoreCheckSaysNothing(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{StoreTimeout: time.Hour})
	s, _ := openWith(t, m, replicaset.Options{StoreTimeout: 50 * time.Millisecond, HedgeDelay: -1})
	m.FailStore(umbptest.StoreDown)
	if _, err := lookup(s, 5*time.Second); !errors.Is(err, replicaset.ErrStoreUnavailable) {
		t.Fatalf("with the store down: %v, want ErrStoreUnavailable", err)
	}
	m.FailStore(umbptest.StoreStopped) // every check now waits out its own 50 ms
	// With at most two checks in flight on each of the two replicas, a
	// fifth began only once one had ended unheard.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.WaitCalls(ctx, "BatchLookup", m.Calls("BatchLookup")+5); err != nil {
		t.Fatalf("the store's checks stopped: %v", err)
	}
	if _, err := lookup(s, 5*time.Second); !errors.Is(err, replicaset.ErrStoreNotAsked) {
		t.Fatalf("after checks that heard nothing: %v, want ErrStoreNotAsked", err)
	}
	m.RestoreStore()
	answeredAgain(t, s)
}

// answeredAgain waits, up to 10 s, for a lookup to be answered once the
// store came back: calls answer ErrStoreUnavailable until a check of the
// store, made at its own pace, hears it. Each try is a call, not a wait.
func answeredAgain(t *testing.T, s *replicaset.Set) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := lookup(s, 5*time.Second)
		if err == nil {
			return
		}
		if !errors.Is(err, replicaset.ErrStoreUnavailable) || time.Now().After(deadline) {
			t.Fatalf("after the store came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the store check's own pace
	}
}

// A call its caller ends at its bound returns then, its replicas suspect;
// ProbeAll answers through the replica that answers and sets the silent
// one aside.
func TestUnansweredCallAndProbeAll(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{})
	s, changed := open(t, m, -1)
	if _, err := lookup(s, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	stopped := 0
	if s.Stats()[1].Answers > 0 {
		stopped = 1
	}
	m.Replica(stopped).Suspend()
	defer m.Replica(stopped).Resume()
	began := time.Now()
	if _, err := lookup(s, 100*time.Millisecond); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call to the stopped replica: %v, want ended by its caller", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("the call ended %v after its bound of 100ms", d)
	}
	if err := s.ProbeAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !s.AnsweredWithin(time.Minute) {
		t.Fatal("AnsweredWithin: the other replica answered the probe, and is not suspect")
	}
	if !waitAside(s, changed, stopped, 10*time.Second) {
		t.Fatalf("the silent replica not set aside after ProbeAll: %+v", s.Stats())
	}
	if _, err := lookup(s, 5*time.Second); err != nil {
		t.Fatalf("the next call, with the stopped replica set aside: %v", err)
	}
}

// The last usable replica is never set aside: a set whose every replica is
// stuck is its caller's to wait out; Close ends the calls still waiting.
func TestLastReplicaIsNotSetAside(t *testing.T) {
	m := umbptest.NewReplicatedMaster(t, 1, umbptest.MasterOptions{})
	s, _ := open(t, m, 20*time.Millisecond)
	m.Replica(0).Suspend()
	defer m.Replica(0).Resume()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _, _ = lookup(s, 50*time.Millisecond) })
	}
	wg.Wait()
	if err := s.ProbeAll(ctxWithin(t, 200*time.Millisecond)); err == nil {
		t.Fatal("ProbeAll answered with the only replica stopped")
	}
	if st := s.Stats()[0]; st.Aside || !st.Usable {
		t.Fatalf("the only replica: %+v, want usable, not set aside", st)
	}
	if answers(s) != 0 {
		t.Fatalf("answers from a stopped replica: %+v", s.Stats())
	}
}

func ctxWithin(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

package replicaset

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/errdefs"
)

// A call goes to the usable replica with the fewest calls in flight, the
// one that answered last first among equals; a suspect one only when no
// other is usable; none set aside or down, and none tried already.
func TestPickReplica(t *testing.T) {
	rs := []*replica{{idx: 0}, {idx: 1}, {idx: 2}}
	for _, r := range rs {
		r.up.Store(true)
	}
	if r := pickReplica(rs, 1, nil); r != rs[1] {
		t.Fatalf("equals: picked %d, want the one that answered last (1)", r.idx)
	}
	rs[1].inflight.Store(2)
	rs[2].inflight.Store(1)
	if r := pickReplica(rs, 1, nil); r != rs[0] {
		t.Fatalf("picked %d, want the least busy (0)", r.idx)
	}
	if r := pickReplica(rs, 1, []bool{true, false, false}); r != rs[2] {
		t.Fatalf("0 tried: picked %d, want 2", r.idx)
	}
	rs[0].suspect.Store(time.Now().UnixNano())
	rs[2].aside.Store(true)
	if r := pickReplica(rs, 0, nil); r != rs[1] {
		t.Fatalf("0 suspect, 2 set aside: picked %d, want 1", r.idx)
	}
	rs[1].up.Store(false)
	if r := pickReplica(rs, 0, nil); r != rs[0] {
		t.Fatalf("only 0, suspect, usable: picked %v, want 0", r)
	}
	rs[0].suspect.Store(time.Now().Add(-2 * suspectFor).UnixNano())
	if !rs[0].healthy() {
		t.Fatal("a replica suspect longer than suspectFor ago is not healthy again")
	}
	rs[0].up.Store(false)
	if r := pickReplica(rs, 0, nil); r != nil {
		t.Fatalf("none usable: picked %d", r.idx)
	}
}

// The hedge budget: hedgeBurst at once, then a token for every
// 1/hedgeRatio calls.
func TestHedgeBudget(t *testing.T) {
	b := hedgeBudget{tokens: hedgeBurst}
	n := 0
	for b.take() {
		n++
	}
	if n != hedgeBurst {
		t.Fatalf("a burst of %d hedges, want %d", n, hedgeBurst)
	}
	for range int(1/hedgeRatio) - 1 {
		b.deposit()
	}
	if b.take() {
		t.Fatal("a hedge before a token was earned")
	}
	b.deposit()
	b.deposit() // float rounding: 1/hedgeRatio deposits may fall short of 1
	if !b.take() {
		t.Fatal("no hedge after a token's worth of calls")
	}
}

// Each kind of call is hedged after its own delay: HedgeDelay, or
// hedgeLatencyFactor times what that kind takes when that is longer; an
// answer from a replica that was stopped does not push the delay out of
// reach.
func TestHedgeDelayPerKind(t *testing.T) {
	s := &Set{opts: Options{HedgeDelay: 20 * time.Millisecond}}
	if d := s.hedgeAfter(Match); d != 20*time.Millisecond {
		t.Fatalf("before any answer: %v, want HedgeDelay", d)
	}
	for range 50 {
		s.observe(Lookup, 500*time.Microsecond)
		s.observe(Match, 60*time.Millisecond)
	}
	if d := s.hedgeAfter(Lookup); d != 20*time.Millisecond {
		t.Errorf("lookups of 0.5 ms: hedged after %v, want HedgeDelay", d)
	}
	if d := s.hedgeAfter(Match); d < 170*time.Millisecond || d > 190*time.Millisecond {
		t.Errorf("matches of 60 ms: hedged after %v, want about %d × 60 ms", d, hedgeLatencyFactor)
	}
	s.observe(Match, 5*time.Second) // a stopped replica's answer
	if d := s.hedgeAfter(Match); d > 300*time.Millisecond {
		t.Errorf("after one answer of 5 s: hedged after %v", d)
	}
	s.opts.HedgeDelay = -1
	if d := s.hedgeAfter(Match); d >= 0 {
		t.Errorf("HedgeDelay negative: %v, want none", d)
	}
}

// A call its caller's own context ended is the caller's business: no
// replica it asked is suspect, and the store is not checked (an engine that
// cancels its lookups costs the master nothing). One left unanswered at its
// caller's bound makes the replicas that had not answered suspect, and has
// the store checked through one of them.
func TestUnansweredOnlyAtTheBound(t *testing.T) {
	rs := []*replica{{idx: 0}, {idx: 1}}
	s := &Set{replicas: rs, store: newStoreWatch(rs, "m", time.Second, nil)}
	c := &call[bool]{s: s, tried: []bool{true, true}, answered: []bool{true, false}, began: time.Now().UnixNano()}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.ctx = ctx
	c.unanswered()
	if rs[0].suspect.Load() != 0 || rs[1].suspect.Load() != 0 {
		t.Fatalf("suspect after a call the caller ended: %d, %d; want none", rs[0].suspect.Load(), rs[1].suspect.Load())
	}
	select {
	case r := <-s.store.check:
		t.Fatalf("the store checked through replica %d after a call the caller ended", r.idx)
	default:
	}

	ctx, cancelCause := context.WithCancelCause(context.Background())
	cancelCause(errdefs.ErrNoReply)
	child, cancelChild := context.WithCancel(ctx) // a call's context, ended by its caller's
	defer cancelChild()
	c.ctx = child
	c.unanswered()
	if rs[0].suspect.Load() != 0 || rs[1].suspect.Load() == 0 {
		t.Fatalf("suspect after a call that ran out its bound: %d, %d; want only the replica that had not answered", rs[0].suspect.Load(), rs[1].suspect.Load())
	}
	select {
	case r := <-s.store.check:
		if r != rs[1] {
			t.Fatalf("the store checked through replica %d, want the one that had not answered", r.idx)
		}
	default:
		t.Fatal("no check of the store after a call that ran out its bound")
	}
}

// A replica that answered a beat sent since the call began is alive: a
// call left unanswered at its bound on it (a slow store, a busy host)
// makes it no suspect.
func TestUnansweredAliveReplicaIsNotSuspect(t *testing.T) {
	rs := []*replica{{idx: 0}, {idx: 1}}
	s := &Set{replicas: rs, store: newStoreWatch(rs, "m", time.Second, nil)}
	began := time.Now().UnixNano()
	rs[0].beats.ackedSent.Store(began + 1)
	c := &call[bool]{s: s, tried: []bool{true, true}, answered: []bool{false, false}, began: began}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errdefs.ErrNoReply)
	c.ctx = ctx
	c.unanswered()
	if rs[0].suspect.Load() != 0 || rs[1].suspect.Load() == 0 {
		t.Fatalf("suspect: %d, %d; want only the replica that answered no beat since the call began", rs[0].suspect.Load(), rs[1].suspect.Load())
	}
}

// A replica whose beat is out and that answered a call after it, then
// nothing for longer than the silence, while another answers its beats,
// is gone at the next round: its waiting calls are hedged.
func TestBeatSilentAfterLastAnswer(t *testing.T) {
	rs := []*replica{{idx: 0}, {idx: 1}}
	for _, r := range rs {
		r.up.Store(true)
	}
	s := &Set{replicas: rs, store: newStoreWatch(rs, "m", time.Second, nil), log: slog.New(slog.DiscardHandler), kick: make(chan struct{}, 1)}
	now := time.Now()
	rs[0].beats.sent.Store(now.Add(-300 * time.Millisecond).UnixNano())
	rs[0].answeredAt.Store(now.Add(-200 * time.Millisecond).UnixNano()) // a call answered after the beat went out
	rs[1].beats.sent.Store(now.UnixNano())                              // its next beat is out: nothing is sent
	rs[1].beats.ackedSent.Store(now.Add(-10 * time.Millisecond).UnixNano())
	var arm hedgeArm
	fired := make(chan struct{})
	arm.t = time.AfterFunc(time.Hour, func() { close(fired) })
	defer arm.t.Stop()
	rs[0].arm(&arm)
	s.beatRound(context.Background())
	if rs[0].suspect.Load() == 0 {
		t.Fatal("a replica silent 200 ms since its last answer, its beat out, is not suspect")
	}
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("the call waiting on it was not hedged")
	}
	if rs[1].suspect.Load() != 0 {
		t.Fatal("the replica that answers its beats is suspect")
	}
}

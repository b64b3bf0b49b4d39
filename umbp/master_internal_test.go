package umbp

import (
	"context"
	"testing"
	"time"
)

// Each kind of call is hedged after its own delay: HedgeDelay, or
// hedgeLatencyFactor times what that kind takes when that is longer; an
// answer from a replica that was stopped does not push the delay out of
// reach.
func TestHedgeDelayPerKind(t *testing.T) {
	b := &masterBackend{hedgeDelay: 20 * time.Millisecond}
	if d := b.hedgeAfter(askMatch); d != 20*time.Millisecond {
		t.Fatalf("before any answer: %v, want HedgeDelay", d)
	}
	for range 50 {
		b.observe(askLookup, 500*time.Microsecond)
		b.observe(askMatch, 60*time.Millisecond)
	}
	if d := b.hedgeAfter(askLookup); d != 20*time.Millisecond {
		t.Errorf("lookups of 0.5 ms: hedged after %v, want HedgeDelay", d)
	}
	if d := b.hedgeAfter(askMatch); d < 170*time.Millisecond || d > 190*time.Millisecond {
		t.Errorf("matches of 60 ms: hedged after %v, want about %d × 60 ms", d, hedgeLatencyFactor)
	}
	b.observe(askMatch, 5*time.Second) // a stopped replica's answer
	if d := b.hedgeAfter(askMatch); d > 300*time.Millisecond {
		t.Errorf("after one answer of 5 s: hedged after %v", d)
	}
	b.hedgeDelay = -1
	if d := b.hedgeAfter(askMatch); d >= 0 {
		t.Errorf("HedgeDelay negative: %v, want none", d)
	}
}

// A call left unanswered makes the replicas it asked suspect; the store is
// checked only when the call ended at the handle's LookupTimeout, not when
// the caller's own context ended it (an engine that cancels its lookups
// costs the master no extra call).
func TestUnansweredChecksTheStoreOnTimeoutOnly(t *testing.T) {
	rs := []*replica{{idx: 0}, {idx: 1}}
	b := &masterBackend{replicas: rs, store: newStoreWatch(rs, "m", time.Second, nil)}
	tried, answered := []bool{true, true}, []bool{true, false}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.unanswered(ctx, tried, answered)
	if rs[0].suspect.Load() != 0 || rs[1].suspect.Load() == 0 {
		t.Fatalf("suspect after a call the caller ended: %d, %d; want only the replica that had not answered", rs[0].suspect.Load(), rs[1].suspect.Load())
	}
	select {
	case r := <-b.store.check:
		t.Fatalf("the store checked through replica %d after a call the caller ended", r.idx)
	default:
	}

	ctx, cancelCause := context.WithCancelCause(context.Background())
	cancelCause(errNoReply)
	b.unanswered(ctx, tried, answered)
	select {
	case r := <-b.store.check:
		if r != rs[1] {
			t.Fatalf("the store checked through replica %d, want the one that had not answered", r.idx)
		}
	default:
		t.Fatal("no check of the store after a call that ran out its LookupTimeout")
	}
}

package umbp

import (
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

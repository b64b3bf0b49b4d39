package backoff

import (
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	p := Policy{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	var got []time.Duration
	d := time.Duration(0)
	for range 5 {
		d = p.Next(d)
		got = append(got, d)
	}
	want := []time.Duration{10, 20, 40, 50, 50}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("pauses %v, want %v ms", got, want)
		}
	}
	p.Factor = 1.5
	if d := p.Next(20 * time.Millisecond); d != 30*time.Millisecond {
		t.Fatalf("factor 1.5 after 20ms: %v", d)
	}
}

func TestJitter(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := p.Next(0)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 80*time.Millisecond || hi > 120*time.Millisecond || hi-lo < 10*time.Millisecond {
		t.Fatalf("jittered pauses within [%v, %v]", lo, hi)
	}
}

func TestGRPC(t *testing.T) {
	c := Policy{Base: 50 * time.Millisecond, Max: time.Second, Factor: 1.6, Jitter: 0.2}.GRPC()
	if c.BaseDelay != 50*time.Millisecond || c.MaxDelay != time.Second || c.Multiplier != 1.6 || c.Jitter != 0.2 {
		t.Fatalf("%+v", c)
	}
}

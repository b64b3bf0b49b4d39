// Package backoff is the module's one way of pacing what it retries: a
// reconnect, a wait for a server to come up, a poll. Each user keeps its
// Policy with the rest of its timings, in its package's policy file.
package backoff

import (
	"math/rand/v2"
	"time"

	grpcbackoff "google.golang.org/grpc/backoff"
)

// Redial is the one pace at which a server that failed a dial, or a probe,
// is asked again: from 50 ms, doubling up to 1 s, ±20%. The lock-step
// connections' dials (internal/h2call's default, internal/conn's lookup
// connections) and the probe after a lookup that overran (umbp) use it.
var Redial = Policy{Base: 50 * time.Millisecond, Max: time.Second, Jitter: 0.2}

// Policy paces attempts: the first pause is Base, each later one Factor
// times the one before, never more than Max; with Jitter, each pause is
// drawn from within ±Jitter of that.
type Policy struct {
	Base, Max time.Duration
	// Factor is how much each pause grows (2 when zero).
	Factor float64
	// Jitter, from 0 to 1, spreads the pauses of many clients apart.
	Jitter float64
}

// Next returns the pause that follows last, the pause before it (zero for
// the first).
func (p Policy) Next(last time.Duration) time.Duration {
	f := p.Factor
	if f == 0 {
		f = 2
	}
	d := p.Base
	if last > 0 {
		// The pause that last was drawn around grew; jitter is drawn
		// anew each time.
		d = min(time.Duration(float64(last)*f), p.Max)
	}
	d = min(max(d, p.Base), p.Max)
	if p.Jitter > 0 {
		d = time.Duration(float64(d) * (1 + p.Jitter*(2*rand.Float64()-1)))
	}
	return d
}

// GRPC is the policy as gRPC's reconnect backoff, for a channel that gRPC
// redials itself.
func (p Policy) GRPC() grpcbackoff.Config {
	f := p.Factor
	if f == 0 {
		f = 2
	}
	return grpcbackoff.Config{BaseDelay: p.Base, Multiplier: f, Jitter: p.Jitter, MaxDelay: p.Max}
}

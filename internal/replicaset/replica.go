package replicaset

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/umbp-go/umbp-go/internal/masterconn"
)

// replica is one master replica's channel, its health and its counters.
type replica struct {
	idx  int
	addr string
	c    *masterconn.Conn

	up        atomic.Bool  // the channel is READY (or settling after its first answer)
	aside     atomic.Bool  // stalled or refusing: probed back
	overtaken atomic.Int32 // calls in a row another replica answered first
	inflight  atomic.Int32
	// suspect is when a call to it last ended unanswered (Unix ns), 0
	// once it answered since: picked only when no other is usable, until
	// it answers or suspectFor passes.
	suspect atomic.Int64
	// answeredAt is when it last answered a call or a probe (Unix ns).
	answeredAt atomic.Int64

	beats beats // liveness.go

	calls, hedges, wins, setAsides atomic.Uint64
	latency                        atomic.Int64 // of its answers, a moving average, ns
}

// usable reports whether r's channel is up and r is not set aside.
func (r *replica) usable() bool { return r.up.Load() && !r.aside.Load() }

// healthy reports whether r is usable and not suspect.
func (r *replica) healthy() bool {
	if !r.usable() {
		return false
	}
	s := r.suspect.Load()
	return s == 0 || time.Now().UnixNano()-s > int64(suspectFor)
}

// alive records that r answered now: not suspect.
func (r *replica) alive() {
	r.answeredAt.Store(time.Now().UnixNano())
	r.suspect.Store(0)
}

// observe folds one answer's time into r's moving average.
func (r *replica) observe(d time.Duration) { observe(&r.latency, d) }

// observe folds d into the moving average at l (weight 1/8).
func observe(l *atomic.Int64, d time.Duration) {
	cur := l.Load()
	if cur == 0 {
		l.Store(int64(d))
		return
	}
	l.Store(cur + (int64(d)-cur)/8)
}

// pickReplica returns the usable replica not tried yet with the fewest
// calls in flight, the one that answered last first among equals (a
// master process asked call after call answers sooner than three asked in
// turn), a suspect one only when no other is usable; nil when there is
// none. tried, when not nil, marks the replicas not to pick; last is the
// one that answered last.
func pickReplica(replicas []*replica, last int, tried []bool) *replica {
	n := len(replicas)
	start := last % n
	var best, suspect *replica
	for k := range n {
		r := replicas[(start+k)%n]
		if (tried != nil && tried[r.idx]) || !r.usable() {
			continue
		}
		if !r.healthy() {
			if suspect == nil || r.inflight.Load() < suspect.inflight.Load() {
				suspect = r
			}
			continue
		}
		if best == nil || r.inflight.Load() < best.inflight.Load() {
			best = r
		}
	}
	if best == nil {
		return suspect
	}
	return best
}

// hedgeBudget bounds hedges as gRFC A6's throttling does: every call
// deposits hedgeRatio tokens, up to hedgeBurst; a hedge takes one.
type hedgeBudget struct {
	mu     sync.Mutex
	tokens float64
}

func (h *hedgeBudget) deposit() {
	h.mu.Lock()
	h.tokens = min(h.tokens+hedgeRatio, hedgeBurst)
	h.mu.Unlock()
}

func (h *hedgeBudget) take() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tokens < 1 {
		return false
	}
	h.tokens--
	return true
}

package replicaset

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Liveness: while calls are in flight, every usable replica is sent a
// beat (a lookup of no key, which never reads the store) every beatEvery.
// A replica whose beat is out and that has answered nothing for
// beatSilence (since the beat went out, or since its last answer when that
// came later), while another answered a beat sent no earlier, is gone:
// suspect and set aside at once, and the calls
// waiting on it are hedged at once, whatever their own hedge delay and the
// hedge budget. So a stopped replica is known within about beatEvery +
// beatSilence however slow the calls are, and a slow store (slow on every
// replica alike) makes no replica look gone: beats do not read it.

// beats is a replica's liveness record.
type beats struct {
	// sent is when its beat in flight was sent (Unix ns), 0 when none is.
	sent atomic.Int64
	// ackedSent is when the last beat it answered was sent (Unix ns).
	ackedSent atomic.Int64
	// flagged: its beat in flight was found silent already.
	flagged atomic.Bool
	n       atomic.Uint64 // beats sent
	rtt     atomic.Int64  // answered beats' time, a moving average (ns)

	// Calls whose first attempt waits on it with a hedge armed.
	mu      sync.Mutex
	waiting map[*hedgeArm]struct{}
}

// hedgeArm is a call's armed hedge: fire launches it now.
type hedgeArm struct {
	t      *time.Timer
	urgent atomic.Bool // the replica is gone: no budget, no waiting
}

func (a *hedgeArm) fire() {
	a.urgent.Store(true)
	a.t.Reset(0)
}

// arm records that a call's first attempt on r waits with hedge a.
func (r *replica) arm(a *hedgeArm) {
	r.beats.mu.Lock()
	if r.beats.waiting == nil {
		r.beats.waiting = make(map[*hedgeArm]struct{})
	}
	r.beats.waiting[a] = struct{}{}
	r.beats.mu.Unlock()
}

func (r *replica) disarm(a *hedgeArm) {
	r.beats.mu.Lock()
	delete(r.beats.waiting, a)
	r.beats.mu.Unlock()
}

// aliveSince reports whether r answered a beat sent at t or later (Unix
// ns): whatever a call to it waits for, the process serves.
func (r *replica) aliveSince(t int64) bool { return r.beats.ackedSent.Load() >= t }

// wakeBeats starts the beats, a call being in flight.
func (s *Set) wakeBeats() {
	select {
	case s.beatKick <- struct{}{}:
	default:
	}
}

// busy reports whether a call is in flight on any replica.
func (s *Set) busy() bool {
	for _, r := range s.replicas {
		if r.inflight.Load() > 0 {
			return true
		}
	}
	return false
}

// beat sends the beats while calls are in flight, until ctx ends. A set
// of one replica sends none: there is no other to tell it apart from.
func (s *Set) beat(ctx context.Context) {
	if len(s.replicas) < 2 {
		return
	}
	t := time.NewTimer(beatEvery)
	defer t.Stop()
	for {
		if !s.busy() {
			select {
			case <-ctx.Done():
				return
			case <-s.beatKick:
			}
		}
		s.beatRound(ctx)
		t.Reset(beatEvery)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// beatRound sends a beat to every usable replica with none in flight, and
// finds the silent.
func (s *Set) beatRound(ctx context.Context) {
	now := time.Now().UnixNano()
	for _, r := range s.replicas {
		if !r.usable() {
			continue
		}
		if sent := r.beats.sent.Load(); sent != 0 {
			// Silent since its beat went out, or since its last answer
			// when that came later (a replica that answered a call and
			// then stopped is as silent, its beat still out).
			last := max(sent, r.answeredAt.Load())
			if now-last > s.silence(r) && s.othersAliveSince(r, last) {
				if r.beats.flagged.Swap(true) {
					r.suspect.Store(now) // still silent: suspect while it lasts
				} else {
					s.gone(r, time.Duration(now-sent))
				}
			}
			continue
		}
		r.beats.sent.Store(now)
		r.beats.flagged.Store(false)
		r.beats.n.Add(1)
		s.wg.Go(func() {
			bctx, cancel := context.WithTimeout(ctx, beatTimeout)
			err := r.c.Probe(bctx, false)
			cancel()
			if err == nil || isStoreFault(err) {
				r.beats.ackedSent.Store(now)
				r.alive()
				observe(&r.beats.rtt, time.Duration(time.Now().UnixNano()-now))
			}
			r.beats.sent.Store(0)
		})
	}
}

// silence is how long r's beat may go unanswered before r is gone:
// beatSilence, or beatSilenceFactor times what the other replicas' beats
// take when that is longer (a host so busy that every process answers
// late tells no stopped one apart from the rest sooner).
func (s *Set) silence(r *replica) int64 {
	d := int64(beatSilence)
	for _, o := range s.replicas {
		if o != r {
			d = max(d, beatSilenceFactor*o.beats.rtt.Load())
		}
	}
	return d
}

// othersAliveSince reports whether a replica other than r answered a beat
// sent at t or later.
func (s *Set) othersAliveSince(r *replica, t int64) bool {
	for _, o := range s.replicas {
		if o != r && o.aliveSince(t) {
			return true
		}
	}
	return false
}

// gone acts on a replica found silent for d while another answered: it is
// suspect, and every call waiting on it is hedged now. It is set aside
// too while two others at least stay usable: with one, a replica that
// carries a stopped one's load and waits on its store (silent, alive) is
// kept, asked only when the other is busier, until it answers or
// suspectFor passes.
func (s *Set) gone(r *replica, d time.Duration) {
	r.suspect.Store(time.Now().UnixNano())
	others := 0
	for _, o := range s.replicas {
		if o != r && o.usable() {
			others++
		}
	}
	if others >= 2 {
		s.setAside(r, fmt.Sprintf("silent to a beat for %v while another replica answered", d.Round(time.Millisecond)))
	}
	r.beats.mu.Lock()
	for a := range r.beats.waiting {
		a.fire()
	}
	r.beats.mu.Unlock()
}

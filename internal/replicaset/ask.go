package replicaset

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/masterconn"
)

// Kind is what a call asks: each kind has its own hedge delay.
type Kind int

const (
	Lookup Kind = iota // BatchLookup
	Match              // MatchExternalKv, for Score
	// Probe is a lookup of no key (Ping): its time is not the lookups',
	// and it is asked while the store is out.
	Probe
	numKinds
)

// An answer is one attempt's.
type answer[T any] struct {
	r     *replica
	v     T
	err   error
	taken time.Duration
}

// Ask runs a call on one usable replica, on the caller's goroutine; on a
// second too, on a goroutine of its own, when the first has not answered
// within the kind's hedge delay (and the budget allows); on another at
// once when one fails. The first good answer wins, and the replicas still
// asking are cancelled and, overtaken call after call, set aside. When
// every replica asked failed, the call fails with their errors; when they
// all said their store is unavailable, with ErrStoreUnavailable. It
// returns ctx's error once ctx ends; the replicas that had not answered
// are then suspect only if ctx ended at its caller's bound (its cause
// errdefs.ErrNoReply), never for a caller's own cancel.
//
// start, on the caller's goroutine, makes what runs the call on one
// replica's channel (it may take what the call sends, such as a share of
// encoded bytes).
func Ask[T any](ctx context.Context, s *Set, kind Kind, start func(*masterconn.Conn) func(context.Context) (T, error)) (T, error) {
	if kind != Probe && s.store.out.Load() {
		var zero T
		return zero, ErrStoreNotAsked
	}
	s.budget.deposit()
	r := s.take(nil, false)
	if r == nil {
		var zero T
		return zero, ErrNoReplica
	}
	delay := s.hedgeAfter(kind)
	if delay <= 0 || len(s.replicas) == 1 {
		// Nothing can hedge it: it runs bare, and what follows serves
		// only its failure.
		a := attempt(ctx, s, r, start(r.c))
		if a.err == nil {
			s.answered(r, kind, a.taken)
			return a.v, nil
		}
		c := newCall(ctx, s, kind, start, r)
		defer c.cancel()
		return c.settle(a)
	}
	c := newCall(ctx, s, kind, start, r)
	defer c.cancel()
	return c.settle(c.first(r, delay))
}

// call is one call's attempts.
type call[T any] struct {
	s      *Set
	kind   Kind
	start  func(*masterconn.Conn) func(context.Context) (T, error)
	ctx    context.Context // ended when the call returns
	cancel context.CancelFunc
	// answers takes the answers of the attempts on goroutines of their
	// own; pending counts the attempts not settled yet.
	answers  chan answer[T]
	pending  int
	began    int64  // Unix ns
	tried    []bool // asked
	answered []bool // asked, and answered or failed
	// won, when not nil, ends the caller's own attempt: another answered.
	won    context.CancelFunc
	errs   []error
	stores int // of errs, the replicas that said their store is unavailable
}

// newCall is the call whose first attempt is on r.
func newCall[T any](ctx context.Context, s *Set, kind Kind, start func(*masterconn.Conn) func(context.Context) (T, error), r *replica) *call[T] {
	c := &call[T]{s: s, kind: kind, start: start, answers: make(chan answer[T], len(s.replicas)), pending: 1,
		tried: make([]bool, len(s.replicas)), answered: make([]bool, len(s.replicas))}
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.tried[r.idx] = true
	c.began = time.Now().UnixNano()
	return c
}

// first runs the attempt on r on the caller's goroutine; a hedge is
// launched if it has not answered within delay, unless r answered a beat
// sent since the call began (r serves: what the call waits for is as slow
// on another replica) or the budget is spent; at once, and whatever the
// budget, when r is suspect or found gone meanwhile (liveness.go). A hedge
// that answers first ends it.
func (c *call[T]) first(r *replica, delay time.Duration) answer[T] {
	run := c.start(r.c)
	own, cancelOwn := context.WithCancel(c.ctx)
	c.won = cancelOwn
	var arm hedgeArm
	if !r.healthy() {
		arm.urgent.Store(true)
		delay = 0
	}
	// The timer launches under mu, and nothing once the caller's attempt
	// has returned.
	var mu sync.Mutex
	done := false
	arm.t = time.AfterFunc(delay, func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		if !arm.urgent.Load() && (r.aliveSince(c.began) || !c.s.budget.take()) {
			return
		}
		if c.launch(true) {
			c.pending++
		}
	})
	r.arm(&arm)
	a := attempt(own, c.s, r, run)
	r.disarm(&arm)
	mu.Lock()
	done = true
	mu.Unlock()
	arm.t.Stop()
	cancelOwn()
	return a
}

// launch starts an attempt on a replica not tried yet, on a goroutine of
// its own; false when there is none.
func (c *call[T]) launch(hedge bool) bool {
	r := c.s.take(c.tried, hedge)
	if r == nil {
		return false
	}
	run := c.start(r.c)
	go func() {
		a := attempt(c.ctx, c.s, r, run)
		if a.err == nil && c.won != nil {
			c.won()
		}
		c.answers <- a
	}()
	return true
}

// settle takes answers, a the first, until one decides the call.
func (c *call[T]) settle(a answer[T]) (T, error) {
	for {
		if v, err, done := c.take(a); done {
			return v, err
		}
		select {
		case a = <-c.answers:
		case <-c.ctx.Done():
			c.unanswered()
			var zero T
			return zero, c.ctx.Err()
		}
	}
}

// take settles one answer; done when it decides the call.
func (c *call[T]) take(a answer[T]) (v T, err error, done bool) {
	c.pending--
	if a.err != nil && c.ctx.Err() != nil {
		// The caller's own attempt, ended with ctx.
		c.unanswered()
		return v, c.ctx.Err(), true
	}
	if c.won != nil && errors.Is(a.err, context.Canceled) {
		// The caller's own attempt, ended by a hedge that answered: that
		// answer is on its way, and this replica was overtaken.
		return v, nil, false
	}
	c.answered[a.r.idx] = true
	if a.err == nil {
		c.s.answered(a.r, c.kind, a.taken)
		for i, r := range c.s.replicas {
			if c.tried[i] && !c.answered[i] && r.answeredAt.Load() < c.began && r.overtaken.Add(1) >= overtakenLimit {
				// Still asking, call after call, when another answered,
				// and it answered nothing (no call, no beat) meanwhile:
				// stalled. Its attempt is cancelled.
				c.s.setAside(r, "overtaken by "+a.r.addr)
			}
		}
		return a.v, nil, true
	}
	c.errs = append(c.errs, fmt.Errorf("%s: %w", a.r.addr, a.err))
	switch {
	case isStoreFault(a.err):
		c.stores++ // the store is every replica's: asking another helps nothing
	case errors.Is(a.err, errdefs.ErrUnavailable):
		// The replica refused or went away under the call: ask another
		// at once.
		c.s.setAside(a.r, a.err.Error())
		if c.launch(false) {
			c.pending++
		}
	}
	if c.pending > 0 {
		return v, nil, false
	}
	if c.stores == len(c.errs) {
		c.s.store.down(a.err)
		return v, fmt.Errorf("%w: %w", ErrStoreUnavailable, errors.Join(c.errs...)), true
	}
	if len(c.errs) == 1 {
		return v, a.err, true
	}
	return v, errors.Join(c.errs...), true
}

// unanswered, when the call ended at its caller's bound (its cause
// errdefs.ErrNoReply) rather than by the caller's own context, marks
// suspect the replicas the call asked that had not answered, unless they
// answered a beat sent since the call began (alive, and slow: a store or
// a host slow for every replica alike makes none of them suspect, and
// holds no call off), and has the store checked through one of them.
func (c *call[T]) unanswered() {
	if !errors.Is(context.Cause(c.ctx), errdefs.ErrNoReply) {
		return // its caller's own context ended it: the caller's business
	}
	now := time.Now().UnixNano()
	for i, r := range c.s.replicas {
		if c.tried[i] && !c.answered[i] {
			if !r.aliveSince(c.began) {
				r.suspect.Store(now)
			}
			c.s.store.suspect(r)
		}
	}
}

// take picks the next replica to ask (pickReplica), marks it in tried
// when tried is not nil, and counts the attempt.
func (s *Set) take(tried []bool, hedge bool) *replica {
	r := pickReplica(s.replicas, int(s.last.Load()), tried)
	if r == nil {
		return nil
	}
	if tried != nil {
		tried[r.idx] = true
	}
	if r.inflight.Add(1) == 1 {
		s.wakeBeats()
	}
	r.calls.Add(1)
	if hedge {
		r.hedges.Add(1)
	}
	return r
}

// attempt runs one attempt taken on r. Its bound is its caller's, unless
// AttemptTimeout is set: so the RPC carries no deadline, which would
// travel to the master as grpc-timeout and cost a timer on both sides.
func attempt[T any](ctx context.Context, s *Set, r *replica, run func(context.Context) (T, error)) answer[T] {
	began := time.Now()
	if s.opts.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.opts.AttemptTimeout)
		defer cancel()
	}
	v, err := run(ctx)
	r.inflight.Add(-1)
	return answer[T]{r, v, err, time.Since(began)}
}

// answered counts an answer r gave to a call of kind in taken.
func (s *Set) answered(r *replica, kind Kind, taken time.Duration) {
	r.wins.Add(1)
	r.alive()
	r.observe(taken)
	s.last.Store(int32(r.idx))
	if kind != Probe {
		s.observe(kind, taken)
	}
	r.overtaken.Store(0)
}

// hedgeAfter is how long an attempt of kind may go unanswered before
// another replica is asked too: HedgeDelay, or hedgeLatencyFactor times
// what such a call takes when that is longer (Score's MatchExternalKv of
// thousands of hashes takes tens of milliseconds on a master whose store
// is Redis) while every usable replica is healthy; negative: never.
func (s *Set) hedgeAfter(kind Kind) time.Duration {
	d := s.opts.HedgeDelay
	if d <= 0 {
		return d
	}
	for _, r := range s.replicas {
		if r.usable() && !r.healthy() {
			return d // one is suspect: the calls' own pace says nothing now
		}
	}
	if l := s.lat[kind].Load(); l > 0 {
		d = max(d, time.Duration(hedgeLatencyFactor*float64(l)))
	}
	return d
}

// observe folds an answer's time into kind's moving average (weight 1/8);
// an answer far slower than the average (a replica that was stopped)
// counts as four times the average, so that one does not turn hedging off.
func (s *Set) observe(kind Kind, d time.Duration) {
	l := &s.lat[kind]
	if cur := l.Load(); cur > 0 {
		d = min(d, 4*time.Duration(cur))
	}
	observe(l, d)
}

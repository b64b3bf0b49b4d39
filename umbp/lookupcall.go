package umbp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/umbp-go/umbp-go/internal/backoff"
	"github.com/umbp-go/umbp-go/internal/daemonpool"
	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/rpc"
)

// The caller is the one owner of a scheduler call's bound: for every call
// a handle makes it decides where the call runs, when it ends, and what a
// call left unanswered does to the calls after it. Its sources say what
// they can do (sourceCaps), not what to do.
//
// A lookup on a source whose lookups are lock-step runs on the caller's
// own goroutine, with no hand-off either way: the call ends when its
// context does, its connection interrupted, so LookupTimeout bounds it as
// surely. The other calls (Score, Clear, Ping, and lookups through
// grpc-go) run on detached goroutines, a few per connection
// (lookupWorkers, for callers of their own at once), and the caller waits
// for each at most LookupTimeout. A call left unanswered either way leaves
// a probe in flight on a detached goroutine (the same question, of no
// key), which holds later calls off (they fail at once) until the server
// answers it; a detached call that overran holds them off until it
// returns, too. On replicas (sourceCaps.replicas), a call that overran is
// ended instead, its replicas suspect, and nothing is held off while
// another replica answered lately. So a stalled server costs a few
// goroutines, never a queue of them, and never a caller's time.
// callsites.go says where each kind of call runs, as the documents quote
// it.

// lookupBackend is what a scheduler handle asks: a standalone server
// through its link (standaloneBackend), or MORI's master (masterBackend).
type lookupBackend interface {
	// encode encodes a lookup's keys for this backend, on the caller's
	// goroutine, leaving out those that cannot be asked about (empty, not
	// UTF-8): the result's At says where the others are in keys.
	encode(keys []string) (encoded.Keys, error)
	// session returns what a call asks now, or the error to answer at
	// once (reconnecting, closed).
	session() (lookupSource, error)
	// states is the handle's state, which the backend moves.
	states() *connState
	capabilities() ServerCapabilities
	// replicaStats are the master's replicas' counters; nil on a
	// standalone server.
	replicaStats() []ReplicaStats
	// close stops the backend and closes its connection within timeout.
	// stuck, when not nil, is done once a call that overran returns: a
	// connection whose close would wait for that call is closed after it,
	// and close says it was left open.
	close(stuck <-chan struct{}, timeout time.Duration) error
}

// lookupSource is one connection's answers to what a scheduler asks (a
// standalone server's), or one replica set's (the master's). Its methods
// report a transport failure to whatever reconnects.
type lookupSource interface {
	// exists and prefix send keys their backend's encode encoded; they
	// free what they do not send.
	exists(ctx context.Context, keys encoded.Keys) ([]bool, error)
	prefix(ctx context.Context, keys encoded.Keys) (int, error)
	// match asks the external KV index which nodes hold hashes.
	match(ctx context.Context, hashes []string) ([]masterconn.NodeMatch, error)
	clear(ctx context.Context) (bool, error)
	ping(ctx context.Context) (ServerCapabilities, error)
	// probe asks what exists (prefix, when prefix) asks, of no key, and
	// returns once the server answers (on a replica set, one replica), the
	// call fails or ctx ends: the probe after a call went unanswered.
	probe(ctx context.Context, prefix bool) error
	// can says what the source can do; the caller decides from it how its
	// calls are made.
	can() sourceCaps
}

// sourceCaps are what a lookupSource can do.
type sourceCaps struct {
	// lockStep: exists and prefix end when their context does (lock-step
	// calls, their connection interrupted), so the caller may make them
	// on its own goroutine.
	lockStep bool
	// replicas, when not nil: several servers answer the same calls, any
	// of them the next; it says whether one answered lately. A call to
	// them ends when its context does.
	replicas answerer
}

// answerer is a replica set (replicaset.Set).
type answerer interface {
	// AnsweredWithin reports whether a replica is there to answer the
	// next call: one healthy that answered within d.
	AnsweredWithin(d time.Duration) bool
}

var (
	// errUnanswered refuses a call while an earlier one that overran its
	// deadline has not returned: the server is stalled, asking again would
	// only queue behind it.
	errUnanswered = fmt.Errorf("%w: an earlier call to the server has not returned", errdefs.ErrNoReply)
	// errBatchBound is the cause that ends a part of a batch the call's
	// bound cut off after the server answered an earlier part: the
	// replicas it asked are not suspect (see ErrBatchTooLarge).
	errBatchBound = errors.New("the batch's bound passed")
)

// caller runs a scheduler handle's calls to its backend's current
// connection, each bounded by timeout: lookups on the caller's goroutine
// where the source is lock-step, the others on its detached goroutines;
// and it holds calls off after one was left unanswered.
type caller struct {
	backend lookupBackend
	timeout time.Duration

	mu sync.Mutex
	// calls runs the calls to the current connection; a new connection
	// gets a new pool, so that no call queues behind one stuck on the old.
	calls *daemonpool.Pool
	// Later calls are held off (they fail at once) while a call that
	// overran has not returned (unanswered, the Done channel of a detached
	// call) and, where there is one, no probe since has been answered
	// (probe, the Done channel of the probe overran started, when
	// probeHolds: no other replica was there to answer).
	unanswered <-chan struct{}
	probe      <-chan struct{}
	probeHolds bool
	closed     bool
	done       chan struct{} // closed by close
}

func newCaller(b lookupBackend, timeout time.Duration) (*caller, error) {
	p, err := newLookupPool()
	if err != nil {
		return nil, err
	}
	return &caller{backend: b, timeout: timeout, calls: p, done: make(chan struct{})}, nil
}

// newLookupPool is the detached goroutines that the calls to one
// connection run on.
func newLookupPool() (*daemonpool.Pool, error) {
	return daemonpool.New(lookupWorkers, "umbp-lookup", nil)
}

// heldOffLocked reports whether calls are held off now; c.mu is held.
func (c *caller) heldOffLocked() bool {
	probe := c.probe
	if !c.probeHolds {
		probe = nil
	}
	switch {
	case c.unanswered != nil && probe != nil:
		return !isDone(c.unanswered) && !isDone(probe)
	case c.unanswered != nil:
		return !isDone(c.unanswered)
	case probe != nil:
		return !isDone(probe)
	}
	return false
}

// callKind is what a call asks, for what may run on the caller's goroutine
// and how a server that let it overrun is asked again.
type callKind uint8

const (
	callOther  callKind = iota // Score, Clear, Ping: always detached
	callExists                 // Lookup
	callPrefix                 // LookupPrefix
)

// call runs fn on one of c's detached goroutines and waits for it until
// b's deadline (the end of the caller's call's bound: it began at the
// call) or until ctx ends; what names the call in its errors. A lookup (kind
// callExists or callPrefix) on a source whose lookups are lock-step runs
// on the caller's goroutine instead (callInline).
//
// How the call ended decides what it means for the next one, here alone:
// an answer, or the server's refusal, is the call's result; a call the
// server left unanswered at the bound holds later calls off (overran); a
// call whose caller's context ended first is that caller's: it ends, and
// nothing else happens, unless the server then lets a detached call run
// past the bound, which is the server's lateness and held against it then.
func call[T any](ctx context.Context, c *caller, kind callKind, b bound, fn func(lookupSource, context.Context) (T, error)) (T, error) {
	var zero T
	deadline := b.deadline
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return zero, ErrClosed
	}
	// Read under c.mu: a replaced connection swaps the pool under c.mu
	// after swapping the connection, so a call never runs on a new pool
	// against an old connection.
	src, err := c.backend.session()
	if err != nil {
		c.mu.Unlock()
		return zero, err
	}
	if c.heldOffLocked() {
		c.mu.Unlock()
		return zero, errUnanswered
	}
	if !time.Now().Before(deadline) {
		// The bound passed on the caller's side (encoding, earlier parts):
		// nothing is asked, and nothing held against the server.
		c.mu.Unlock()
		return zero, c.outOfBound()
	}
	c.unanswered = nil
	if c.probeHolds || (c.probe != nil && isDone(c.probe)) {
		c.probe = nil // a probe out that holds nothing off is kept: one at a time
	}
	caps := src.can()
	if kind != callOther && caps.lockStep {
		c.mu.Unlock()
		return callInline(ctx, c, src, kind, b, fn)
	}
	pool := c.calls
	// The RPC itself carries no deadline: a deadline costs a timer on
	// both sides of every call (measured: about a third of a 1024-key
	// lookup), and a call that overran is waited out rather than repeated
	// anyway. On the master's replicas, others answer the next call: one
	// that overran is ended instead (end), which marks the replicas it
	// asked suspect, and then settles what it holds off (ended).
	dctx, end := context.Background(), context.CancelCauseFunc(nil)
	var stopped atomic.Bool
	if caps.replicas != nil {
		dctx, end = context.WithCancelCause(context.Background())
		defer end(nil)
	}
	var f *daemonpool.Future[T]
	f, err = daemonpool.Submit(pool, func() (T, error) {
		v, err := fn(src, dctx)
		if stopped.Load() {
			c.ended(src, pool, kind, f.Done())
		}
		return v, err
	})
	c.mu.Unlock()
	if err != nil {
		return zero, err
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-f.Done():
		return f.Result()
	case <-timer.C:
	case <-ctx.Done():
	}
	select {
	case <-f.Done(): // answered just in time
		return f.Result()
	default:
	}
	left := time.Now().Before(deadline) // the caller left first: its business alone
	if f.Cancel() {
		// It never started, and holds nothing up.
	} else if end != nil {
		switch {
		case left:
			end(context.Canceled) // the replicas it asked are not suspect
		case b.partAnswered:
			end(errBatchBound) // nor are they for a batch too large
		default:
			stopped.Store(true)
			c.holdWhile(src, pool, kind, f.Done())
			end(errdefs.ErrNoReply) // the store is checked then
		}
	} else {
		// It goes on. A call the bound ended with no answer at all holds
		// later calls off now, until it returns, as a lock-step one does;
		// one its caller left, or a part of a batch the server was
		// answering, once the server has had it for LookupTimeout.
		// (From now: it began before, and at the latest now.)
		if !left && !b.partAnswered {
			c.overran(src, pool, kind, f.Done())
		} else {
			c.lateAt(src, pool, kind, f.Done(), time.Now().Add(c.timeout))
		}
	}
	switch {
	case left:
		return zero, ctx.Err()
	case b.partAnswered:
		return zero, c.outOfBound()
	}
	return zero, c.noReply()
}

// lateAt holds later calls off (overran) if the detached call whose Done
// channel is done is still unanswered at late.
func (c *caller) lateAt(src lookupSource, pool *daemonpool.Pool, kind callKind, done <-chan struct{}, late time.Time) {
	hold := func() {
		if !isDone(done) {
			c.overran(src, pool, kind, done)
		}
	}
	if d := time.Until(late); d > 0 {
		time.AfterFunc(d, hold)
		return
	}
	hold()
}

// A call's error says how it ended, and the handle's (opError) what the
// call was; a call whose caller's context ended first ends with that
// context's error alone.

// noReply is the error of a call that got no answer within its bound.
func (c *caller) noReply() error {
	return fmt.Errorf("%w within %v: %w", errdefs.ErrNoReply, c.timeout, context.DeadlineExceeded)
}

// outOfBound is the error of a call whose bound passed on the caller's
// side: after the server answered earlier parts of its batch, or before
// anything was asked.
func (c *caller) outOfBound() error {
	return fmt.Errorf("%w (%v): %w", ErrBatchTooLarge, c.timeout, context.DeadlineExceeded)
}

// bound is a call's bound: its deadline, LookupTimeout from the start of
// the handle's call, and whether the server answered an earlier part of
// the same call (it is alive: a part the deadline cuts off is the batch's
// size, not the server's lateness, and holds nothing off).
type bound struct {
	deadline     time.Time
	partAnswered bool
}

// newBound is the bound of a call that begins now.
func (c *caller) newBound() bound { return bound{deadline: time.Now().Add(c.timeout)} }

// A batch is asked in parts of at most lookupPartKeys keys and
// lookupPartBytes bytes of keys, each encoded just before it is asked, so
// that the call's bound covers its encoding and a batch too large to ask
// within it is answered as far as it got.
const (
	lookupPartKeys  = 4096
	lookupPartBytes = 1 << 20
)

// partEnd is the end of the part of keys that begins at i. A key too large
// to be asked about weighs nothing: it is left out.
func partEnd(keys []string, i int) int {
	n, j := 0, i
	for ; j < len(keys) && j-i < lookupPartKeys; j++ {
		if l := len(keys[j]); l <= rpc.MaxKeyBytes {
			if n += l; n > lookupPartBytes && j > i {
				break
			}
		}
	}
	return j
}

// partsLeft reports why no further part of a call may be asked: its
// caller's context ended, or its bound passed after a part was answered
// (before, call says: a call held off says so first); nil when one may.
func (c *caller) partsLeft(ctx context.Context, b bound) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.partAnswered && !time.Now().Before(b.deadline) {
		return c.outOfBound()
	}
	return nil
}

// exists answers in hits, one per key of keys, whether the server holds
// it, part by part within the call's bound; answered is how
// many leading keys have an answer, and err why the others have none. A
// key that cannot be asked about (encodeKeys leaves it out) is a miss.
func (c *caller) exists(ctx context.Context, b bound, encodeKeys func([]string) (encoded.Keys, error), keys []string, hits []bool) (answered int, err error) {
	for i := 0; i < len(keys); {
		if err := c.partsLeft(ctx, b); err != nil {
			return i, err
		}
		j := partEnd(keys, i)
		q, err := encodeKeys(keys[i:j])
		if err != nil {
			return i, err
		}
		if q.N > 0 {
			n := q.N // keys are freed once sent
			part, err := call(ctx, c, callExists, b, func(src lookupSource, ctx context.Context) ([]bool, error) {
				hits, err := src.exists(ctx, q)
				if err == nil && len(hits) != n {
					return nil, fmt.Errorf("%d results for %d keys", len(hits), n)
				}
				return hits, err
			})
			if err != nil {
				return i, err
			}
			b.partAnswered = true
			if q.At == nil {
				copy(hits[i:j], part)
			} else {
				for k, at := range q.At {
					hits[i+at] = part[k]
				}
			}
		}
		i = j
	}
	return len(keys), nil
}

// prefix returns how many leading keys of keys the server holds, part by
// part within the call's bound: on an error, the count of the parts
// answered before it. A key that cannot be asked about, or one that
// first (quarantine) cuts off, ends the prefix.
func (c *caller) prefix(ctx context.Context, b bound, encodeKeys func([]string) (encoded.Keys, error), first func([]string) int, keys []string) (int, error) {
	total := 0
	for i := 0; i < len(keys); {
		if err := c.partsLeft(ctx, b); err != nil {
			return total, err
		}
		end := partEnd(keys, i)
		j := i + first(keys[i:end])
		if j == i {
			return total, nil
		}
		q, err := encodeKeys(keys[i:j])
		if err == nil && q.At != nil {
			// A key that cannot be asked about ends the prefix: the keys
			// before it are asked about alone.
			q.Free()
			j = i + slices.IndexFunc(keys[i:j], func(k string) bool { return !lookupKeyOK(k) })
			if j == i {
				return total, nil
			}
			q, err = encodeKeys(keys[i:j])
		}
		if err != nil {
			return total, err
		}
		want := j - i
		n, err := call(ctx, c, callPrefix, b, func(src lookupSource, ctx context.Context) (int, error) {
			return checkedPrefix(src, ctx, q, want)
		})
		total += n
		if err != nil || n < want || j < end {
			return total, err
		}
		b.partAnswered = true
		i = j
	}
	return total, nil
}

// checkedPrefix asks src for the prefix of keys, of which there are n.
func checkedPrefix(src lookupSource, ctx context.Context, keys encoded.Keys, n int) (int, error) {
	count, err := src.prefix(ctx, keys)
	if err == nil && (count < 0 || count > n) {
		return 0, fmt.Errorf("count %d for %d keys", count, n)
	}
	return count, err
}

// callInline runs fn on the caller's goroutine, ended at b's deadline or
// when ctx ends. One ended at its deadline with no answer at all leaves a
// probe in flight (overran): the server let it overrun. A part of a batch
// the server was answering, cut off by the deadline, says nothing of the
// server, and neither does a call whose caller's context ended.
func callInline[T any](ctx context.Context, c *caller, src lookupSource, kind callKind, b bound, fn func(lookupSource, context.Context) (T, error)) (T, error) {
	var zero T
	// A timer that cancels, rather than a deadline: a deadline would
	// travel to the server (grpc-timeout), which would then keep a timer
	// of its own for every call.
	cctx, cancel := context.WithCancelCause(ctx)
	var expired atomic.Bool
	cause := error(errdefs.ErrNoReply) // replicas asked are suspect, the store checked
	if b.partAnswered {
		cause = errBatchBound
	}
	t := time.AfterFunc(time.Until(b.deadline), func() {
		expired.Store(true)
		cancel(cause)
	})
	v, err := fn(src, cctx)
	t.Stop()
	cancel(nil)
	switch {
	case err == nil:
		return v, nil
	case expired.Load() && b.partAnswered:
		return zero, c.outOfBound()
	case expired.Load():
		c.overran(src, nil, kind, nil)
		return zero, c.noReply()
	case ctx.Err() != nil:
		return zero, ctx.Err()
	}
	return zero, err
}

// overran holds later calls off after a call to src overran: while stuck,
// the Done channel of a detached call that overran, has not returned, and
// until a probe answers where there is one. A probe (src.probe, on a
// detached goroutine, with no bound) follows a lock-step call (stuck nil:
// it was ended), and any call to replicas, where it finds another replica
// that answers at once. A lock-step call to replicas holds nothing off
// while another replica answered within the bound (answeredWithin): its
// probe only sets the silent aside. pool, when not nil, is the pool stuck
// runs on: a call on a pool replaced meanwhile holds nothing up (its
// connection is closed).
func (c *caller) overran(src lookupSource, pool *daemonpool.Pool, kind callKind, stuck <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.heldOffLocked() || (pool != nil && c.calls != pool) {
		return
	}
	if now, err := c.backend.session(); err != nil || now != src {
		return // replaced, or reconnecting: nothing to hold off
	}
	// A lock-step call that overran has returned, its replicas marked
	// suspect: others that answered meanwhile take the next calls. A
	// detached one is still waiting, on a replica not known here: it
	// holds calls off.
	caps := src.can()
	hold := stuck != nil || !answeredWithin(caps, c.timeout)
	c.unanswered = stuck
	if stuck != nil && caps.replicas == nil {
		c.probe = nil
		return
	}
	if c.probe != nil && !isDone(c.probe) {
		// A probe out already asks every replica: it now holds calls
		// off if this one must.
		c.probeHolds = c.probeHolds || hold
		return
	}
	c.probe, c.probeHolds = nil, hold
	prefix := kind == callPrefix
	f, err := daemonpool.Submit(c.calls, func() (struct{}, error) {
		for pause := time.Duration(0); ; {
			err := src.probe(context.Background(), prefix)
			if err == nil || c.gone(src) {
				return struct{}{}, err
			}
			// Failed (the server refused the connection, a dial that
			// timed out): ask again, paced, while src is the connection.
			pause = backoff.Redial.Next(pause)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return struct{}{}, ErrClosed
			}
		}
	})
	if err == nil {
		c.probe = f.Done()
	}
}

// holdWhile is overran for a detached call to the master's replicas that
// its caller stopped waiting for and is ending (done is its Done channel):
// which replica holds it up is known only once it returns (ended), so it
// holds nothing off if another replica answered within half the timeout,
// while it waited (none it waits on has answered since it began, or it
// would not be waiting).
func (c *caller) holdWhile(src lookupSource, pool *daemonpool.Pool, kind callKind, done <-chan struct{}) {
	if answeredWithin(src.can(), c.timeout/2) {
		return
	}
	c.overran(src, pool, kind, done)
}

// ended settles what a detached call to the master's replicas holds off,
// once it returns, ended by its caller that stopped waiting (done is its
// Done channel, closed just after): the replicas it asked are suspect now,
// so overran can tell whether others answer.
func (c *caller) ended(src lookupSource, pool *daemonpool.Pool, kind callKind, done <-chan struct{}) {
	c.mu.Lock()
	if c.unanswered == done {
		c.unanswered = nil
	}
	c.mu.Unlock()
	c.overran(src, pool, kind, nil)
}

// gone reports whether calls no longer go to src.
func (c *caller) gone(src lookupSource) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now, err := c.backend.session()
	return c.closed || err != nil || now != src
}

// reset gives the calls to a new connection new goroutines: a call stuck
// on the old one holds nothing up (the old connection is closed, which
// ends it).
func (c *caller) reset() {
	pool, err := newLookupPool()
	if err != nil {
		return // the old goroutines serve on; the old connection's calls fail
	}
	c.mu.Lock()
	old := c.calls
	if c.closed {
		c.mu.Unlock()
		pool.Shutdown() // close shut the old one down
		return
	}
	c.calls, c.unanswered, c.probe, c.probeHolds = pool, nil, nil, false
	c.mu.Unlock()
	old.Shutdown()
}

// close refuses calls from now on and returns the Done channel of a call
// that overran and has not returned (nil when there is none), and whether
// this was the first close.
func (c *caller) close() (stuck <-chan struct{}, first bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, false
	}
	c.closed = true
	close(c.done)
	calls := c.calls
	stuck = c.unanswered // a probe, lock-step, ends with the connection
	c.mu.Unlock()
	calls.Shutdown()
	if stuck != nil && isDone(stuck) {
		stuck = nil
	}
	return stuck, true
}

// answeredWithin reports whether another of caps' replicas answered
// within d; false where there are none.
func answeredWithin(caps sourceCaps, d time.Duration) bool {
	return caps.replicas != nil && caps.replicas.AnsweredWithin(d)
}

func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

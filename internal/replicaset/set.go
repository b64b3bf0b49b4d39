// Package replicaset is a handle's view of MORI's master replicas: a gRPC
// channel to each, their health, which replica a call goes to, a call's
// hedges and failovers, the probes that bring a replica set aside back,
// and the metadata store they share (one fault, told apart from a
// replica's). One master is a set of one.
//
// A call goes to one usable replica, the least busy, the one that answered
// last among equals; one that has not answered within its kind's hedge
// delay is sent to a second too (budgeted), and the first good answer wins,
// the other cancelled; a failed attempt fails over to a replica not asked
// yet. A replica overtaken, failing, or left unanswered by a call its
// caller ended is set aside or suspect, and probed back (unless it is the
// last usable); one whose channel is down is left to gRPC's redial.
//
// The set decides where a call goes and what each attempt's outcome says
// of a replica; how long a call may take is its caller's: Ask ends when
// its context does, and the cause says whether the caller's bound passed
// (errdefs.ErrNoReply: the store is checked then) or its own caller gave
// up.
package replicaset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/masterconn"
)

// ErrNoReplica is the error of a call made while no replica is usable.
var ErrNoReplica = fmt.Errorf("%w: no master replica is usable", errdefs.ErrUnavailable)

// Options configure a Set.
type Options struct {
	// Addresses are the replicas', one at least.
	Addresses []string
	// Conn configures each replica's channel; its Address is each one's,
	// and its Redial and ConnectTimeout the set's (policy.go).
	Conn masterconn.Options
	// AttemptTimeout, when positive, bounds each attempt on its own (the
	// caller's bound ends every attempt anyway); zero: none, and the RPC
	// carries no deadline.
	AttemptTimeout time.Duration
	// StoreTimeout bounds a check of the store.
	StoreTimeout time.Duration
	// HedgeDelay is how long an attempt may go unanswered before another
	// replica is asked too (longer for a kind of call that takes longer);
	// negative: never.
	HedgeDelay time.Duration
	Log        *slog.Logger
	// Changed, when not nil, runs when a replica became usable or stopped
	// being so, with what Usable answers then.
	Changed func(usable bool)
}

// Set is a handle's channels to MORI's master replicas. Its methods are
// safe for concurrent use.
type Set struct {
	replicas []*replica
	masters  string // the replicas' addresses, for logs
	opts     Options
	log      *slog.Logger
	budget   hedgeBudget
	store    *storeWatch

	last atomic.Int32 // the replica that answered last: the next pick starts there
	// lat is each kind of call's answer time, a moving average (ns), which
	// sets its hedge delay.
	lat      [numKinds]atomic.Int64
	kick     chan struct{} // wakes the prober
	beatKick chan struct{} // wakes the beats: a call is in flight
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// Open opens a channel to every replica and waits, at most until ctx ends,
// for each to answer; one at least must. A replica that did not is set
// aside and probed back.
func Open(ctx context.Context, opts Options) (*Set, error) {
	if len(opts.Addresses) == 0 {
		return nil, errors.New("no master replica given")
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Set{masters: strings.Join(opts.Addresses, ","), opts: opts, log: log, kick: make(chan struct{}, 1), beatKick: make(chan struct{}, 1)}
	s.budget.tokens = hedgeBurst
	for i, addr := range opts.Addresses {
		co := opts.Conn
		co.Address, co.Redial, co.ConnectTimeout = addr, redial, connectTimeout
		c, err := masterconn.New(co)
		if err != nil {
			s.closeChannels()
			return nil, err
		}
		s.replicas = append(s.replicas, &replica{idx: i, addr: addr, c: c})
	}
	s.store = newStoreWatch(s.replicas, s.masters, opts.StoreTimeout, log)
	if err := s.attach(ctx); err != nil {
		s.closeChannels()
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	for _, r := range s.replicas {
		s.wg.Go(func() { s.watch(wctx, r) })
	}
	s.wg.Go(func() { s.probe(wctx) })
	s.wg.Go(func() { s.beat(wctx) })
	s.wg.Go(func() { s.store.run(wctx) })
	return s, nil
}

// attach asks every replica at once; once one has answered, the others
// get attachGrace more, then are set aside and probed back. It fails when
// none answered before ctx ended.
func (s *Set) attach(ctx context.Context) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type probed struct {
		i   int
		err error
	}
	done := make(chan probed, len(s.replicas))
	for i, r := range s.replicas {
		go func() { done <- probed{i, r.c.Probe(pctx, true)} }()
	}
	errs := make([]error, len(s.replicas))
	for i := range errs {
		errs[i] = context.Canceled // not answered in time
	}
	answered := 0
	var grace <-chan time.Time
wait:
	for left := len(s.replicas); left > 0; left-- {
		select {
		case p := <-done:
			errs[p.i] = p.err
			if p.err == nil {
				answered++
				if grace == nil {
					t := time.NewTimer(attachGrace)
					defer t.Stop()
					grace = t.C
				}
			}
		case <-grace:
			break wait
		}
	}
	cancel() // a probe still waiting fails; it is set aside below
	for i, r := range s.replicas {
		if errs[i] == nil {
			r.up.Store(true)
		} else {
			r.aside.Store(true)
			errs[i] = fmt.Errorf("%s: %w", r.addr, errs[i])
		}
	}
	switch {
	case answered > 0:
		return nil
	case len(errs) == 1:
		return errors.Unwrap(errs[0])
	}
	return errors.Join(errs...)
}

// Close stops the set's watchers and closes its channels, which cancels
// the calls on them.
func (s *Set) Close() {
	s.stop()
	s.wg.Wait()
	s.closeChannels()
}

func (s *Set) closeChannels() {
	for _, r := range s.replicas {
		_ = r.c.Close()
	}
}

// Usable reports whether a replica at least is usable: its channel up, not
// set aside.
func (s *Set) Usable() bool {
	for _, r := range s.replicas {
		if r.usable() {
			return true
		}
	}
	return false
}

// AnsweredWithin reports whether a replica is there to answer the next
// call: one healthy (no call to it ended unanswered since it last
// answered) that answered within d.
func (s *Set) AnsweredWithin(d time.Duration) bool {
	since := time.Now().Add(-d).UnixNano()
	for _, r := range s.replicas {
		if r.healthy() && r.answeredAt.Load() > since {
			return true
		}
	}
	return false
}

// Stat is one replica's state and counters.
type Stat struct {
	Addr string
	// Usable: its channel is up and it is not set aside.
	Usable bool
	// Aside: it was overtaken or failed, and is probed until it answers.
	Aside bool
	// Calls counts attempts sent to it, Hedges those sent because another
	// had not answered in time, Answers its answers used, SetAsides the
	// times it was set aside.
	Calls, Hedges, Answers, SetAsides uint64
	// Latency is a moving average of its answers' time.
	Latency time.Duration
	// Beats counts the liveness checks sent to it while calls were in
	// flight (liveness.go).
	Beats uint64
}

// Stats returns every replica's, in the order of Options.Addresses.
func (s *Set) Stats() []Stat {
	out := make([]Stat, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = Stat{
			Addr: r.addr, Usable: r.usable(), Aside: r.aside.Load(),
			Calls: r.calls.Load(), Hedges: r.hedges.Load(), Answers: r.wins.Load(), SetAsides: r.setAsides.Load(),
			Latency: time.Duration(r.latency.Load()), Beats: r.beats.n.Load(),
		}
	}
	return out
}

// watch follows r's channel until ctx ends: READY is up, anything else
// down; an idle channel (a lost connection) is redialled at once.
func (s *Set) watch(ctx context.Context, r *replica) {
	// The channel's state can lag behind the call that proved it working
	// (gRPC installs the picker before it reports READY): a CONNECTING
	// before the first READY is that lag, not a lost master.
	settled := !r.up.Load()
	for st := r.c.State(); ; st = r.c.State() {
		up := false
		switch st {
		case connectivity.Ready:
			up, settled = true, true
		case connectivity.Connecting:
			up = !settled
		case connectivity.Idle:
			r.c.Connect()
		case connectivity.Shutdown:
			return
		}
		if st != connectivity.Connecting {
			settled = true
		}
		if r.up.Swap(up) != up {
			s.log.Debug("UMBP master replica's channel", "replica", r.addr, "up", up, "grpc_state", st.String())
			s.changed()
			s.poke()
		}
		if !r.c.WaitForStateChange(ctx, st) {
			return
		}
	}
}

func (s *Set) changed() {
	if s.opts.Changed != nil {
		s.opts.Changed(s.Usable())
	}
}

func (s *Set) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// setAside takes r out of the calls' way until a probe answers, unless it
// is the last usable replica: a set whose every replica is stuck is the
// caller's to wait out. It reports whether r is set aside.
func (s *Set) setAside(r *replica, why string) bool {
	others := false
	for _, o := range s.replicas {
		if o != r && o.usable() {
			others = true
			break
		}
	}
	if !others || !r.aside.CompareAndSwap(false, true) {
		return r.aside.Load()
	}
	r.setAsides.Add(1)
	s.log.Debug("UMBP master replica set aside; probing it", "replica", r.addr, "why", why)
	s.changed()
	s.poke()
	return true
}

// probe asks every replica set aside, every probeInterval, whether it
// answers again (a call of no keys, bounded by probeTimeout); one that
// does is used again.
func (s *Set) probe(ctx context.Context) {
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.kick:
		}
		var wg sync.WaitGroup
		for _, r := range s.replicas {
			if !r.aside.Load() || !r.up.Load() {
				continue // usable, or down: gRPC redials it
			}
			wg.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, probeTimeout)
				err := r.c.ProbeLookup(pctx)
				cancel()
				if err == nil {
					r.alive()
				}
				if err == nil && r.aside.CompareAndSwap(true, false) {
					s.log.Debug("UMBP master replica answers again", "replica", r.addr)
					s.changed()
				}
			})
		}
		wg.Wait()
	}
}

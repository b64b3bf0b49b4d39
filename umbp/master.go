package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
)

// A handle on MORI's master keeps one gRPC channel per replica (one for a
// single master). A call goes to one usable replica, the least busy, the
// one that answered last among equals; one that has not answered within
// its kind's hedge delay is sent to a second too (budgeted), and the first
// good answer wins, the other cancelled; a failed attempt fails over to a
// replica not asked yet. A replica overtaken, failing, or silent past
// LookupTimeout is set aside and probed back (unless it is the last
// usable: then later calls answer misses until it answers); one whose
// channel is down is left to gRPC's redial. Every replica reporting its
// metadata store unavailable is one fault, the store's, not theirs.

// masterBackend is a scheduler handle's channels to MORI's master.
type masterBackend struct {
	replicas   []*replica
	masters    string // the replicas' addresses, for logs
	rpcTimeout time.Duration
	// lookupTimeout is the bound every call to the replicas has from its
	// caller (a lock-step call's timer, a detached call's end).
	lookupTimeout time.Duration
	hedgeDelay    time.Duration
	lockStep      bool // BatchLookup is lock-step (not ClusterConfig.GRPCLookups)
	log           *slog.Logger
	budget        hedgeBudget
	store         *storeWatch

	st   connState
	last atomic.Int32 // the replica that answered last: the next pick starts there
	// lat is each kind of call's answer time, a moving average (ns), which
	// sets its hedge delay.
	lat  [numAskKinds]atomic.Int64
	kick chan struct{} // wakes the prober
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// newMasterBackend opens a channel to every replica and waits, at most
// until ctx ends, for each to answer; one at least must. A replica that
// did not is set aside and probed back.
func newMasterBackend(ctx context.Context, cfg ClusterConfig) (*masterBackend, error) {
	b := &masterBackend{
		masters:       strings.Join(cfg.Masters, ","),
		rpcTimeout:    cfg.Timeout,
		lookupTimeout: cfg.LookupTimeout,
		hedgeDelay:    cfg.HedgeDelay,
		lockStep:      !cfg.GRPCLookups,
		log:           cfg.Logger,
		kick:          make(chan struct{}, 1),
	}
	b.budget.tokens = hedgeBurst
	for i, addr := range cfg.Masters {
		c, err := masterconn.New(masterconn.Options{
			Address:        addr,
			Creds:          cfg.TransportCredentials,
			AllowPlaintext: cfg.AllowPlaintext,
			MaxReplyBytes:  cfg.MaxReplyBytes,
			MaxNodes:       cfg.MaxNodes,
			StatsHandler:   cfg.StatsHandler,
			Redial:         masterRedial,
			ConnectTimeout: masterConnectTimeout,
			GRPCLookups:    cfg.GRPCLookups,
		})
		if err != nil {
			b.closeChannels()
			return nil, err
		}
		b.replicas = append(b.replicas, &replica{idx: i, addr: addr, c: c})
	}
	b.store = newStoreWatch(b.replicas, b.masters, cfg.Timeout, cfg.Logger)
	// Every replica is asked at once; once one has answered, the others
	// get attachGrace more, then are set aside and probed back.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type probed struct {
		i   int
		err error
	}
	done := make(chan probed, len(b.replicas))
	for i, r := range b.replicas {
		go func() { done <- probed{i, r.c.Probe(pctx, true)} }()
	}
	errs := make([]error, len(b.replicas))
	for i := range errs {
		errs[i] = context.Canceled // not answered in time
	}
	answered := 0
	var grace <-chan time.Time
	for left := len(b.replicas); left > 0; {
		select {
		case p := <-done:
			left--
			errs[p.i] = p.err
			if p.err == nil {
				answered++
				if grace == nil {
					t := time.NewTimer(attachGrace)
					defer t.Stop()
					grace = t.C
				}
			}
			continue
		case <-grace:
		}
		break
	}
	cancel() // a probe still waiting fails; it is set aside below
	for i, r := range b.replicas {
		if errs[i] == nil {
			r.up.Store(true)
		} else {
			r.aside.Store(true)
			errs[i] = fmt.Errorf("%s: %w", r.addr, errs[i])
		}
	}
	if answered == 0 {
		b.closeChannels()
		if len(errs) == 1 {
			return nil, errors.Unwrap(errs[0])
		}
		return nil, errors.Join(errs...)
	}
	wctx, stop := context.WithCancel(context.Background())
	b.stop = stop
	for _, r := range b.replicas {
		b.wg.Go(func() { b.watch(wctx, r) })
	}
	b.wg.Go(func() { b.probe(wctx) })
	b.wg.Go(func() { b.store.run(wctx) })
	return b, nil
}

func (b *masterBackend) closeChannels() {
	for _, r := range b.replicas {
		_ = r.c.Close()
	}
}

// watch follows r's channel until close: READY is up, anything else down;
// an idle channel (a lost connection) is redialled at once.
func (b *masterBackend) watch(ctx context.Context, r *replica) {
	// The channel's state can lag behind the call that proved it working
	// (gRPC installs the picker before it reports READY): a CONNECTING
	// before the first READY is that lag, not a lost master.
	settled := !r.up.Load()
	for s := r.c.State(); ; s = r.c.State() {
		up := false
		switch s {
		case connectivity.Ready:
			up, settled = true, true
		case connectivity.Connecting:
			up = !settled
		case connectivity.Idle:
			r.c.Connect()
		case connectivity.Shutdown:
			return
		}
		if s != connectivity.Connecting {
			settled = true
		}
		if r.up.Swap(up) != up {
			b.log.Debug("UMBP master replica's channel", "replica", r.addr, "up", up, "grpc_state", s.String())
			b.update()
			b.poke()
		}
		if !r.c.WaitForStateChange(ctx, s) {
			return
		}
	}
}

// update moves the handle's state: connected while one replica at least
// is usable.
func (b *masterBackend) update() {
	next := StateReconnecting
	for _, r := range b.replicas {
		if r.usable() {
			next = StateConnected
			break
		}
	}
	if prev := b.st.get(); prev != next && b.st.move(prev, next) {
		if next == StateConnected {
			b.log.Info("UMBP master is back; lookups go to it again", "masters", b.masters)
		} else {
			b.log.Warn("no UMBP master replica answers; lookups answer misses until one does", "masters", b.masters)
		}
	}
}

func (b *masterBackend) poke() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// setAside takes r out of the calls' way until a probe answers, unless it
// is the last usable replica: a pool whose every replica is stuck is the
// caller's to wait out (its calls then answer misses at once).
func (b *masterBackend) setAside(r *replica, why string) (aside bool) {
	others := false
	for _, o := range b.replicas {
		if o != r && o.usable() {
			others = true
			break
		}
	}
	if !others || !r.aside.CompareAndSwap(false, true) {
		return r.aside.Load()
	}
	r.setAsides.Add(1)
	b.log.Debug("UMBP master replica set aside; probing it", "replica", r.addr, "why", why)
	b.update()
	b.poke()
	return true
}

// probe asks every replica set aside, every probeInterval, whether it
// answers again (a call of no keys, bounded by probeTimeout); one that
// does is used again.
func (b *masterBackend) probe(ctx context.Context) {
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-b.kick:
		}
		var wg sync.WaitGroup
		for _, r := range b.replicas {
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
					b.log.Debug("UMBP master replica answers again", "replica", r.addr)
					b.update()
				}
			})
		}
		wg.Wait()
	}
}

// pick is pickReplica over b's replicas.
func (b *masterBackend) pick(tried []bool) *replica {
	return pickReplica(b.replicas, int(b.last.Load()), tried)
}

// unanswered marks suspect the replicas a call asked (tried) that had not
// answered (answered) when its context ended and, when it ended at the
// handle's LookupTimeout (its cause errNoReply) rather than by the
// caller's own context, has the store checked through one of them.
func (b *masterBackend) unanswered(ctx context.Context, tried, answered []bool) {
	now := time.Now().UnixNano()
	timedOut := errors.Is(context.Cause(ctx), errNoReply)
	for i, r := range b.replicas {
		if tried[i] && !answered[i] {
			r.suspect.Store(now)
			if timedOut {
				b.store.suspect(r)
			}
		}
	}
}

// ask runs fn on one usable replica, bounded by Timeout; a second one when
// the first has not answered within the hedge delay (and the budget
// allows); another at once when one fails. The first good answer wins and
// the replicas still asking are cancelled and, overtaken, set aside. When
// every replica asked failed, the call fails with their errors; when they
// all said their store is unavailable, with errStoreUnavailable.
//
// start, on the caller's goroutine, makes what runs the call on one
// replica (it may take what the call sends, such as a share of encoded
// bytes); what it makes runs on a goroutine of its own, but the first
// attempt, when inline, on the caller's: a hedge is then launched by a
// timer, and one that answers first ends the caller's attempt.
func ask[T any](ctx context.Context, b *masterBackend, inline bool, kind askKind, start func(*replica) func(context.Context) (T, error)) (T, error) {
	var zero T
	type answer struct {
		r     *replica
		v     T
		err   error
		taken time.Duration
	}
	if kind != askProbe && b.store.out.Load() {
		return zero, errStoreNotAsked // Ping still asks
	}
	b.budget.deposit()
	delay := b.hedgeAfter(kind)
	hedging := delay > 0 && len(b.replicas) > 1
	// first is the caller's attempt, made before anything below when
	// nothing can hedge it (one replica, or hedges off): it runs bare, and
	// what follows serves only its failure.
	var first *answer
	if inline && !hedging {
		r := b.take(nil, false)
		if r == nil {
			return zero, errReconnecting
		}
		v, taken, err := attempt(ctx, b, r, start(r))
		if err == nil {
			b.answered(r, kind, taken)
			return v, nil
		}
		first = &answer{r, v, err, taken}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make(chan answer, len(b.replicas))
	tried := make([]bool, len(b.replicas))    // asked
	answered := make([]bool, len(b.replicas)) // asked, and answered or failed
	// won, when not nil, ends the caller's own attempt: another answered.
	var won context.CancelFunc
	launch := func(hedge bool) bool {
		r := b.take(tried, hedge)
		if r == nil {
			return false
		}
		run := start(r)
		go func() {
			v, taken, err := attempt(ctx, b, r, run)
			if err == nil && won != nil {
				won()
			}
			answers <- answer{r, v, err, taken}
		}()
		return true
	}
	pending := 0
	var hedge <-chan time.Time
	switch {
	case first != nil:
		tried[first.r.idx] = true
		pending = 1
		answers <- *first
	case inline:
		r := b.take(tried, false)
		if r == nil {
			return zero, errReconnecting
		}
		run := start(r)
		own, cancelOwn := context.WithCancel(ctx)
		won = cancelOwn
		// While the caller asks, a timer may hedge: it launches under mu,
		// and launches nothing once the caller's attempt has returned.
		var mu sync.Mutex
		done, hedged := false, 0
		var t *time.Timer
		if hedging {
			t = time.AfterFunc(delay, func() {
				mu.Lock()
				defer mu.Unlock()
				if !done && b.budget.take() && launch(true) {
					hedged++
				}
			})
		}
		v, taken, err := attempt(own, b, r, run)
		a := answer{r, v, err, taken}
		mu.Lock()
		done = true
		pending = hedged + 1
		mu.Unlock()
		if t != nil {
			t.Stop()
		}
		cancelOwn()
		answers <- a
	default:
		if !launch(false) {
			return zero, errReconnecting
		}
		pending = 1
		if hedging {
			t := time.NewTimer(delay)
			defer t.Stop()
			hedge = t.C
		}
	}

	var errs []error
	stores := 0
	for {
		select {
		case a := <-answers:
			pending--
			if a.err != nil && ctx.Err() != nil {
				// The caller's own attempt, ended with ctx.
				b.unanswered(ctx, tried, answered)
				return zero, ctx.Err()
			}
			answered[a.r.idx] = true
			if a.err == nil {
				b.answered(a.r, kind, a.taken)
				for i, r := range b.replicas {
					if tried[i] && !answered[i] && r.overtaken.Add(1) >= overtakenLimit {
						// Still asking, call after call, when another
						// answered: stalled (or far slower than the
						// rest). Its attempt is cancelled.
						b.setAside(r, "overtaken by "+a.r.addr)
					}
				}
				return a.v, nil
			}
			if won != nil && errors.Is(a.err, context.Canceled) && ctx.Err() == nil {
				// The caller's own attempt, ended by a hedge that
				// answered: that answer is on its way.
				continue
			}
			errs = append(errs, fmt.Errorf("%s: %w", a.r.addr, a.err))
			switch {
			case isStoreFault(a.err):
				stores++ // the store is every replica's: asking another helps nothing
			case errors.Is(a.err, ErrUnavailable) && ctx.Err() == nil:
				// The replica refused or went away under the call: ask
				// another at once.
				b.setAside(a.r, a.err.Error())
				if launch(false) {
					pending++
				}
			}
			if pending == 0 {
				if stores == len(errs) {
					b.store.down(a.err)
					return zero, fmt.Errorf("%w: %w", errStoreUnavailable, errors.Join(errs...))
				}
				if len(errs) == 1 {
					return zero, a.err
				}
				return zero, errors.Join(errs...)
			}
		case <-hedge:
			hedge = nil
			if b.budget.take() && launch(true) {
				pending++
			}
		case <-ctx.Done():
			b.unanswered(ctx, tried, answered)
			return zero, ctx.Err()
		}
	}
}

// take picks the next replica to ask (pick), marks it in tried when tried
// is not nil, and counts the attempt.
func (b *masterBackend) take(tried []bool, hedge bool) *replica {
	r := b.pick(tried)
	if r == nil {
		return nil
	}
	if tried != nil {
		tried[r.idx] = true
	}
	r.inflight.Add(1)
	r.calls.Add(1)
	if hedge {
		r.hedges.Add(1)
	}
	return r
}

// attempt runs one attempt taken on r and returns what it answered and how
// long it took. Its bound is its caller's: every call to the replicas ends
// when its caller stops waiting, at LookupTimeout at the latest (a
// lock-step call by its timer, a detached one by its end; probes and the
// store's check have bounds of their own). So the RPC carries no deadline,
// which would travel to the master as grpc-timeout and cost a timer on
// both sides, and the attempt keeps no timer of its own, unless Timeout is
// the shorter bound.
func attempt[T any](ctx context.Context, b *masterBackend, r *replica, run func(context.Context) (T, error)) (T, time.Duration, error) {
	began := time.Now()
	if b.rpcTimeout < b.lookupTimeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.rpcTimeout)
		defer cancel()
	}
	v, err := run(ctx)
	r.inflight.Add(-1)
	return v, time.Since(began), err
}

// answered counts an answer r gave to a call of kind in taken.
func (b *masterBackend) answered(r *replica, kind askKind, taken time.Duration) {
	r.wins.Add(1)
	r.alive()
	r.observe(taken)
	b.last.Store(int32(r.idx))
	if kind != askProbe {
		b.observe(kind, taken)
	}
	r.overtaken.Store(0)
}

// askKind is what a call asks: each kind has its own hedge delay.
type askKind int

const (
	askLookup askKind = iota // BatchLookup
	askMatch                 // MatchExternalKv, for Score
	askProbe                 // a lookup of no key, whose time is not the lookups'
	numAskKinds
)

// hedgeAfter is how long an attempt of kind may go unanswered before
// another replica is asked too: HedgeDelay, or hedgeLatencyFactor times
// what such a call takes when that is longer (Score's MatchExternalKv of
// thousands of hashes takes tens of milliseconds on a master whose store
// is Redis); negative: never.
func (b *masterBackend) hedgeAfter(kind askKind) time.Duration {
	d := b.hedgeDelay
	if d <= 0 {
		return d
	}
	if l := b.lat[kind].Load(); l > 0 {
		d = max(d, time.Duration(hedgeLatencyFactor*float64(l)))
	}
	return d
}

// observe folds an answer's time into kind's moving average (weight 1/8);
// an answer far slower than the average (a replica that was stopped)
// counts as four times the average, so that one does not turn hedging off.
func (b *masterBackend) observe(kind askKind, d time.Duration) {
	l := &b.lat[kind]
	cur := l.Load()
	if cur == 0 {
		l.Store(int64(d))
		return
	}
	v := min(int64(d), 4*cur)
	l.Store(cur + (v-cur)/8)
}

// --- lookupBackend ----------------------------------------------------------

func (b *masterBackend) session() (lookupSource, error) {
	switch b.st.get() {
	case StateClosed:
		return nil, ErrClosed
	case StateReconnecting:
		return nil, errReconnecting
	}
	return b, nil
}

func (b *masterBackend) states() *connState { return &b.st }

func (b *masterBackend) capabilities() ServerCapabilities {
	return ServerCapabilities{Ready: b.st.get() == StateConnected, Mode: MasterMode}
}

func (b *masterBackend) encode(keys []string) (encoded.Keys, error) {
	return masterconn.EncodeKeys(keys)
}

// close: closing a gRPC channel cancels the calls on it, a stuck one
// included.
func (b *masterBackend) close(_ <-chan struct{}, timeout time.Duration) error {
	b.st.close()
	b.stop()
	b.wg.Wait()
	done := make(chan struct{})
	go func() {
		b.closeChannels()
		close(done)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-done:
		return nil
	case <-timer.C:
		return errLeftOpen(fmt.Sprintf("closing it did not return in %v", timeout))
	}
}

// replicaStats are the per-replica counters of Stats.
func (b *masterBackend) replicaStats() []ReplicaStats {
	out := make([]ReplicaStats, len(b.replicas))
	for i, r := range b.replicas {
		st := StateReconnecting
		if b.st.get() == StateClosed {
			st = StateClosed
		} else if r.usable() {
			st = StateConnected
		}
		out[i] = ReplicaStats{
			Addr: r.addr, State: st, SetAside: r.aside.Load(),
			Calls: r.calls.Load(), Hedges: r.hedges.Load(), Answers: r.wins.Load(), SetAsides: r.setAsides.Load(),
			Latency: time.Duration(r.latency.Load()),
		}
	}
	return out
}

// --- lookupSource -------------------------------------------------------------

func (b *masterBackend) exists(ctx context.Context, keys encoded.Keys) ([]bool, error) {
	defer keys.Free() // each attempt sends (and frees) a share of its own
	return ask(ctx, b, b.inline(), askLookup, func(r *replica) func(context.Context) ([]bool, error) {
		mine := keys.Share()
		return func(ctx context.Context) ([]bool, error) { return r.c.BatchLookupEncoded(ctx, mine) }
	})
}

// prefix is the master's BatchLookup, counted up to the first miss: it has
// no consecutive-exists call.
func (b *masterBackend) prefix(ctx context.Context, keys encoded.Keys) (int, error) {
	found, err := b.exists(ctx, keys)
	if err != nil {
		return 0, err
	}
	for i, f := range found {
		if !f {
			return i, nil
		}
	}
	return len(found), nil
}

func (b *masterBackend) match(ctx context.Context, hashes []string) ([]masterconn.NodeMatch, error) {
	return ask(ctx, b, false, askMatch, func(r *replica) func(context.Context) ([]masterconn.NodeMatch, error) {
		return func(ctx context.Context) ([]masterconn.NodeMatch, error) { return r.c.MatchExternalKv(ctx, hashes) }
	})
}

// inline: BatchLookup is lock-step on every replica's connection.
func (b *masterBackend) inline() bool { return b.lockStep }

func (b *masterBackend) probesReplicas() bool { return true }

// othersAnswer: a replica is healthy (no call to it has ended unanswered
// since it last answered) and answered within d.
func (b *masterBackend) othersAnswer(d time.Duration) bool {
	since := time.Now().Add(-d).UnixNano()
	for _, r := range b.replicas {
		if r.healthy() && r.answeredAt.Load() > since {
			return true
		}
	}
	return false
}

// askAgain asks every usable replica at once for a lookup of no key, after
// a call overran: the first to answer (or to say its store is down: it is
// alive) ends it, and of the others those still silent attachGrace later
// are set aside, stalled. When the call held later calls off (no other
// replica had answered meanwhile), they answer misses at once until one
// answers here.
func (b *masterBackend) askAgain(ctx context.Context, _ bool) error {
	var asked []*replica
	for _, r := range b.replicas {
		if r.usable() {
			asked = append(asked, r)
		}
	}
	if len(asked) == 0 {
		return errReconnecting
	}
	pctx, cancel := context.WithCancel(ctx)
	results := make(chan probeResult, len(asked))
	for _, r := range asked {
		go func() { results <- probeResult{r, r.c.ProbeLookup(pctx)} }()
	}
	var errs []error
	for left := len(asked); left > 0; left-- {
		var x probeResult
		select {
		case x = <-results:
		case <-ctx.Done():
			cancel()
			return ctx.Err()
		}
		if x.err != nil && !isStoreFault(x.err) {
			asked = slices.DeleteFunc(asked, func(r *replica) bool { return r == x.r })
			errs = append(errs, fmt.Errorf("%s: %w", x.r.addr, x.err))
			if errors.Is(x.err, ErrUnavailable) {
				b.setAside(x.r, x.err.Error())
			}
			continue
		}
		x.r.alive()
		if x.err != nil {
			b.store.down(x.err)
		} else {
			b.last.Store(int32(x.r.idx))
		}
		asked = slices.DeleteFunc(asked, func(r *replica) bool { return r == x.r })
		if left > 1 {
			// The others' probes are not waited for.
			go b.setAsideSilent(asked, results, left-1, cancel)
		} else {
			cancel()
		}
		return nil
	}
	cancel()
	return errors.Join(errs...)
}

// probeResult is one replica's answer to askAgain's probe.
type probeResult struct {
	r   *replica
	err error
}

// setAsideSilent sets aside those of asked whose probe, still out on
// results (n of them), has not answered within attachGrace; then it ends
// them.
func (b *masterBackend) setAsideSilent(asked []*replica, results <-chan probeResult, n int, cancel context.CancelFunc) {
	defer cancel()
	silent := map[*replica]bool{}
	for _, r := range asked {
		silent[r] = true
	}
	grace := time.NewTimer(attachGrace)
	defer grace.Stop()
wait:
	for ; n > 0; n-- {
		select {
		case x := <-results:
			delete(silent, x.r)
			if x.err == nil || isStoreFault(x.err) {
				x.r.alive()
			}
		case <-grace.C:
			break wait
		}
	}
	for _, r := range asked {
		if silent[r] && n > 0 {
			b.setAside(r, fmt.Sprintf("silent %v after another answered", attachGrace))
		}
	}
}

// clear is refused: a distributed pool is cleared by its nodes, as in vLLM.
func (b *masterBackend) clear(context.Context) (bool, error) {
	return false, fmt.Errorf("%w: a distributed pool is cleared by its nodes, not through the master", ErrNotSupported)
}

func (b *masterBackend) ping(ctx context.Context) (ServerCapabilities, error) {
	_, err := ask(ctx, b, false, askProbe, func(r *replica) func(context.Context) (struct{}, error) {
		return func(ctx context.Context) (struct{}, error) { return struct{}{}, r.c.Probe(ctx, false) }
	})
	if err != nil {
		return ServerCapabilities{}, err
	}
	return ServerCapabilities{Ready: true, Mode: MasterMode}, nil
}

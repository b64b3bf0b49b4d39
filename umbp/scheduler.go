package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/daemonpool"
	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/rpc"
)

var (
	// errUnanswered refuses a call while an earlier one that overran its
	// deadline has not returned: the server is stalled, asking again would
	// only queue behind it.
	errUnanswered = errors.New("an earlier call to the server has not returned")
)

// SchedulerHandle answers a scheduler's questions about which KV blocks the
// shared pool holds. It never holds its caller up: every call runs on a
// detached goroutine, and a call that fails or gets no reply within
// LookupTimeout answers as a miss. Until a call that overran returns, later
// calls answer misses at once without touching the server. If the server
// goes away, the handle attaches to its successor on its own; meanwhile
// lookups answer misses at once.
//
// A SchedulerHandle is safe for concurrent use.
type SchedulerHandle struct {
	backend schedBackend // a standalone server, or the master
	address string
	log     *slog.Logger
	timeout time.Duration // per call, from LookupTimeout
	// The RPC itself carries no deadline: a deadline costs a timer on both
	// sides of every call (measured: about a third of a 1024-key lookup),
	// and a call that overran is waited out rather than repeated anyway.
	closeTimeout time.Duration
	what         string // "UMBP standalone" or "UMBP master", for logs
	failures     logLimiter
	stats        lookupCounters
	quarantine   *quarantine // nil: off

	mu sync.Mutex
	// calls runs the calls to the current connection; a new connection
	// gets a new pool, so that no call queues behind one stuck on the old.
	calls      *daemonpool.Pool
	unanswered <-chan struct{} // the Done channel of a call that overran
	closed     bool
}

// NewSchedulerHandle attaches a scheduler handle to the server, waiting at
// most StartupTimeout (or until ctx ends) for it to answer. The namespace,
// topology and layout are validated but do not affect lookups: keys are
// looked up exactly as given. layout may be nil.
func (r *StandaloneRuntime) NewSchedulerHandle(ctx context.Context, namespace string, topo RankTopology, layout *KVLayoutDescriptor) (*SchedulerHandle, error) {
	if err := checkHandleArgs(namespace, topo, layout); err != nil {
		return nil, err
	}
	pool, err := newLookupPool()
	if err != nil {
		return nil, err
	}
	h := &SchedulerHandle{
		address:      r.cfg.Endpoint,
		what:         "UMBP standalone",
		log:          r.cfg.Logger,
		timeout:      r.cfg.LookupTimeout,
		closeTimeout: r.cfg.Timeout,
		calls:        pool,
		quarantine:   newQuarantine(r.cfg.LoadFailureQuarantine),
	}
	l, err := newLink(ctx, r.cfg, nil, h.replaced)
	if err != nil {
		pool.Shutdown()
		return nil, r.attachError(err)
	}
	h.backend = standaloneBackend{l}
	return h, nil
}

// replaced runs when the link attached to a new server: calls go to a new
// pool, and the old connection closes at once. A lookup names no client
// memory, and closing cancels a call stuck on the old server, so the old
// pool's goroutine is freed too.
func (h *SchedulerHandle) replaced(old *conn.Conn) {
	h.mu.Lock()
	oldPool := h.calls
	swapped := false
	if !h.closed {
		if pool, err := newLookupPool(); err == nil {
			h.calls, h.unanswered = pool, nil
			swapped = true
		}
	}
	h.mu.Unlock()
	if swapped {
		oldPool.Shutdown()
	} // else Close shuts it down
	_ = old.Close()
}

// newLookupPool is the one detached goroutine that a scheduler handle's
// calls to one connection run on.
func newLookupPool() (*daemonpool.Pool, error) {
	return daemonpool.New(1, "umbp-standalone-lookup", nil)
}

// call runs fn on h's detached goroutine and waits for it at most
// LookupTimeout or until ctx ends.
func call[T any](ctx context.Context, h *SchedulerHandle, method string, fn func(context.Context, lookupSource) (T, error)) (T, error) {
	var zero T
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return zero, ErrClosed
	}
	// Read under h.mu: a replaced connection swaps the pool under h.mu
	// after swapping the connection, so a call never runs on a new pool
	// against an old connection.
	c, err := h.backend.session()
	if err != nil {
		h.mu.Unlock()
		return zero, err
	}
	if h.unanswered != nil {
		select {
		case <-h.unanswered:
			h.unanswered = nil
		default:
			h.mu.Unlock()
			return zero, errUnanswered
		}
	}
	pool := h.calls
	f, err := daemonpool.Submit(pool, func() (T, error) {
		v, err := fn(context.Background(), c)
		h.backend.failed(err)
		return v, err
	})
	h.mu.Unlock()
	if err != nil {
		return zero, err
	}
	timer := time.NewTimer(h.timeout)
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
	if !f.Cancel() { // a call that never started holds nothing up
		h.mu.Lock()
		// A call on a pool replaced meanwhile holds up nothing: its
		// connection is closed.
		if h.calls == pool && (h.unanswered == nil || isDone(h.unanswered)) {
			h.unanswered = f.Done()
		}
		h.mu.Unlock()
	}
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("%s: %w", h.backend.rpcName(method), err)
	}
	h.stats.timeouts.Add(1)
	return zero, fmt.Errorf("%s got no reply within %v: %w", h.backend.rpcName(method), h.timeout, context.DeadlineExceeded)
}

// State reports whether the handle is connected, reconnecting or closed.
func (h *SchedulerHandle) State() HandleState { return h.backend.states().get() }

// WaitForStateChange waits until the handle's state differs from from, as
// grpc.ClientConn.WaitForStateChange does: it returns true once State()
// is not from, and false if ctx ends first. A server restart moves a handle
// from StateConnected to StateReconnecting and, once it has attached to the
// new server, back to StateConnected; Close moves it to StateClosed, which
// is final.
//
//	for s := h.State(); s != umbp.StateClosed; s = h.State() {
//		if !h.WaitForStateChange(ctx, s) {
//			break // ctx ended
//		}
//		log.Info("UMBP pool", "state", h.State())
//	}
func (h *SchedulerHandle) WaitForStateChange(ctx context.Context, from HandleState) bool {
	return h.backend.states().waitForChange(ctx, from)
}

// Stats returns a snapshot of the handle's health and counters.
func (h *SchedulerHandle) Stats() Stats {
	return Stats{State: h.State(), Capabilities: h.backend.capabilities(), Reconnects: h.backend.states().reconnects.Load(), Lookups: h.stats.snapshot()}
}

// Lookup reports, for each key, whether the pool holds it. It returns one
// bool per key, in order; any failure, a reply of the wrong length or no
// reply within LookupTimeout answers all misses. Empty keys answer an empty
// result without calling the server.
func (h *SchedulerHandle) Lookup(ctx context.Context, keys []string) []bool {
	if len(keys) == 0 {
		return []bool{}
	}
	// The call may outlive this one (LookupTimeout), and the caller may
	// reuse its keys once Lookup returns: the request is encoded here, and
	// the call sends the encoded bytes. A key the server cannot be asked
	// about (empty, not UTF-8) is a miss, and the others are still looked
	// up: the encoder, which checks every key anyway, refuses the batch, and
	// it is encoded again without them.
	var at []int // where the keys asked about are in keys, when not all are
	q, err := h.backend.encode(keys)
	if err != nil {
		var ask []string
		if ask, at = validKeys(keys); len(ask) == 0 {
			return h.misses(len(keys))
		}
		q, err = h.backend.encode(ask)
	}
	h.stats.lookups.Add(1)
	var out []bool
	if n := len(keys); err == nil {
		out, err = call(ctx, h, "BatchExists", func(ctx context.Context, c lookupSource) ([]bool, error) {
			hits, err := c.exists(ctx, q)
			if err != nil {
				return nil, err
			}
			if len(hits) != q.N {
				return nil, fmt.Errorf("%d results for %d keys", len(hits), q.N)
			}
			if at == nil {
				return hits, nil
			}
			out := make([]bool, n)
			for j, i := range at {
				out[i] = hits[j]
			}
			return out, nil
		})
	}
	if err != nil {
		h.logFailure("lookup", err)
		return h.misses(len(keys))
	}
	h.quarantine.mask(keys, out)
	n := uint64(0)
	for _, hit := range out {
		if hit {
			n++
		}
	}
	h.stats.hits.Add(n)
	h.stats.misses.Add(uint64(len(out)) - n)
	return out
}

// misses answers n keys as absent, and counts them.
func (h *SchedulerHandle) misses(n int) []bool {
	h.stats.misses.Add(uint64(n))
	return make([]bool, n)
}

// lookupKeyOK reports whether key can be sent in a lookup.
func lookupKeyOK(key string) bool { return key != "" && utf8.ValidString(key) }

// validKeys returns the keys that can be sent and their indexes.
func validKeys(keys []string) ([]string, []int) {
	var ask []string
	var at []int
	for i, k := range keys {
		if lookupKeyOK(k) {
			ask = append(ask, k)
			at = append(at, i)
		}
	}
	return ask, at
}

// LookupPrefix returns how many leading keys the pool holds, under the same
// rules as Lookup: any failure answers 0.
func (h *SchedulerHandle) LookupPrefix(ctx context.Context, keys []string) int {
	// A key that cannot exist ends the prefix: an empty one here, one that
	// is not UTF-8 once the request could not be encoded (as in Lookup).
	if i := slices.Index(keys, ""); i >= 0 {
		keys = keys[:i]
	}
	keys = keys[:h.quarantine.first(keys)] // so does one in quarantine
	if len(keys) == 0 {
		return 0
	}
	h.stats.lookups.Add(1)
	q, err := h.backend.encode(keys) // as in Lookup: the call may outlive this one
	if err != nil {
		// The count stops at the first key that is not UTF-8.
		i := slices.IndexFunc(keys, func(k string) bool { return !utf8.ValidString(k) })
		if i <= 0 {
			h.stats.misses.Add(uint64(len(keys)))
			return 0
		}
		q, err = h.backend.encode(keys[:i])
	}
	var n int
	if err == nil {
		n, err = call(ctx, h, "BatchExistsConsecutive", func(ctx context.Context, c lookupSource) (int, error) {
			return c.prefix(ctx, q)
		})
	}
	if err != nil {
		h.logFailure("prefix lookup", err)
		h.stats.misses.Add(uint64(len(keys)))
		return 0
	}
	if n < 0 || n > len(keys) {
		h.logFailure("prefix lookup", fmt.Errorf("count %d for %d keys", n, len(keys)))
		h.stats.misses.Add(uint64(len(keys)))
		return 0
	}
	h.stats.hits.Add(uint64(n))
	h.stats.misses.Add(uint64(len(keys) - n))
	return n
}

// Clear removes every object from the pool — the KV of every engine attached
// to the server, not only this one's. It returns nil once the server has
// done so; otherwise an error that says why: refused (ErrRefused),
// unreachable (ErrUnavailable), or no reply within LookupTimeout
// (context.DeadlineExceeded).
func (h *SchedulerHandle) Clear(ctx context.Context) error {
	if err := h.backend.clearRefusal(); err != nil {
		return fmt.Errorf("umbp: clear the pool at %s: %w", h.address, err)
	}
	cleared, err := call(ctx, h, "Clear", func(ctx context.Context, c lookupSource) (bool, error) {
		return c.clear(ctx)
	})
	if err == nil && !cleared {
		err = fmt.Errorf("%w: the server answered that it did not clear its pool", ErrRefused)
	}
	if err != nil {
		h.logFailure("clear", err)
		return fmt.Errorf("umbp: clear the pool at %s: %w", h.address, err)
	}
	h.log.Info("cleared the UMBP standalone pool; this removes KV for every engine attached to it", "endpoint", h.address)
	return nil
}

// Ping asks the server what it offers, bounded by LookupTimeout like every
// scheduler call; the answer also refreshes what [SchedulerHandle.Stats]
// reports. Its error says why the server did not answer.
func (h *SchedulerHandle) Ping(ctx context.Context) (ServerCapabilities, error) {
	caps, err := call(ctx, h, "Ping", func(ctx context.Context, c lookupSource) (ServerCapabilities, error) {
		return c.ping(ctx)
	})
	if err != nil {
		return ServerCapabilities{}, fmt.Errorf("umbp: ping %s: %w", h.address, err)
	}
	return caps, nil
}

// Close releases the handle. It never blocks longer than Timeout. If a call
// to the server never returned, the connection is left open until it does
// (the server may still be working on it) and Close says so; calls after
// Close answer misses.
func (h *SchedulerHandle) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.mu.Unlock()
	h.backend.shutdown()
	h.mu.Lock()
	calls := h.calls
	unanswered := h.unanswered != nil && !isDone(h.unanswered)
	h.mu.Unlock()
	calls.Shutdown()
	closeConn := h.backend.closer()
	if unanswered && h.backend.waitsOutCalls() {
		// Close the connection once the call returns; closing it now would
		// wait for that call.
		go func() {
			<-calls.Terminated()
			_ = closeConn()
		}()
		return h.leaveOpen("a call to the server never returned")
	}
	done := make(chan error, 1)
	go func() { done <- closeConn() }()
	timer := time.NewTimer(h.closeTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			h.log.Warn(h.what+" scheduler client close failed", "endpoint", h.address, "err", err)
		}
		return nil
	case <-timer.C:
		return h.leaveOpen(fmt.Sprintf("close did not return in %v", h.closeTimeout))
	}
}

func (h *SchedulerHandle) leaveOpen(reason string) error {
	h.log.Warn(h.what+" scheduler client left open at shutdown", "endpoint", h.address, "reason", reason)
	return fmt.Errorf("umbp: scheduler connection to %s left open: %s", h.address, reason)
}

func (h *SchedulerHandle) logFailure(op string, err error) {
	if !errors.Is(err, context.DeadlineExceeded) {
		h.stats.failures.Add(1)
	}
	if errors.Is(err, ErrClosed) || errors.Is(err, conn.ErrClosed) || !h.failures.allow() {
		return
	}
	h.log.Warn(h.what+" call failed; treating as a miss", "op", op, "endpoint", h.address, "err", err)
}

func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// schedBackend is what a scheduler handle is attached to: a standalone
// server through the link, or MORI's master through a gRPC channel. The
// handle's own machinery (the detached call, the timeout, fail-fast while
// a call is stuck, the counters) is the same for both.
type schedBackend interface {
	// encode encodes a lookup's keys (none empty) for this backend, on
	// the caller's goroutine: a key that is not UTF-8 is an error.
	encode(keys []string) (encoded.Keys, error)
	// session returns what a call asks now, or the error to answer at
	// once (reconnecting, closed).
	session() (lookupSource, error)
	// failed sees every call's error.
	failed(err error)
	// states is the handle's state, which the backend moves.
	states() *connState
	capabilities() ServerCapabilities
	// rpcName is what the call a scheduler method names (the standalone
	// protocol's) is called here, for errors.
	rpcName(method string) string
	// clearRefusal is non-nil where Clear is refused without asking.
	clearRefusal() error
	// shutdown stops reconnecting and moves the state to closed.
	shutdown()
	// closer returns what closes the connection; waitsOutCalls reports
	// whether closing it waits for a call in flight (so that Close must
	// leave it to the call's end).
	closer() func() error
	waitsOutCalls() bool
}

// lookupSource is one connection's answers to what a scheduler asks.
type lookupSource interface {
	// exists and prefix send keys their backend's encode encoded; they
	// free what they do not send.
	exists(ctx context.Context, keys encoded.Keys) ([]bool, error)
	prefix(ctx context.Context, keys encoded.Keys) (int, error)
	// match asks the external KV index which nodes hold hashes.
	match(ctx context.Context, hashes []string) ([]masterconn.NodeMatch, error)
	clear(ctx context.Context) (bool, error)
	ping(ctx context.Context) (ServerCapabilities, error)
}

// standaloneBackend is a scheduler handle's link to a standalone server.
type standaloneBackend struct{ l *link }

func (b standaloneBackend) session() (lookupSource, error) {
	c, err := b.l.current()
	if err != nil {
		return nil, err
	}
	return standaloneSource{c}, nil
}

func (b standaloneBackend) encode(keys []string) (encoded.Keys, error) { return conn.EncodeKeys(keys) }
func (b standaloneBackend) failed(err error)                           { b.l.failed(err) }
func (b standaloneBackend) states() *connState                         { return &b.l.st }
func (b standaloneBackend) capabilities() ServerCapabilities           { return b.l.capabilities() }
func (b standaloneBackend) clearRefusal() error                        { return nil }
func (b standaloneBackend) rpcName(method string) string               { return method }
func (b standaloneBackend) shutdown()                                  { b.l.shutdown() }
func (b standaloneBackend) closer() func() error                       { return b.l.conn().Close }
func (b standaloneBackend) waitsOutCalls() bool                        { return true }

// standaloneSource asks one connection to a standalone server.
type standaloneSource struct{ c *conn.Conn }

func (s standaloneSource) exists(ctx context.Context, keys encoded.Keys) ([]bool, error) {
	hits, errs := s.c.BatchExistsEncoded(ctx, keys)
	return hits, conn.Joined(errs)
}

func (s standaloneSource) prefix(ctx context.Context, keys encoded.Keys) (int, error) {
	return s.c.BatchExistsConsecutiveEncoded(ctx, keys)
}

func (s standaloneSource) match(ctx context.Context, hashes []string) ([]masterconn.NodeMatch, error) {
	matches, err := s.c.MatchExternalKvOnce(ctx, hashes)
	if err != nil {
		return nil, err
	}
	return masterconn.CheckMatch(hashes, matches, rpc.MaxNodes)
}

func (s standaloneSource) clear(ctx context.Context) (bool, error) { return s.c.Clear(ctx) }

func (s standaloneSource) ping(ctx context.Context) (ServerCapabilities, error) {
	caps, err := s.c.Ping(ctx)
	return capabilitiesOf(caps), err
}

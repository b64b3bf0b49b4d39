package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/loglimit"
	"github.com/umbp-go/umbp-go/internal/replicaset"
)

// SchedulerHandle answers a scheduler's questions about which KV blocks the
// shared pool holds, and a router's about where a prompt lives. It never
// holds its caller up: a call that fails or gets no reply within
// LookupTimeout answers as a miss.
// A lookup runs on the caller's own goroutine (a lock-step call, its connection interrupted at
// LookupTimeout); Score, Clear and Ping, and lookups with
// Config.GRPCLookups, run on a detached goroutine that the caller waits for
// at most LookupTimeout. A call left unanswered leaves a probe of the
// server in flight, and until the server answers it later calls answer
// misses at once without asking (on the master's replicas, only while no
// other replica answers). If the server goes away, the handle attaches to
// its successor on its own; meanwhile lookups answer misses at once.
//
// A [StandaloneRuntime] yields handles on one node's server, a
// [ClusterRuntime] on MORI's master: the same calls, the same bounds.
//
// A SchedulerHandle is safe for concurrent use.
type SchedulerHandle struct {
	backend      lookupBackend // a standalone server, or the master
	calls        *caller
	address      string
	log          *slog.Logger
	closeTimeout time.Duration
	what         string // "UMBP standalone" or "UMBP master", for logs
	failures     loglimit.Limiter
	stats        lookupCounters
	quarantine   *quarantine // nil: off
}

// NewSchedulerHandle attaches a scheduler handle to the server, waiting at
// most StartupTimeout (or until ctx ends) for it to answer. Its lookups ask
// about keys exactly as given.
func (r *StandaloneRuntime) NewSchedulerHandle(ctx context.Context) (*SchedulerHandle, error) {
	h := &SchedulerHandle{
		address:      r.cfg.Endpoint,
		what:         "UMBP standalone",
		log:          r.cfg.Logger,
		closeTimeout: r.cfg.Timeout,
		quarantine:   newQuarantine(r.cfg.LoadFailureQuarantine),
	}
	l, err := newLink(ctx, r.cfg, nil, h.replaced)
	if err != nil {
		return nil, opError("attach", r.cfg.Endpoint, err)
	}
	b := standaloneBackend{l}
	if h.calls, err = newCaller(b, r.cfg.LookupTimeout); err != nil {
		_ = b.close(nil, r.cfg.Timeout)
		return nil, opError("attach", r.cfg.Endpoint, err)
	}
	h.backend = b
	return h, nil
}

// NewSchedulerHandle attaches a scheduler handle to the master, waiting at
// most StartupTimeout (or until ctx ends) for it to answer. Its lookups ask
// the master whether any node holds a key, on any tier; Clear is refused
// (a distributed pool is cleared by its nodes, not by a scheduler, as in
// vLLM).
func (r *ClusterRuntime) NewSchedulerHandle(ctx context.Context) (*SchedulerHandle, error) {
	addr := strings.Join(r.cfg.Masters, ",")
	pctx, cancel := context.WithTimeout(ctx, r.cfg.StartupTimeout)
	b, err := newMasterBackend(pctx, r.cfg)
	cancel()
	if err != nil {
		return nil, opError("attach", addr, err)
	}
	calls, err := newCaller(b, r.cfg.LookupTimeout)
	if err != nil {
		_ = b.close(nil, r.cfg.Timeout)
		return nil, opError("attach", addr, err)
	}
	return &SchedulerHandle{
		backend:      b,
		calls:        calls,
		address:      addr,
		what:         "UMBP master",
		log:          r.cfg.Logger,
		closeTimeout: r.cfg.Timeout,
		quarantine:   newQuarantine(r.cfg.LoadFailureQuarantine),
	}, nil
}

// replaced runs when the link attached to a new server: calls go to a new
// goroutine, and the old connection closes at once. A lookup names no
// client memory, and closing cancels a call stuck on the old server.
func (h *SchedulerHandle) replaced(old *conn.Conn) {
	h.calls.reset()
	_ = old.Close()
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
	st := h.backend.states()
	return Stats{State: st.get(), Capabilities: h.backend.capabilities(), Reconnects: st.reconnects.Load(), Lookups: h.stats.snapshot(), Replicas: h.backend.replicaStats()}
}

// Lookup reports, for each key, whether the pool holds it. It returns one
// bool per key, in order; a key it has no answer for (any failure, a reply
// of the wrong length, no reply within LookupTimeout, ctx ended) is a miss.
// A key that cannot be in the pool (empty, over MaxKeyBytes, not UTF-8) is
// a miss; the others are still asked about. No keys answer an empty result
// without calling the server. [SchedulerHandle.LookupAnswers] also says
// which keys were answered.
func (h *SchedulerHandle) Lookup(ctx context.Context, keys []string) []bool {
	return h.LookupAnswers(ctx, keys).Hits
}

// LookupResult is what one lookup learned: a hit or a miss per key, and how far
// it got an answer. A router tells "not in the pool" (a miss among the
// answered keys) from "not asked, or not answered" (a key from Answered on)
// by it, as Score's Complete does for a score.
type LookupResult struct {
	// Hits has one entry per key, in order: true where the pool holds it.
	Hits []bool
	// Answered is how many leading keys have an answer: each of them is in
	// the pool if and only if its Hits entry is true (a key that cannot be
	// in the pool, or is quarantined, is answered, a miss). The keys from
	// Answered on were not asked or not answered, and are misses.
	Answered int
	// Err says why the keys from Answered on have no answer, matched with
	// errors.Is: the caller's context ended (its error alone); no reply
	// within LookupTimeout, or calls held off after one got none
	// (ErrNoReply); LookupTimeout passed while the server was answering
	// the batch part by part (ErrBatchTooLarge); the handle is
	// reconnecting (ErrUnavailable) or closed
	// (ErrClosed); or the server refused or failed the call. Nil when
	// every key was answered.
	Err error
}

// Complete reports whether every key was answered.
func (a LookupResult) Complete() bool { return a.Err == nil && a.Answered == len(a.Hits) }

// LookupAnswers is Lookup, with how far the call got an answer. A large
// batch is asked in parts, in order, each encoded just before it is asked,
// all within one LookupTimeout from the call: a batch too large to ask
// within it is answered as far as it got, the rest misses.
func (h *SchedulerHandle) LookupAnswers(ctx context.Context, keys []string) LookupResult {
	b := h.calls.newBound()
	out := LookupResult{Hits: make([]bool, len(keys))}
	if len(keys) == 0 {
		return out
	}
	// The call may outlive this one (LookupTimeout), and the caller may
	// reuse its keys once Lookup returns: each part is encoded here, and
	// the call sends the encoded bytes. The encoder, which reads every key
	// anyway, leaves out the keys that cannot be asked about.
	h.stats.lookups.Add(1)
	out.Answered, out.Err = h.calls.exists(ctx, b, h.backend.encode, keys, out.Hits)
	if out.Err != nil && out.Answered > 0 {
		out.Err = fmt.Errorf("%d of %d keys answered: %w", out.Answered, len(keys), out.Err)
	}
	counted := uint64(len(keys)) // keys counted as hits or misses
	if out.Err != nil {
		if h.logFailure("lookup", out.Err) {
			counted = uint64(out.Answered)
		}
		out.Err = opError("lookup", h.address, out.Err)
	}
	h.quarantine.mask(keys[:out.Answered], out.Hits)
	n := uint64(0)
	for _, hit := range out.Hits[:out.Answered] {
		if hit {
			n++
		}
	}
	h.stats.hits.Add(n)
	h.stats.misses.Add(counted - n)
	return out
}

// askable returns the leading keys that can be asked about: a key that
// cannot (empty, over MaxKeyBytes, not UTF-8) or is quarantined ends them.
func (h *SchedulerHandle) askable(keys []string) []string {
	if i := slices.IndexFunc(keys, func(k string) bool { return !lookupKeyOK(k) }); i >= 0 {
		keys = keys[:i]
	}
	return keys[:h.quarantine.first(keys)]
}

// LookupPrefix returns how many leading keys the pool holds, under the same
// rules as Lookup: a batch too large to ask within LookupTimeout counts
// the keys answered by then, and any failure answers what the parts
// answered before it (0 for a batch of one part). A key that cannot be in
// the pool, or is quarantined, ends the prefix.
func (h *SchedulerHandle) LookupPrefix(ctx context.Context, keys []string) int {
	b := h.calls.newBound()
	if len(keys) == 0 || !lookupKeyOK(keys[0]) {
		return 0
	}
	h.stats.lookups.Add(1)
	n, err := h.calls.prefix(ctx, b, h.backend.encode, h.quarantine.first, keys)
	h.stats.hits.Add(uint64(n))
	if err == nil || !h.logFailure("prefix lookup", err) {
		h.stats.misses.Add(uint64(len(keys) - n))
	}
	return n
}

// LookupTokens answers a scheduler's question "how much of this prompt
// does the pool hold?": the number of leading tokens whose KV blocks a vLLM
// engine with the UMBP connector stored, for every rank and every group,
// counted in multiples of every group's block size. It asks once, for the
// count of consecutive existing keys of the prompt's keys
// ([TokenKeyer.Keys]); as every lookup, a failure, a stalled server or no
// reply within LookupTimeout answers 0.
//
// The count includes a block that ends at the prompt's last token. The
// connector's own decision to load never does, since the engine must
// compute at least that token: for a prompt of n tokens it loads what
// LookupTokens reports for the keys of the first n-1 tokens. And where the
// engine has several groups, the connector may load less than this count,
// as its coordinator decides per group kind.
func (h *SchedulerHandle) LookupTokens(ctx context.Context, prompt *TokenKeys) int {
	if prompt == nil || len(prompt.Keys) == 0 {
		return 0
	}
	return prompt.Tokens(h.LookupPrefix(ctx, prompt.Keys))
}

// Score ranks candidate nodes for one request: per candidate the longest
// run of the request's leading blocks it holds, by tier, weighed; and the
// pool-wide prefix. It asks twice, in one bounded call: MatchExternalKv
// (hits not counted) for the blocks and BatchLookup (a standalone server:
// BatchExistsConsecutive) for the pool's keys. Never RouteGet: that leases
// and counts. As every lookup, a failure, a bad answer or no reply within
// LookupTimeout scores nothing (Complete false); the error reports only a
// bad request. A block that cannot be asked about, or is quarantined, ends
// the prefixes it is in.
func (h *SchedulerHandle) Score(ctx context.Context, req ScoreRequest) (Scores, error) {
	b := h.calls.newBound()
	if err := req.check(); err != nil {
		return Scores{}, invalid(err)
	}
	// Each list ends at its first block that cannot be asked about, or is
	// quarantined: with none left to ask, nothing is.
	hashes, keys := req.blocks()
	hashes, keys = h.askable(hashes), h.askable(keys)
	out := req.empty()
	if len(hashes) == 0 && len(keys) == 0 {
		out.Complete = true
		req.rank(&out, nil, 0)
		return out, nil
	}
	// The call may outlive this one (LookupTimeout), and the caller may
	// reuse its slices once Score returns: it gets a copy of each, and
	// encodes the keys on its own goroutine, within its bound.
	h.stats.lookups.Add(1)
	q := scoreQuery{slices.Clone(hashes), slices.Clone(keys), h.backend.encode}
	a, err := call(ctx, h.calls, callOther, b, q.ask)
	if err != nil {
		h.logFailure("score", err)
		return out, nil
	}
	out.Complete = true
	for i, e := range a.errs {
		if e != nil {
			out.Complete = false
			h.logFailure([...]string{"score: match", "score: pool prefix"}[i], e)
		}
	}
	req.rank(&out, a.nodes, a.prefix)
	return out, nil
}

// QuarantineKeys makes keys whose load failed answer as misses, in every
// lookup and score of this handle, for the configured quarantine time
// (Config.LoadFailureQuarantine, ClusterConfig.LoadFailureQuarantine); a
// handle without one ignores them. Feed it the failed keys of load jobs
// ([TransferJob.FailedKeys]), as vLLM's scheduler quarantines the blocks
// its workers failed to load: the pool may still list a key it cannot
// serve (a node that died, an object evicted under the load).
func (h *SchedulerHandle) QuarantineKeys(keys []string) {
	if n := h.quarantine.add(keys); n > 0 && h.failures.Allow(failureLogInterval) {
		h.log.Warn(h.what+" quarantine is full; some failed keys were not quarantined", "endpoint", h.address, "keys", n)
	}
}

// Clear removes every object from the pool — the KV of every engine attached
// to the server, not only this one's. It returns nil once the server has
// done so; otherwise an error that says why: refused (ErrRefused),
// unreachable (ErrUnavailable), or no reply within LookupTimeout
// (context.DeadlineExceeded). A handle on the master is refused
// (ErrNotSupported): a distributed pool is cleared by its nodes.
func (h *SchedulerHandle) Clear(ctx context.Context) error {
	cleared, err := call(ctx, h.calls, callOther, h.calls.newBound(), lookupSource.clear)
	if err == nil && !cleared {
		err = fmt.Errorf("%w: the server answered that it did not clear its pool", ErrRefused)
	}
	if err != nil {
		if !errors.Is(err, ErrNotSupported) {
			h.logFailure("clear", err)
		}
		return opError("clear", h.address, err)
	}
	h.log.Info("cleared the UMBP standalone pool; this removes KV for every engine attached to it", "endpoint", h.address)
	return nil
}

// Ping asks the server what it offers, bounded by LookupTimeout like every
// scheduler call; the answer also refreshes what [SchedulerHandle.Stats]
// reports. Its error says why the server did not answer.
func (h *SchedulerHandle) Ping(ctx context.Context) (ServerCapabilities, error) {
	caps, err := call(ctx, h.calls, callOther, h.calls.newBound(), lookupSource.ping)
	return caps, opError("ping", h.address, err)
}

// Close releases the handle. It never blocks longer than Timeout. If a call
// to a standalone server never returned, the connection is left open until
// it does (the server may still be working on it) and Close says so; calls
// after Close answer misses.
func (h *SchedulerHandle) Close() error {
	stuck, first := h.calls.close()
	if !first {
		return nil
	}
	err := h.backend.close(stuck, h.closeTimeout)
	if err != nil {
		h.log.Warn(h.what+" scheduler handle's close did not complete", "endpoint", h.address, "err", err)
	}
	return opError("close", h.address, err)
}

// notAsked reports whether a call that failed with err answered without
// asking any server (Stats' Unasked).
func notAsked(err error) bool {
	return errors.Is(err, errUnanswered) || errors.Is(err, errReconnecting) || errors.Is(err, ErrClosed) || errors.Is(err, replicaset.ErrStoreNotAsked) || errors.Is(err, replicaset.ErrNoReplica)
}

// logFailure counts a call left without an answer in exactly one of
// Timeouts, Unasked, Cancelled and Failures, and warns of what an operator
// must act on: the server's doing, never a caller's. It reports whether
// the call's caller left it (Cancelled): the keys it left unanswered are
// then neither hits nor misses, for they say nothing of the pool.
func (h *SchedulerHandle) logFailure(op string, err error) (callerLeft bool) {
	switch {
	case notAsked(err): // held off matches ErrNoReply too: it was not asked
		h.stats.unasked.Add(1)
	case errors.Is(err, ErrNoReply) || errors.Is(err, ErrBatchTooLarge):
		h.stats.timeouts.Add(1)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		h.stats.cancelled.Add(1) // the caller's context: its business
		return true
	default:
		h.stats.failures.Add(1)
	}
	if errors.Is(err, ErrClosed) || !h.failures.Allow(failureLogInterval) {
		return
	}
	if errors.Is(err, replicaset.ErrStoreUnavailable) {
		return // the store's fault, which the backend says once
	}
	h.log.Warn(h.what+" call failed; treating as a miss", "op", op, "endpoint", h.address, "err", err)
	return false
}

package umbp

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/replicaset"
)

// masterBackend is a scheduler handle's channels to MORI's master: its
// replicas (one for a single master), as internal/replicaset keeps them.
// Which replica a call goes to, its hedges and failovers, and the store
// are the set's; how long a call may take, and what one left unanswered
// does to the calls after it, the handle's caller (lookupcall.go).
type masterBackend struct {
	set      *replicaset.Set
	masters  string // the replicas' addresses, for logs
	lockStep bool   // BatchLookup is lock-step (not ClusterConfig.GRPCLookups)
	log      *slog.Logger
	st       connState
}

// newMasterBackend opens the replica set, waiting at most until ctx ends
// for one replica at least to answer.
func newMasterBackend(ctx context.Context, cfg ClusterConfig) (*masterBackend, error) {
	b := &masterBackend{masters: strings.Join(cfg.Masters, ","), lockStep: !cfg.GRPCLookups, log: cfg.Logger}
	opts := replicaset.Options{
		Addresses: cfg.Masters,
		Conn: masterconn.Options{
			Creds:          cfg.TransportCredentials,
			AllowPlaintext: cfg.AllowPlaintext,
			MaxReplyBytes:  cfg.MaxReplyBytes,
			MaxNodes:       cfg.MaxNodes,
			StatsHandler:   cfg.StatsHandler,
			GRPCLookups:    cfg.GRPCLookups,
		},
		StoreTimeout: cfg.Timeout,
		HedgeDelay:   cfg.HedgeDelay,
		Log:          cfg.Logger,
		Changed:      b.update,
	}
	// Every call is ended at LookupTimeout by its caller; Timeout bounds
	// each attempt on its own only when it is the shorter.
	if cfg.Timeout < cfg.LookupTimeout {
		opts.AttemptTimeout = cfg.Timeout
	}
	set, err := replicaset.Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	b.set = set
	return b, nil
}

// update moves the handle's state: connected while one replica at least
// is usable (the set says when that may have changed).
func (b *masterBackend) update(usable bool) {
	next := StateReconnecting
	if usable {
		next = StateConnected
	}
	if prev := b.st.get(); prev != next && b.st.move(prev, next) {
		if next == StateConnected {
			b.log.Info("UMBP master is back; lookups go to it again", "masters", b.masters)
		} else {
			b.log.Warn("no UMBP master replica answers; lookups answer misses until one does", "masters", b.masters)
		}
	}
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
	return masterconn.EncodeAskable(keys)
}

// close: closing a gRPC channel cancels the calls on it, a stuck one
// included.
func (b *masterBackend) close(_ <-chan struct{}, timeout time.Duration) error {
	b.st.close()
	done := make(chan struct{})
	go func() {
		b.set.Close()
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
	closed := b.st.get() == StateClosed
	stats := b.set.Stats()
	out := make([]ReplicaStats, len(stats))
	for i, r := range stats {
		st := StateReconnecting
		if closed {
			st = StateClosed
		} else if r.Usable {
			st = StateConnected
		}
		out[i] = ReplicaStats{
			Addr: r.Addr, State: st, SetAside: r.Aside,
			Calls: r.Calls, Hedges: r.Hedges, Answers: r.Answers, SetAsides: r.SetAsides,
			Latency: r.Latency, Beats: r.Beats,
		}
	}
	return out
}

// --- lookupSource -------------------------------------------------------------

func (b *masterBackend) exists(ctx context.Context, keys encoded.Keys) ([]bool, error) {
	defer keys.Free() // each attempt sends (and frees) a share of its own
	return replicaset.Ask(ctx, b.set, replicaset.Lookup, func(c *masterconn.Conn) func(context.Context) ([]bool, error) {
		mine := keys.Share()
		return func(ctx context.Context) ([]bool, error) { return c.BatchLookupEncoded(ctx, mine) }
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
	return replicaset.Ask(ctx, b.set, replicaset.Match, func(c *masterconn.Conn) func(context.Context) ([]masterconn.NodeMatch, error) {
		return func(ctx context.Context) ([]masterconn.NodeMatch, error) { return c.MatchExternalKv(ctx, hashes) }
	})
}

// clear is refused: a distributed pool is cleared by its nodes, as in vLLM.
func (b *masterBackend) clear(context.Context) (bool, error) {
	return false, fmt.Errorf("%w: a distributed pool is cleared by its nodes, not through the master", ErrNotSupported)
}

func (b *masterBackend) ping(ctx context.Context) (ServerCapabilities, error) {
	_, err := replicaset.Ask(ctx, b.set, replicaset.Probe, func(c *masterconn.Conn) func(context.Context) (struct{}, error) {
		return func(ctx context.Context) (struct{}, error) { return struct{}{}, c.Probe(ctx, false) }
	})
	if err != nil {
		return ServerCapabilities{}, err
	}
	return ServerCapabilities{Ready: true, Mode: MasterMode}, nil
}

// probe asks every usable replica (replicaset.Set.ProbeAll).
func (b *masterBackend) probe(ctx context.Context, _ bool) error { return b.set.ProbeAll(ctx) }

// can: BatchLookup is lock-step on every replica's channel but with
// GRPCLookups, and the replicas answer for each other.
func (b *masterBackend) can() sourceCaps {
	return sourceCaps{lockStep: b.lockStep, replicas: b.set}
}

package umbp

import (
	"context"
	"errors"
	"fmt"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// DistributedMode is the Mode of [ServerCapabilities] of a standalone
// server whose backend is a node of a distributed pool (MORI's
// STANDALONE_BACKEND_DISTRIBUTED): its lookups are cluster-wide and it
// forwards the external-KV calls to the master.
const DistributedMode = "STANDALONE_BACKEND_DISTRIBUTED"

// errNotDistributed refuses a server that is not in distributed mode when
// Config.RequireDistributed asks for one.
var errNotDistributed = errors.New("the server's deployment mode is not " + DistributedMode + " (Config.RequireDistributed)")

// Tier is a storage tier of a node, as the external KV index records it.
type Tier int32

// The tiers a node reports its blocks on, fastest first.
const (
	TierHBM  = Tier(umbppb.TierType_TIER_HBM)
	TierDRAM = Tier(umbppb.TierType_TIER_DRAM)
	TierSSD  = Tier(umbppb.TierType_TIER_SSD)
)

// String returns "HBM", "DRAM" or "SSD".
func (t Tier) String() string {
	switch t {
	case TierHBM:
		return "HBM"
	case TierDRAM:
		return "DRAM"
	case TierSSD:
		return "SSD"
	}
	return fmt.Sprintf("Tier(%d)", int32(t))
}

func (t Tier) check() error {
	if t < TierHBM || t > TierSSD {
		return fmt.Errorf("%w: tier %v is not HBM, DRAM or SSD", ErrInvalidKey, t)
	}
	return nil
}

// ReportExternalKv tells the pool's master, through the server, that this
// engine holds the blocks hashes on tier, so that routers find them
// (MatchExternalKv). A server in distributed mode forwards the report under
// Config.NodeID, the identity it registers with the master when this
// handle registers memory (before that, MORI's server refuses: ErrRefused);
// a local one accepts and forgets it, as MORI's does.
// Requests carry at most 4096 hashes each (the master's batch limit);
// the call is bounded by ctx and Timeout, and its error says why the
// report did not land: unreachable (ErrUnavailable), refused (ErrRefused),
// no reply in time (context.DeadlineExceeded).
func (w *WorkerHandle) ReportExternalKv(ctx context.Context, tier Tier, hashes []string) error {
	return w.externalKv(ctx, "report external KV", tier, func(ctx context.Context, c *conn.Conn) (bool, error) {
		return c.ReportExternalKvBlocks(ctx, hashes, umbppb.TierType(tier))
	})
}

// RevokeExternalKv withdraws blocks reported on tier: the engine evicted
// them. Bounded and reported as ReportExternalKv.
func (w *WorkerHandle) RevokeExternalKv(ctx context.Context, tier Tier, hashes []string) error {
	return w.externalKv(ctx, "revoke external KV", tier, func(ctx context.Context, c *conn.Conn) (bool, error) {
		return c.RevokeExternalKvBlocks(ctx, hashes, umbppb.TierType(tier))
	})
}

// RevokeAllExternalKv withdraws every block this engine reported on tier.
func (w *WorkerHandle) RevokeAllExternalKv(ctx context.Context, tier Tier) error {
	return w.externalKv(ctx, "revoke all external KV", tier, func(ctx context.Context, c *conn.Conn) (bool, error) {
		return c.RevokeAllExternalKvBlocksAtTier(ctx, umbppb.TierType(tier))
	})
}

func (w *WorkerHandle) externalKv(ctx context.Context, op string, tier Tier, fn func(context.Context, *conn.Conn) (bool, error)) error {
	if err := tier.check(); err != nil {
		return fmt.Errorf("%w: %s", err, op)
	}
	if w.isClosed() {
		return fmt.Errorf("umbp: %s at %s: %w", op, w.address, ErrClosed)
	}
	c, err := w.link.current()
	if err != nil {
		return fmt.Errorf("umbp: %s at %s: %w", op, w.address, err)
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	ok, err := fn(ctx, c)
	w.link.failed(err)
	if err == nil && !ok {
		err = fmt.Errorf("%w: the server answered that it did not", ErrRefused)
	}
	if err != nil {
		return fmt.Errorf("umbp: %s at %s: %w", op, w.address, err)
	}
	return nil
}

// MatchExternalKv asks, through the server, which nodes hold hashes in the
// external KV index, without counting hits: one request of at most 4096
// hashes, bounded by ctx and Timeout. A local server finds nothing.
func (w *WorkerHandle) MatchExternalKv(ctx context.Context, hashes []string) ([]NodeBlocks, error) {
	const op = "match external KV"
	if w.isClosed() {
		return nil, fmt.Errorf("umbp: %s at %s: %w", op, w.address, ErrClosed)
	}
	c, err := w.link.current()
	if err != nil {
		return nil, fmt.Errorf("umbp: %s at %s: %w", op, w.address, err)
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	nm, err := standaloneSource{c}.match(ctx, hashes)
	w.link.failed(err)
	if err != nil {
		return nil, fmt.Errorf("umbp: %s at %s: %w", op, w.address, err)
	}
	out := make([]NodeBlocks, len(nm))
	for i, m := range nm {
		out[i] = nodeBlocksOf(m)
	}
	return out, nil
}

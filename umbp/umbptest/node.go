package umbptest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/tier"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// Tier is a storage tier of a node: TierHBM, TierDRAM or TierSSD. It is
// umbp.Tier: umbp.TierHBM and TierHBM are the same value.
type Tier = tier.Tier

// The tiers a node holds keys on, fastest first.
const (
	TierHBM  = tier.HBM
	TierDRAM = tier.DRAM
	TierSSD  = tier.SSD
)

// checkTier refuses a tier that is not HBM, DRAM or SSD.
func checkTier(t Tier) error {
	if !t.Valid() {
		return fmt.Errorf("tier %v is not HBM, DRAM or SSD", t)
	}
	return nil
}

// NodeOptions configure a Node.
type NodeOptions struct {
	// ID is the node's id in the pool; it must not be empty.
	ID string
	// PeerAddress is the address the master gives routers for the node
	// (and its node address); "" is ID.
	PeerAddress string
	// Keys are the keys the node holds when it starts, by tier: the
	// heartbeat index that BatchLookup answers from.
	Keys map[Tier][]string
	// External are the blocks the node reports when it starts, by tier:
	// the external KV index that MatchExternalKv answers from.
	External map[Tier][]string
	// Capacities are the tier capacities the node reports.
	Capacities map[Tier]TierCapacity
	// HeartbeatInterval is how often the node heartbeats; 0 is the
	// interval the master gives at registration (its TTL / 2), as MORI's
	// nodes do.
	HeartbeatInterval time.Duration
}

// Node is a node of a distributed pool as its master sees it: what MORI's
// standalone server in distributed mode does with the master, without the
// server. It registers with one master address (a lone Master, a replica of
// a ReplicatedMaster, or MORI's own master), holds keys on tiers (sent in
// sequence-numbered heartbeat bundles, as MORI's nodes send them), reports
// external KV blocks, and heartbeats on its own until Close, so that it
// never expires while the test runs. StopHeartbeats makes it fall silent,
// to test expiry.
//
// It heartbeats as MORI's nodes do, over the master's own wire to the one
// address it was given: bundles the master has not acknowledged are sent
// again with the next heartbeat; a master that asks for a full sync gets
// one; a master that answers UNKNOWN (restarted empty, or its store wiped)
// is registered with again and sent a full sync at once (MORI's nodes send
// it at the next heartbeat). External KV is not reported again: after such
// a loss it is gone, as MORI's is. A node whose heartbeats failed for
// longer than the master's expiry comes back with an empty index and is not
// asked to resync (MORI's behaviour): the keys it held before stay
// missing until Add sends them again.
//
// Every call is bounded by its context and waits, within it, for the
// node's connection to its master; a master that comes back is redialled
// within about 100 ms. Its methods are safe for concurrent use.
type Node struct {
	id, master string
	peer       string
	caps       []*umbppb.TierCapacity
	cc         *grpc.ClientConn
	c          umbppb.UMBPMasterClient

	sem    chan struct{} // one heartbeat at a time
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	held     map[string]map[Tier]struct{}
	outbox   []*umbppb.EventBundle // sent, not yet acknowledged
	nextSeq  uint64
	fullSync bool // the next heartbeat is a full sync
	silent   bool

	closeOnce sync.Once
	closeErr  error
}

// nodeUnregisterTimeout bounds Close's UnregisterClient.
const nodeUnregisterTimeout = time.Second

// NewNode starts a node as StartNode does, within 10 s, and registers
// Close with tb.Cleanup (whose error, a master that cannot be reached to
// unregister, is not reported: the master forgets such a node when it
// expires). It fails tb if the node cannot start.
func NewNode(tb testing.TB, master string, opts NodeOptions) *Node {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := StartNode(ctx, master, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = n.Close() })
	return n
}

// StartNode registers a node with the master at master (host:port),
// sends its Keys in a full sync and reports its External blocks, then
// heartbeats on its own. A node with that id already alive in the master
// is refused (codes.AlreadyExists). The caller must Close it.
func StartNode(ctx context.Context, master string, opts NodeOptions) (*Node, error) {
	if err := opts.check(master); err != nil {
		return nil, fmt.Errorf("umbptest: node %q: %w", opts.ID, err)
	}
	peer := opts.PeerAddress
	if peer == "" {
		peer = opts.ID
	}
	cc, err := grpc.NewClient("passthrough:///"+master,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 100 * time.Millisecond,
		}}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("umbptest: node %q: %w", opts.ID, err)
	}
	lifetime, cancel := context.WithCancel(context.Background())
	n := &Node{
		id: opts.ID, master: master, peer: peer, caps: capacities(opts.Capacities),
		cc: cc, c: umbppb.NewUMBPMasterClient(cc),
		sem: make(chan struct{}, 1), ctx: lifetime, cancel: cancel,
		held: make(map[string]map[Tier]struct{}), nextSeq: 1,
	}
	for tier, keys := range opts.Keys {
		for _, k := range keys {
			n.hold(k, tier)
		}
	}
	interval, err := n.start(ctx, opts)
	if err != nil {
		cancel()
		if interval >= 0 { // registered: leave
			ctx, stop := context.WithTimeout(context.Background(), nodeUnregisterTimeout)
			_, _ = n.c.UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: n.id})
			stop()
		}
		_ = cc.Close()
		return nil, err
	}
	n.wg.Go(func() { n.heartbeats(interval) })
	return n, nil
}

func (o *NodeOptions) check(master string) error {
	if o.ID == "" {
		return errors.New("empty node id")
	}
	if master == "" {
		return errors.New("no master address")
	}
	for _, m := range []map[Tier][]string{o.Keys, o.External} {
		for t := range m {
			if err := checkTier(t); err != nil {
				return err
			}
		}
	}
	for t := range o.Capacities {
		if err := checkTier(t); err != nil {
			return err
		}
	}
	return nil
}

func capacities(m map[Tier]TierCapacity) []*umbppb.TierCapacity {
	out := make([]*umbppb.TierCapacity, 0, len(m))
	for _, t := range slices.Sorted(maps.Keys(m)) {
		out = append(out, &umbppb.TierCapacity{Tier: umbppb.TierType(t), TotalCapacityBytes: m[t].Total, AvailableCapacityBytes: m[t].Available})
	}
	return out
}

// start registers, sends the first full sync and reports the external KV.
// It answers the heartbeat interval, or -1 if the node did not register.
func (n *Node) start(ctx context.Context, opts NodeOptions) (time.Duration, error) {
	resp, err := n.c.RegisterClient(ctx, n.registration(), grpc.WaitForReady(true))
	if err != nil {
		return -1, n.errorf("register: %w", err)
	}
	interval := opts.HeartbeatInterval
	if interval <= 0 {
		interval = max(time.Duration(resp.GetHeartbeatIntervalMs())*time.Millisecond, time.Millisecond)
	}
	n.mu.Lock()
	n.fullSync = len(n.held) > 0
	n.mu.Unlock()
	if err := n.Heartbeat(ctx); err != nil {
		return interval, err
	}
	for _, t := range slices.Sorted(maps.Keys(opts.External)) {
		if err := n.Report(ctx, t, opts.External[t]...); err != nil {
			return interval, err
		}
	}
	return interval, nil
}

func (n *Node) registration() *umbppb.RegisterClientRequest {
	return &umbppb.RegisterClientRequest{NodeId: n.id, NodeAddress: n.peer, PeerAddress: n.peer, TierCapacities: n.caps}
}

func (n *Node) errorf(format string, args ...any) error {
	return fmt.Errorf("umbptest: node %s: "+format, append([]any{n.id}, args...)...)
}

// errNodeClosed is the error of a call after Close.
var errNodeClosed = errors.New("closed")

func (n *Node) closed() error {
	if n.ctx.Err() != nil {
		return n.errorf("%w", errNodeClosed)
	}
	return nil
}

// ID is the node's id.
func (n *Node) ID() string { return n.id }

// Master is the address the node registered with.
func (n *Node) Master() string { return n.master }

// hold records that the node holds key on tier. n.mu must be held, or the
// node not yet shared.
func (n *Node) hold(key string, tier Tier) {
	ts := n.held[key]
	if ts == nil {
		ts = make(map[Tier]struct{}, 1)
		n.held[key] = ts
	}
	ts[tier] = struct{}{}
}

// Add makes the node hold keys on tier: one heartbeat bundle of ADD
// events, sent now. It returns once the master applied it (or took a full
// sync in its place), or the error of the heartbeat; a bundle that was not
// acknowledged is sent again with the next heartbeat.
func (n *Node) Add(ctx context.Context, tier Tier, keys ...string) error {
	return n.change(ctx, umbppb.KvEvent_ADD, tier, keys)
}

// Remove makes the node drop keys from tier, as Add adds them.
func (n *Node) Remove(ctx context.Context, tier Tier, keys ...string) error {
	return n.change(ctx, umbppb.KvEvent_REMOVE, tier, keys)
}

func (n *Node) change(ctx context.Context, kind umbppb.KvEvent_Kind, tier Tier, keys []string) error {
	if err := checkTier(tier); err != nil {
		return n.errorf("%w", err)
	}
	if err := n.closed(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	evs := make([]*umbppb.KvEvent, len(keys))
	n.mu.Lock()
	for i, k := range keys {
		evs[i] = &umbppb.KvEvent{Kind: kind, Key: k, Tier: umbppb.TierType(tier)}
		if kind == umbppb.KvEvent_ADD {
			n.hold(k, tier)
		} else if ts := n.held[k]; ts != nil {
			delete(ts, tier)
			if len(ts) == 0 {
				delete(n.held, k)
			}
		}
	}
	n.outbox = append(n.outbox, &umbppb.EventBundle{Seq: n.nextSeq, Events: evs})
	n.nextSeq++
	n.mu.Unlock()
	return n.Heartbeat(ctx)
}

// Report reports that the node holds the blocks hashes on tier
// (ReportExternalKvBlocks), for MatchExternalKv. A master that does not
// count the node alive drops the report without an error, as MORI's does.
func (n *Node) Report(ctx context.Context, tier Tier, hashes ...string) error {
	return n.externalKV("report", tier, hashes, func(h []string, t umbppb.TierType) error {
		_, err := n.c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: n.id, Hashes: h, Tier: t}, grpc.WaitForReady(true))
		return err
	})
}

// Revoke withdraws blocks the node reported on tier
// (RevokeExternalKvBlocks).
func (n *Node) Revoke(ctx context.Context, tier Tier, hashes ...string) error {
	return n.externalKV("revoke", tier, hashes, func(h []string, t umbppb.TierType) error {
		_, err := n.c.RevokeExternalKvBlocks(ctx, &umbppb.RevokeExternalKvBlocksRequest{NodeId: n.id, Hashes: h, Tier: t}, grpc.WaitForReady(true))
		return err
	})
}

// externalKV checks a Report or Revoke of hashes on tier and makes its
// call.
func (n *Node) externalKV(what string, tier Tier, hashes []string, call func([]string, umbppb.TierType) error) error {
	if err := checkTier(tier); err != nil {
		return n.errorf("%w", err)
	}
	if err := n.closed(); err != nil {
		return err
	}
	if len(hashes) == 0 {
		return nil
	}
	if err := call(hashes, umbppb.TierType(tier)); err != nil {
		return n.errorf("%s external KV: %w", what, err)
	}
	return nil
}

// StopHeartbeats makes the node fall silent, as a node that hangs or lost
// its network: no heartbeat of its own until StartHeartbeats, so that the
// master expires it after TTL × missed heartbeats. It returns once a
// heartbeat of the node's own in flight has ended (within max(interval,
// 1 s)): none reaches the master after it. Add, Remove and Heartbeat still
// send one each.
func (n *Node) StopHeartbeats() {
	n.mu.Lock()
	n.silent = true
	n.mu.Unlock()
	n.sem <- struct{}{} // the loop checks silent under sem
	<-n.sem
}

// StartHeartbeats makes a silent node heartbeat on its own again, from its
// next tick.
func (n *Node) StartHeartbeats() {
	n.mu.Lock()
	n.silent = false
	n.mu.Unlock()
}

func (n *Node) heartbeats(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(n.ctx, max(interval, time.Second))
		_ = n.heartbeat(ctx, true) // the next tick tries again
		cancel()
	}
}

// Heartbeat sends one heartbeat now, as the node's own do: the bundles not
// yet acknowledged, or a full sync when one is due, registering again
// first if the master answers UNKNOWN. It returns once the master
// acknowledged them, or the error.
func (n *Node) Heartbeat(ctx context.Context) error {
	return n.heartbeat(ctx, false)
}

// heartbeat sends one heartbeat; one of the node's own (background) is not
// sent while the node is silent.
func (n *Node) heartbeat(ctx context.Context, background bool) error {
	if err := n.closed(); err != nil {
		return err
	}
	select {
	case n.sem <- struct{}{}:
	case <-ctx.Done():
		return n.errorf("heartbeat: %w", ctx.Err())
	}
	defer func() { <-n.sem }()
	if background {
		n.mu.Lock()
		silent := n.silent
		n.mu.Unlock()
		if silent {
			return nil
		}
	}
	// At most: a delta answered UNKNOWN or asked for a full sync, then
	// the full sync.
	for range 3 {
		req, full := n.request()
		resp, err := n.c.Heartbeat(ctx, req, grpc.WaitForReady(true))
		if err != nil {
			if full {
				n.setFullSync()
			}
			return n.errorf("heartbeat: %w", err)
		}
		if resp.GetStatus() == umbppb.ClientStatus_CLIENT_STATUS_UNKNOWN {
			if err := n.register(ctx); err != nil {
				if full {
					n.setFullSync()
				}
				return err
			}
			continue
		}
		n.ack(resp.GetAckedSeq())
		if !resp.GetRequestFullSync() || full {
			return nil
		}
		n.setFullSync()
	}
	return n.errorf("heartbeat: the master answered UNKNOWN after the node registered again")
}

// register registers the node again (the master forgot it): a full sync
// is due.
func (n *Node) register(ctx context.Context) error {
	_, err := n.c.RegisterClient(ctx, n.registration(), grpc.WaitForReady(true))
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return n.errorf("register again: %w", err)
	}
	n.setFullSync()
	return nil
}

func (n *Node) setFullSync() {
	n.mu.Lock()
	n.fullSync = true
	n.mu.Unlock()
}

// request is the next heartbeat: a full sync of everything held, when one
// is due, else the bundles not yet acknowledged.
func (n *Node) request() (*umbppb.HeartbeatRequest, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	req := &umbppb.HeartbeatRequest{NodeId: n.id, TierCapacities: n.caps}
	if !n.fullSync {
		req.Bundles = slices.Clone(n.outbox)
		return req, false
	}
	n.fullSync = false
	req.IsFullSync = true
	req.DeltaSeqBaseline = n.nextSeq - 1
	var evs []*umbppb.KvEvent
	for _, k := range slices.Sorted(maps.Keys(n.held)) {
		for _, t := range slices.Sorted(maps.Keys(n.held[k])) {
			evs = append(evs, &umbppb.KvEvent{Kind: umbppb.KvEvent_ADD, Key: k, Tier: umbppb.TierType(t)})
		}
	}
	req.Bundles = []*umbppb.EventBundle{{Seq: n.nextSeq - 1, Events: evs}}
	return req, true
}

// ack drops the bundles the master acknowledged.
func (n *Node) ack(seq uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.outbox = slices.DeleteFunc(n.outbox, func(b *umbppb.EventBundle) bool { return b.GetSeq() <= seq })
}

// Close stops the node's heartbeats and unregisters it (the master drops
// its keys and external KV at once), waiting at most 1 s for the master: a
// master that cannot be reached forgets the node when it expires. It
// returns the error of UnregisterClient. It is idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.cancel()
		n.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), nodeUnregisterTimeout)
		defer cancel()
		if _, err := n.c.UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: n.id}); err != nil {
			n.closeErr = n.errorf("unregister: %w", err)
		}
		_ = n.cc.Close()
	})
	return n.closeErr
}

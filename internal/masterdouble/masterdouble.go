// Package masterdouble is a Go stand-in for MORI's UMBP master (the gRPC
// service umbp.UMBPMaster): the membership, heartbeat-maintained key index
// and external KV index of MORI's in-memory metadata store, with the
// answers MORI's master gives, edge cases included. It is a test double:
// MORI's master is the engine, and this package follows it, never the
// other way round. It does no routing (RouteGet, RoutePut and their batch
// forms answer codes.Unimplemented) and no eviction.
//
// umbptest.Master serves it over loopback TCP with fault injection; the
// state lives here so that it can be tested without a network.
package masterdouble

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// Options configure a Service. Zero fields take MORI's defaults.
type Options struct {
	// HeartbeatTTL (default 10s, MORI's UMBP_HEARTBEAT_TTL_SEC) times
	// MaxMissedHeartbeats (default 3, UMBP_MAX_MISSED_HEARTBEATS) is how
	// long after its last heartbeat a node is expired by the next Reap.
	HeartbeatTTL        time.Duration
	MaxMissedHeartbeats int
	// HitQueryMaxBatch bounds GetExternalKvHitCounts (default 4096,
	// UMBP_HIT_QUERY_MAX_BATCH).
	HitQueryMaxBatch int
	// HitIndexTTL is how long a hash's hit count lives after its last hit
	// (default 2h, UMBP_HIT_INDEX_TTL_SEC); Reap drops older ones.
	HitIndexTTL time.Duration
	// Now is the clock (default time.Now): liveness, staleness and hit
	// ages are measured with it.
	Now func() time.Time
	// StoreTimeout is how long a call waits for a stopped store before it
	// fails (default 1s: the socket timeout of MORI's RESP client); it is
	// measured on the real clock, whatever Now is.
	StoreTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.HeartbeatTTL <= 0 {
		o.HeartbeatTTL = 10 * time.Second
	}
	if o.MaxMissedHeartbeats <= 0 {
		o.MaxMissedHeartbeats = 3
	}
	if o.HitQueryMaxBatch <= 0 {
		o.HitQueryMaxBatch = 4096
	}
	if o.HitIndexTTL <= 0 {
		o.HitIndexTTL = 2 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = time.Second
	}
	return o
}

// heartbeatIntervalDivisor is MORI's UMBP_HEARTBEAT_INTERVAL_DIVISOR
// default: the interval a node is told is the TTL over it.
const heartbeatIntervalDivisor = 2

// Status is what the master knows of a node.
type Status int

// The statuses of a node record. A node that unregistered has no record.
const (
	Alive Status = iota + 1
	Expired
)

// Node is a snapshot of one node's record.
type Node struct {
	ID            string
	PeerAddress   string
	Status        Status
	LastHeartbeat time.Time
	// AppliedSeq is the last heartbeat bundle seq applied.
	AppliedSeq uint64
	// Keys is how many keys of the heartbeat index the node holds (a key
	// held on two tiers counts once).
	Keys int
	// Capacities are the tier capacities last applied.
	Capacities map[umbppb.TierType]Capacity
}

// Capacity is one tier's capacity as a node reported it.
type Capacity struct{ Total, Available uint64 }

type client struct {
	id, address, peer string
	status            Status
	lastHeartbeat     time.Time
	appliedSeq        uint64
	caps              map[umbppb.TierType]Capacity
	tags              []string
}

type location struct {
	node string
	tier umbppb.TierType
	size uint64
}

type hit struct {
	count    uint64
	lastSeen time.Time
}

// Service implements umbppb.UMBPMasterServer. Its methods are safe for
// concurrent use.
type Service struct {
	umbppb.UnimplementedUMBPMasterServer
	opts Options

	mu       sync.RWMutex
	clients  map[string]*client
	blocks   map[string][]location          // key -> where it is held
	nodeKeys map[string]map[string]struct{} // node -> its keys in blocks
	ext      map[string]map[string][]umbppb.TierType
	hits     map[string]*hit
	expired  chan struct{} // closed and replaced when Reap expires a node, and by Wipe

	omu     sync.Mutex
	outage  Outage
	changed chan struct{}        // closed and replaced when the outage changes
	latency func() time.Duration // of each trip to a store that is up; nil: none
	onWait  func(string)         // tests: called when a call starts to wait: "store" (stopped) or "expiry" (WaitExpired)
}

var _ umbppb.UMBPMasterServer = (*Service)(nil)

// New returns an empty master.
func New(opts Options) *Service {
	return &Service{
		opts:     opts.withDefaults(),
		clients:  make(map[string]*client),
		blocks:   make(map[string][]location),
		nodeKeys: make(map[string]map[string]struct{}),
		ext:      make(map[string]map[string][]umbppb.TierType),
		hits:     make(map[string]*hit),
		expired:  make(chan struct{}),
		changed:  make(chan struct{}),
	}
}

// ExpiryAfter is how long after its last heartbeat a node counts as stale:
// HeartbeatTTL × MaxMissedHeartbeats.
func (s *Service) ExpiryAfter() time.Duration {
	return s.opts.HeartbeatTTL * time.Duration(s.opts.MaxMissedHeartbeats)
}

// Reap is one pass of MORI's reaper: every alive node whose last heartbeat
// is older than ExpiryAfter is marked expired and its keys and external KV
// hashes are dropped (the record stays, so it may heartbeat again); hit
// counts older than HitIndexTTL are dropped. It returns the expired nodes.
// While the store is out (SetOutage) it does nothing, as MORI's reaper,
// which cannot reach the store, does nothing.
func (s *Service) Reap() []string {
	if s.Outage() != StoreUp {
		return nil
	}
	now := s.opts.Now()
	cutoff := now.Add(-s.ExpiryAfter())
	s.mu.Lock()
	defer s.mu.Unlock()
	var dead []string
	for id, c := range s.clients {
		if c.status == Alive && c.lastHeartbeat.Before(cutoff) {
			c.status = Expired
			dead = append(dead, id)
		}
	}
	for _, id := range dead {
		s.dropNodeLocked(id)
	}
	hitCutoff := now.Add(-s.opts.HitIndexTTL)
	for h, e := range s.hits {
		if e.lastSeen.Before(hitCutoff) {
			delete(s.hits, h)
		}
	}
	if len(dead) > 0 {
		close(s.expired)
		s.expired = make(chan struct{})
	}
	slices.Sort(dead)
	return dead
}

// WaitExpired waits until node is expired or has no record, or ctx ends.
func (s *Service) WaitExpired(ctx context.Context, node string) error {
	for {
		s.mu.RLock()
		c := s.clients[node]
		gone := c == nil || c.status == Expired
		ch := s.expired
		s.mu.RUnlock()
		if gone {
			return nil
		}
		if s.onWait != nil {
			s.onWait("expiry")
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Node returns a snapshot of a node's record.
func (s *Service) Node(id string) (Node, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c := s.clients[id]
	if c == nil {
		return Node{}, false
	}
	n := Node{
		ID: c.id, PeerAddress: c.peer, Status: c.status, LastHeartbeat: c.lastHeartbeat,
		AppliedSeq: c.appliedSeq, Keys: len(s.nodeKeys[id]),
		Capacities: make(map[umbppb.TierType]Capacity, len(c.caps)),
	}
	for t, cp := range c.caps {
		n.Capacities[t] = cp
	}
	return n, true
}

// dropNodeLocked removes a node's keys and external KV hashes.
func (s *Service) dropNodeLocked(id string) {
	for key := range s.nodeKeys[id] {
		locs := slices.DeleteFunc(s.blocks[key], func(l location) bool { return l.node == id })
		if len(locs) == 0 {
			delete(s.blocks, key)
		} else {
			s.blocks[key] = locs
		}
	}
	delete(s.nodeKeys, id)
	for h, nodes := range s.ext {
		delete(nodes, id)
		if len(nodes) == 0 {
			delete(s.ext, h)
		}
	}
}

func capsOf(tcs []*umbppb.TierCapacity) map[umbppb.TierType]Capacity {
	m := make(map[umbppb.TierType]Capacity, len(tcs))
	for _, tc := range tcs {
		m[tc.GetTier()] = Capacity{Total: tc.GetTotalCapacityBytes(), Available: tc.GetAvailableCapacityBytes()}
	}
	return m
}

// RegisterClient adds a node, or replaces the record of one that is
// expired or stale (no heartbeat for ExpiryAfter, not yet reaped); an alive
// node is refused with codes.AlreadyExists. The node id is not checked
// (MORI accepts an empty one). Replacing a record resets its applied seq
// to 0 but keeps whatever keys the index still holds for the node.
func (s *Service) RegisterClient(ctx context.Context, req *umbppb.RegisterClientRequest) (*umbppb.RegisterClientResponse, error) {
	if _, err := s.store(ctx, "RegisterClient", false); err != nil {
		return nil, err
	}
	now := s.opts.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.clients[req.GetNodeId()]; c != nil {
		stale := now.Sub(c.lastHeartbeat) > s.ExpiryAfter() || c.status == Expired
		if c.status == Alive && !stale {
			return nil, status.Error(codes.AlreadyExists, "node is already alive and cannot be re-registered")
		}
	}
	s.clients[req.GetNodeId()] = &client{
		id: req.GetNodeId(), address: req.GetNodeAddress(), peer: req.GetPeerAddress(),
		status: Alive, lastHeartbeat: now, caps: capsOf(req.GetTierCapacities()),
		tags: slices.Clone(req.GetTags()),
	}
	// MORI's TTL has whole seconds; the interval is computed in ms from them.
	ms := uint64(s.opts.HeartbeatTTL.Milliseconds()) / heartbeatIntervalDivisor
	return &umbppb.RegisterClientResponse{HeartbeatIntervalMs: ms, AckSeq: 0}, nil
}

// UnregisterClient drops a node's record, keys and external KV hashes at
// once (its hit counts stay). An unknown node is not an error.
func (s *Service) UnregisterClient(ctx context.Context, req *umbppb.UnregisterClientRequest) (*umbppb.UnregisterClientResponse, error) {
	if _, err := s.store(ctx, "UnregisterClient", false); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.clients[req.GetNodeId()]; ok {
		delete(s.clients, req.GetNodeId())
		s.dropNodeLocked(req.GetNodeId())
	}
	return &umbppb.UnregisterClientResponse{}, nil
}

// Heartbeat refreshes a known node's liveness (an expired node is alive
// again, with whatever its index holds: nothing, unless it re-sent keys)
// and then: a full sync replaces the node's keys with the ADD events of all
// its bundles and takes delta_seq_baseline as applied; no bundles is a
// keepalive; otherwise bundles are applied in order while each seq is
// exactly one past the last applied, and the first that is not (a gap or a
// resend) stops the loop and asks for a full sync, the earlier ones staying
// applied. Capacities are taken only with an applied bundle or full sync.
// acked_seq is the last applied seq. An unknown node gets status UNKNOWN,
// acked_seq 0, and no error.
func (s *Service) Heartbeat(ctx context.Context, req *umbppb.HeartbeatRequest) (*umbppb.HeartbeatResponse, error) {
	if _, err := s.store(ctx, "Heartbeat", false); err != nil {
		return nil, err
	}
	now := s.opts.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.clients[req.GetNodeId()]
	if c == nil {
		return &umbppb.HeartbeatResponse{Status: umbppb.ClientStatus_CLIENT_STATUS_UNKNOWN}, nil
	}
	resp := &umbppb.HeartbeatResponse{Status: umbppb.ClientStatus_CLIENT_STATUS_ALIVE}
	c.lastHeartbeat = now
	c.status = Alive
	switch {
	case req.GetIsFullSync():
		c.caps = capsOf(req.GetTierCapacities())
		c.appliedSeq = req.GetDeltaSeqBaseline()
		s.replaceLocked(c.id, req.GetBundles())
		resp.AckedSeq = c.appliedSeq
	case len(req.GetBundles()) == 0:
		// A keepalive: liveness only, no capacities, no full-sync request.
		resp.AckedSeq = c.appliedSeq
	default:
		for _, b := range req.GetBundles() {
			if b.GetSeq() != c.appliedSeq+1 {
				resp.RequestFullSync = true
				break
			}
			c.caps = capsOf(req.GetTierCapacities())
			c.appliedSeq = b.GetSeq()
			for _, ev := range b.GetEvents() {
				s.applyLocked(c.id, ev)
			}
		}
		resp.AckedSeq = c.appliedSeq
	}
	return resp, nil
}

// applyLocked applies one delta event. A kind other than REMOVE is an ADD;
// a second ADD of a key a node already holds on that tier keeps the first
// size; a REMOVE of what the node does not hold is nothing.
func (s *Service) applyLocked(node string, ev *umbppb.KvEvent) {
	key, tier := ev.GetKey(), ev.GetTier()
	locs := s.blocks[key]
	i := slices.IndexFunc(locs, func(l location) bool { return l.node == node && l.tier == tier })
	if ev.GetKind() != umbppb.KvEvent_REMOVE {
		if i < 0 {
			s.blocks[key] = append(locs, location{node: node, tier: tier, size: ev.GetSize()})
		}
		s.addNodeKeyLocked(node, key)
		return
	}
	if i < 0 {
		return
	}
	locs = slices.Delete(locs, i, i+1)
	if !slices.ContainsFunc(locs, func(l location) bool { return l.node == node }) {
		if ks := s.nodeKeys[node]; ks != nil {
			delete(ks, key)
			if len(ks) == 0 {
				delete(s.nodeKeys, node)
			}
		}
	}
	if len(locs) == 0 {
		delete(s.blocks, key)
	} else {
		s.blocks[key] = locs
	}
}

func (s *Service) addNodeKeyLocked(node, key string) {
	ks := s.nodeKeys[node]
	if ks == nil {
		ks = make(map[string]struct{})
		s.nodeKeys[node] = ks
	}
	ks[key] = struct{}{}
}

// replaceLocked is a full sync: the node's keys become the ADD events of
// every bundle (REMOVE events are ignored, a kind MORI does not know is an
// ADD); a repeated ADD takes the last size.
func (s *Service) replaceLocked(node string, bundles []*umbppb.EventBundle) {
	s.dropBlocksLocked(node)
	for _, b := range bundles {
		for _, ev := range b.GetEvents() {
			if ev.GetKind() == umbppb.KvEvent_REMOVE {
				continue
			}
			key, tier := ev.GetKey(), ev.GetTier()
			locs := s.blocks[key]
			if i := slices.IndexFunc(locs, func(l location) bool { return l.node == node && l.tier == tier }); i >= 0 {
				locs[i].size = ev.GetSize()
			} else {
				s.blocks[key] = append(locs, location{node: node, tier: tier, size: ev.GetSize()})
			}
			s.addNodeKeyLocked(node, key)
		}
	}
}

func (s *Service) dropBlocksLocked(node string) {
	for key := range s.nodeKeys[node] {
		locs := slices.DeleteFunc(s.blocks[key], func(l location) bool { return l.node == node })
		if len(locs) == 0 {
			delete(s.blocks, key)
		} else {
			s.blocks[key] = locs
		}
	}
	delete(s.nodeKeys, node)
}

// BatchLookup answers, per key, whether any node holds it on any tier. It
// touches nothing; any number of keys (up to the 64 MiB message limit). A
// lookup of no key is answered without the store, as MORI's is (its
// store's BatchExistsBlock returns before it asks Redis): it answers
// during a store outage too.
func (s *Service) BatchLookup(ctx context.Context, req *umbppb.BatchLookupRequest) (*umbppb.BatchLookupResponse, error) {
	found := make([]bool, len(req.GetKeys()))
	if len(found) == 0 {
		return &umbppb.BatchLookupResponse{}, nil
	}
	if nothing, err := s.store(ctx, "BatchLookup", true); err != nil || nothing {
		if err != nil {
			return nil, err
		}
		return &umbppb.BatchLookupResponse{Found: found}, nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i, k := range req.GetKeys() {
		found[i] = len(s.blocks[k]) > 0
	}
	return &umbppb.BatchLookupResponse{Found: found}, nil
}

// ReportExternalKvBlocks records hashes a node holds on a tier. An empty
// node id or hash list is codes.InvalidArgument; a node that is not alive
// is answered OK and nothing is recorded (as MORI does).
func (s *Service) ReportExternalKvBlocks(ctx context.Context, req *umbppb.ReportExternalKvBlocksRequest) (*umbppb.ReportExternalKvBlocksResponse, error) {
	if err := checkMutation(req.GetNodeId(), len(req.GetHashes())); err != nil {
		return nil, err
	}
	if _, err := s.store(ctx, "ReportExternalKvBlocks", false); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.clients[req.GetNodeId()]; c != nil && c.status == Alive {
		for _, h := range req.GetHashes() {
			nodes := s.ext[h]
			if nodes == nil {
				nodes = make(map[string][]umbppb.TierType)
				s.ext[h] = nodes
			}
			tiers := nodes[req.GetNodeId()]
			if i, ok := slices.BinarySearch(tiers, req.GetTier()); !ok {
				nodes[req.GetNodeId()] = slices.Insert(tiers, i, req.GetTier())
			}
		}
	}
	return &umbppb.ReportExternalKvBlocksResponse{}, nil
}

func checkMutation(node string, hashes int) error {
	if node == "" {
		return status.Error(codes.InvalidArgument, "node_id must not be empty")
	}
	if hashes == 0 {
		return status.Error(codes.InvalidArgument, "hashes must not be empty")
	}
	return nil
}

// revokeLocked removes (hash, node, tier); tier < 0 removes every tier.
func (s *Service) revokeLocked(h, node string, tier umbppb.TierType, all bool) {
	nodes := s.ext[h]
	tiers, ok := nodes[node]
	if !ok {
		return
	}
	if all {
		tiers = nil
	} else if i, ok := slices.BinarySearch(tiers, tier); ok {
		tiers = slices.Delete(tiers, i, i+1)
	}
	if len(tiers) == 0 {
		delete(nodes, node)
	} else {
		nodes[node] = tiers
	}
	if len(nodes) == 0 {
		delete(s.ext, h)
	}
}

// RevokeExternalKvBlocks forgets hashes of a node on a tier, whether or not
// the node is alive; unknown ones are nothing. Its argument checks are
// ReportExternalKvBlocks's.
func (s *Service) RevokeExternalKvBlocks(ctx context.Context, req *umbppb.RevokeExternalKvBlocksRequest) (*umbppb.RevokeExternalKvBlocksResponse, error) {
	if err := checkMutation(req.GetNodeId(), len(req.GetHashes())); err != nil {
		return nil, err
	}
	if _, err := s.store(ctx, "RevokeExternalKvBlocks", false); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range req.GetHashes() {
		s.revokeLocked(h, req.GetNodeId(), req.GetTier(), false)
	}
	return &umbppb.RevokeExternalKvBlocksResponse{}, nil
}

// RevokeAllExternalKvBlocksAtTier forgets every hash of a node on a tier.
func (s *Service) RevokeAllExternalKvBlocksAtTier(ctx context.Context, req *umbppb.RevokeAllExternalKvBlocksAtTierRequest) (*umbppb.RevokeAllExternalKvBlocksAtTierResponse, error) {
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "node_id must not be empty")
	}
	if _, err := s.store(ctx, "RevokeAllExternalKvBlocksAtTier", false); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for h := range s.ext {
		s.revokeLocked(h, req.GetNodeId(), req.GetTier(), false)
	}
	return &umbppb.RevokeAllExternalKvBlocksAtTierResponse{}, nil
}

// RevokeAllExternalKvBlocksForNode forgets every hash of a node.
func (s *Service) RevokeAllExternalKvBlocksForNode(ctx context.Context, req *umbppb.RevokeAllExternalKvBlocksForNodeRequest) (*umbppb.RevokeAllExternalKvBlocksForNodeResponse, error) {
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "node_id must not be empty")
	}
	if _, err := s.store(ctx, "RevokeAllExternalKvBlocksForNode", false); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for h := range s.ext {
		s.revokeLocked(h, req.GetNodeId(), 0, true)
	}
	return &umbppb.RevokeAllExternalKvBlocksForNodeResponse{}, nil
}

// MatchExternalKv answers, for every node holding any of the hashes in the
// external KV index, the hashes it holds by tier: each hash of the request
// independently (no prefix rule), in request order, a repeated hash
// repeated, tiers ascending; a node with none of them is left out. MORI's
// node order is that of a hash map; here nodes are sorted by id. The peer
// address is the node's if it is alive, else empty. count_as_hit counts
// every distinct matched hash once.
func (s *Service) MatchExternalKv(ctx context.Context, req *umbppb.MatchExternalKvRequest) (*umbppb.MatchExternalKvResponse, error) {
	if nothing, err := s.store(ctx, "MatchExternalKv", true); err != nil || nothing {
		if err != nil {
			return nil, err
		}
		return &umbppb.MatchExternalKvResponse{}, nil
	}
	if req.GetCountAsHit() {
		s.mu.Lock()
		defer s.mu.Unlock()
	} else {
		s.mu.RLock()
		defer s.mu.RUnlock()
	}
	acc := make(map[string]map[umbppb.TierType][]string)
	for _, h := range req.GetHashes() {
		for node, tiers := range s.ext[h] {
			by := acc[node]
			if by == nil {
				by = make(map[umbppb.TierType][]string)
				acc[node] = by
			}
			for _, t := range tiers {
				by[t] = append(by[t], h)
			}
		}
	}
	if req.GetCountAsHit() {
		now := s.opts.Now()
		seen := make(map[string]struct{})
		for _, by := range acc {
			for _, hs := range by {
				for _, h := range hs {
					if _, ok := seen[h]; ok {
						continue
					}
					seen[h] = struct{}{}
					e := s.hits[h]
					if e == nil {
						e = &hit{}
						s.hits[h] = e
					}
					e.count++
					if e.lastSeen.Before(now) {
						e.lastSeen = now
					}
				}
			}
		}
	}
	nodes := make([]string, 0, len(acc))
	for n := range acc {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	matches := make([]*umbppb.ExternalKvNodeMatch, 0, len(nodes))
	for _, n := range nodes {
		var peer string
		if c := s.clients[n]; c != nil && c.status == Alive {
			peer = c.peer
		}
		by := acc[n]
		tiers := make([]umbppb.TierType, 0, len(by))
		for t := range by {
			tiers = append(tiers, t)
		}
		slices.Sort(tiers)
		buckets := make([]*umbppb.TierHashes, 0, len(tiers))
		for _, t := range tiers {
			buckets = append(buckets, &umbppb.TierHashes{Tier: t, Hashes: by[t]})
		}
		matches = append(matches, &umbppb.ExternalKvNodeMatch{NodeId: n, PeerAddress: peer, HashesByTier: buckets})
	}
	return &umbppb.MatchExternalKvResponse{Matches: matches}, nil
}

// GetExternalKvHitCounts answers the hit counts of the distinct hashes
// asked that have any, in request order (a hash never hit is left out).
// More than HitQueryMaxBatch hashes is codes.InvalidArgument.
func (s *Service) GetExternalKvHitCounts(ctx context.Context, req *umbppb.GetExternalKvHitCountsRequest) (*umbppb.GetExternalKvHitCountsResponse, error) {
	if len(req.GetHashes()) > s.opts.HitQueryMaxBatch {
		return nil, status.Error(codes.InvalidArgument, "hashes size exceeds UMBP_HIT_QUERY_MAX_BATCH="+strconv.Itoa(s.opts.HitQueryMaxBatch))
	}
	if nothing, err := s.store(ctx, "GetExternalKvHitCounts", true); err != nil || nothing {
		if err != nil {
			return nil, err
		}
		return &umbppb.GetExternalKvHitCountsResponse{}, nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	seen := make(map[string]struct{}, len(req.GetHashes()))
	var out []*umbppb.HitCountEntry
	for _, h := range req.GetHashes() {
		if _, ok := seen[h]; ok {
			continue
		}
		seen[h] = struct{}{}
		if e := s.hits[h]; e != nil {
			out = append(out, &umbppb.HitCountEntry{Hash: h, HitCountTotal: e.count})
		}
	}
	return &umbppb.GetExternalKvHitCountsResponse{Entries: out}, nil
}

// ReportMetrics is accepted and ignored, as MORI's master does when its
// metrics exporter is off (without touching the store).
func (s *Service) ReportMetrics(context.Context, *umbppb.ReportMetricsRequest) (*umbppb.ReportMetricsResponse, error) {
	return &umbppb.ReportMetricsResponse{}, nil
}

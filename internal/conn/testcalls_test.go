package conn

// Calls that production code does not make, kept for the conformance and
// wire tests: single-key data calls, Exists, the external-KV calls and the
// bare generated client.

import (
	"context"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/umbp-go/umbp-go/internal/rpc"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// Put stores key from seg. It returns true when the server stored it or
// already held it (the first writer wins). A refusal with a reason is an
// error wrapping ErrRefused; a plain false is (false, nil).
func (c *Conn) Put(ctx context.Context, key string, seg Segment) (bool, error) {
	const op = "Put"
	if err := c.checkOne(op, key, seg); err != nil {
		return false, err
	}
	resp, err := c.raw.Put(ctx, &umbppb.PutRequest{
		Key:        key,
		ClientId:   c.clientID,
		ShmOffset:  seg.Offset,
		Size:       seg.Size,
		RegionBase: seg.RegionBase,
	})
	if err != nil {
		return false, c.rpcError(ctx, op, err)
	}
	return boolReply(op, resp)
}

// Get loads key into seg. It returns false when the key is missing or stored
// with another size; a refusal with a reason is an error wrapping
// ErrRefused.
func (c *Conn) Get(ctx context.Context, key string, seg Segment) (bool, error) {
	const op = "Get"
	if err := c.checkOne(op, key, seg); err != nil {
		return false, err
	}
	resp, err := c.raw.Get(ctx, &umbppb.GetRequest{
		Key:        key,
		ClientId:   c.clientID,
		ShmOffset:  seg.Offset,
		Size:       seg.Size,
		RegionBase: seg.RegionBase,
	})
	if err != nil {
		return false, c.rpcError(ctx, op, err)
	}
	return boolReply(op, resp)
}

func (c *Conn) checkOne(op, key string, seg Segment) error {
	if err := c.usable(op); err != nil {
		return err
	}
	if err := checkKey(op, 0, key); err != nil {
		return err
	}
	if err := checkSegment(op, 0, seg); err != nil {
		return err
	}
	// key, client_id, three varints.
	if n := rpc.BytesField(len(key)) + rpc.BytesField(len(c.clientID)) + 3*11; n > maxRequestBytes {
		return rpc.Invalid(op, "key of %d bytes does not fit the %d-byte message limit", len(key), maxRequestBytes)
	}
	return nil
}

// Exists reports whether the server holds key. A missing key is
// (false, nil); an answer with a reason is an error wrapping ErrRefused.
// The server may still report a key it evicted until a Get of it fails.
func (c *Conn) Exists(ctx context.Context, key string) (bool, error) {
	const op = "Exists"
	if err := c.usable(op); err != nil {
		return false, err
	}
	if err := checkKey(op, 0, key); err != nil {
		return false, err
	}
	if rpc.BytesField(len(key)) > maxRequestBytes {
		return false, rpc.Invalid(op, "key of %d bytes does not fit the %d-byte message limit", len(key), maxRequestBytes)
	}
	resp, err := c.raw.Exists(ctx, &umbppb.KeyRequest{Key: key})
	if err != nil {
		return false, c.rpcError(ctx, op, err)
	}
	return boolReply(op, resp)
}

// Raw returns the bare generated client on this connection, for comparisons
// and methods without a wrapper.
func (c *Conn) Raw() umbppb.UMBPStandaloneClient { return c.raw }

// MatchExternalKv and GetExternalKvHitCounts with every hash, split like
// any batch (the production calls are in externalkv.go).

// ExternalKvMatch is one node's answer to MatchExternalKv.
type ExternalKvMatch struct {
	NodeID       string
	PeerAddress  string
	HashesByTier []TierHashes
}

// TierHashes lists the hashes found on one tier.
type TierHashes struct {
	Tier   umbppb.TierType
	Hashes []string
}

// HitCount is the total hit count of one hash.
type HitCount struct {
	Hash  string
	Total uint64
}

// MatchExternalKv asks which nodes hold hashes, counting the lookups as hits
// when countAsHit. A split request's answers are merged per node and tier.
func (c *Conn) MatchExternalKv(ctx context.Context, hashes []string, countAsHit bool) ([]ExternalKvMatch, error) {
	const op = "MatchExternalKv"
	spans, err := c.hashSpans(op, hashes)
	if err != nil {
		return nil, err
	}
	var out []ExternalKvMatch
	type nodeKey struct{ id, peer string }
	index := map[nodeKey]int{}
	for _, s := range spans {
		resp, err := c.raw.MatchExternalKv(ctx, &umbppb.StandaloneMatchExternalKvRequest{
			Hashes:     hashes[s.Start:s.End],
			CountAsHit: countAsHit,
			ClientId:   c.clientID,
		})
		if err != nil {
			return nil, c.rpcError(ctx, op, err)
		}
		for _, m := range resp.GetMatches() {
			k := nodeKey{m.GetNodeId(), m.GetPeerAddress()}
			i, ok := index[k]
			if !ok {
				i = len(out)
				index[k] = i
				out = append(out, ExternalKvMatch{NodeID: k.id, PeerAddress: k.peer})
			}
			for _, th := range m.GetHashesByTier() {
				out[i].addTier(th.GetTier(), th.GetHashes())
			}
		}
	}
	return out, nil
}

func (m *ExternalKvMatch) addTier(tier umbppb.TierType, hashes []string) {
	for i := range m.HashesByTier {
		if m.HashesByTier[i].Tier == tier {
			m.HashesByTier[i].Hashes = append(m.HashesByTier[i].Hashes, hashes...)
			return
		}
	}
	m.HashesByTier = append(m.HashesByTier, TierHashes{Tier: tier, Hashes: append([]string(nil), hashes...)})
}

// GetExternalKvHitCounts returns the hit counts the server knows for hashes,
// in the server's order.
func (c *Conn) GetExternalKvHitCounts(ctx context.Context, hashes []string) ([]HitCount, error) {
	const op = "GetExternalKvHitCounts"
	spans, err := c.hashSpans(op, hashes)
	if err != nil {
		return nil, err
	}
	var out []HitCount
	for _, s := range spans {
		resp, err := c.raw.GetExternalKvHitCounts(ctx, &umbppb.StandaloneExternalKvHitCountsRequest{
			Hashes:   hashes[s.Start:s.End],
			ClientId: c.clientID,
		})
		if err != nil {
			return nil, c.rpcError(ctx, op, err)
		}
		for _, e := range resp.GetEntries() {
			out = append(out, HitCount{Hash: e.GetHash(), Total: e.GetHitCountTotal()})
		}
	}
	return out, nil
}

// checkKey refuses an empty key and one that is not UTF-8 (a proto3 string
// must be).
func checkKey(op string, i int, key string) error {
	if key == "" {
		return rpc.Invalid(op, "key %d is empty", i)
	}
	if !utf8.ValidString(key) {
		return rpc.Invalid(op, "key %d (%q) is not valid UTF-8", i, key)
	}
	return nil
}

func checkSegment(op string, i int, s Segment) error {
	if p := segmentProblem(s.RegionBase, s.Offset, s.Size); p != "" {
		return rpc.Invalid(op, "entry %d: %s", i, p)
	}
	return nil
}

// segmentProblem says what is wrong with memory named as (base, offset,
// size), or "" when nothing is.
func segmentProblem(base, offset, size uint64) string {
	switch {
	case size == 0:
		return "size is 0"
	case base == 0:
		return "region base is 0"
	case offset > math.MaxUint64-size, base > math.MaxUint64-(offset+size):
		return fmt.Sprintf("offset %d + size %d overflows region %#x", offset, size, base)
	}
	return ""
}

package conn

import (
	"context"
	"unicode/utf8"

	"github.com/umbp-go/umbp-go/internal/rpc"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// The standalone protocol's external-KV calls. A server with a local
// backend accepts reports and revocations (true) and matches nothing; one
// in distributed mode forwards them to the master under the worker's node
// id (the worker_node_id of its RegisterMemory).

// hashSpans checks that the Conn is usable, validates hashes and cuts them
// to fit the message limit beside a client id and a few small fields, and
// at most rpc.MaxHashes to a request (the master's batch limit for hit
// counts, used for every call so that no request the server forwards
// exceeds what the master takes). An empty list is one empty span: the call
// still reaches the server.
func (c *Conn) hashSpans(op string, hashes []string) ([]rpc.Span, error) {
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if len(hashes) == 0 {
		return []rpc.Span{{Start: 0, End: 0}}, nil
	}
	for i, h := range hashes {
		if !utf8.ValidString(h) {
			return nil, rpc.Invalid(op, "hash %d (%q) is not valid UTF-8", i, h)
		}
	}
	fixed := fixedCost(len(c.clientID), 0) + 2*11 // tier or count_as_hit
	k := rpc.Cutter{Op: op, Fixed: fixed, Limit: maxRequestBytes, PartRanges: rpc.MaxHashes}
	return k.Cut(len(hashes), func(i int) rpc.Cost { return rpc.Cost{Wire: rpc.BytesField(len(hashes[i])), Ranges: 1} })
}

// ReportExternalKvBlocks reports hashes held on tier by this client. It
// returns true when the server accepted every one; a refusal with a reason
// is an error wrapping ErrRefused.
func (c *Conn) ReportExternalKvBlocks(ctx context.Context, hashes []string, tier umbppb.TierType) (bool, error) {
	return c.mutateExternal(ctx, "ReportExternalKvBlocks", hashes, tier, c.raw.ReportExternalKvBlocks)
}

// RevokeExternalKvBlocks withdraws hashes reported on tier by this client.
// It returns true when the server accepted every one; a refusal with a
// reason is an error wrapping ErrRefused.
func (c *Conn) RevokeExternalKvBlocks(ctx context.Context, hashes []string, tier umbppb.TierType) (bool, error) {
	return c.mutateExternal(ctx, "RevokeExternalKvBlocks", hashes, tier, c.raw.RevokeExternalKvBlocks)
}

type mutateRPC = func(context.Context, *umbppb.StandaloneExternalKvMutationRequest, ...grpc.CallOption) (*umbppb.BoolResponse, error)

func (c *Conn) mutateExternal(ctx context.Context, op string, hashes []string, tier umbppb.TierType, send mutateRPC) (bool, error) {
	spans, err := c.hashSpans(op, hashes)
	if err != nil {
		return false, err
	}
	for _, s := range spans {
		resp, err := send(ctx, &umbppb.StandaloneExternalKvMutationRequest{
			Hashes:   hashes[s.Start:s.End],
			Tier:     tier,
			ClientId: c.clientID,
		})
		if err != nil {
			return false, c.rpcError(ctx, op, err)
		}
		if ok, err := boolReply(op, resp); !ok {
			return false, err
		}
	}
	return true, nil
}

// RevokeAllExternalKvBlocksAtTier withdraws everything this client reported
// on tier. A refusal with a reason is an error wrapping ErrRefused.
func (c *Conn) RevokeAllExternalKvBlocksAtTier(ctx context.Context, tier umbppb.TierType) (bool, error) {
	const op = "RevokeAllExternalKvBlocksAtTier"
	if err := c.usable(op); err != nil {
		return false, err
	}
	resp, err := c.raw.RevokeAllExternalKvBlocksAtTier(ctx, &umbppb.StandaloneExternalKvTierRequest{
		Tier:     tier,
		ClientId: c.clientID,
	})
	if err != nil {
		return false, c.rpcError(ctx, op, err)
	}
	return boolReply(op, resp)
}

// MatchExternalKvOnce asks in one request, without counting hits, which
// nodes hold hashes; the answer is the server's, unchecked. Hashes that do
// not fit one request (rpc.MaxHashes, the message limit) are refused.
func (c *Conn) MatchExternalKvOnce(ctx context.Context, hashes []string) ([]*umbppb.StandaloneExternalKvMatch, error) {
	const op = "MatchExternalKv"
	spans, err := c.hashSpans(op, hashes)
	if err != nil {
		return nil, err
	}
	if len(spans) > 1 {
		return nil, rpc.Invalid(op, "%d hashes do not fit one request", len(hashes))
	}
	resp, err := c.raw.MatchExternalKv(ctx, &umbppb.StandaloneMatchExternalKvRequest{
		Hashes:   hashes,
		ClientId: c.clientID,
	})
	if err != nil {
		return nil, c.rpcError(ctx, op, err)
	}
	return resp.GetMatches(), nil
}

package conn

import (
	"context"
	"unicode/utf8"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// The standalone protocol's external-KV calls. A server with a local
// backend accepts reports and revocations (true) and matches nothing; one
// in distributed mode forwards them to the master under the worker's node
// id (the worker_node_id of its RegisterMemory).

// ExternalKvBatch is the most hashes one external-KV request carries:
// the master's batch limit for hit counts, used for every call so that no
// request the server forwards exceeds what the master takes.
const ExternalKvBatch = 4096

// hashSpans checks that the Conn is usable, validates hashes and splits
// them to fit the message limit beside a client id and a few small fields,
// and at most ExternalKvBatch to a span. An empty list is one empty span:
// the call still reaches the server.
func (c *Conn) hashSpans(op string, hashes []string) ([]span, error) {
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if len(hashes) == 0 {
		return []span{{0, 0}}, nil
	}
	for i, h := range hashes {
		if !utf8.ValidString(h) {
			return nil, invalid(op, "hash %d (%q) is not valid UTF-8", i, h)
		}
	}
	fixed := fixedCost(len(c.clientID), 0) + 2*11 // tier or count_as_hit
	spans, err := cutter{op: op, fixed: fixed}.cut(len(hashes), func(i int) entryCost { return entryCost{wire: bytesField(len(hashes[i]))} })
	if err != nil {
		return nil, err
	}
	var out []span
	for _, s := range spans {
		for s.end-s.start > ExternalKvBatch {
			out = append(out, span{s.start, s.start + ExternalKvBatch})
			s.start += ExternalKvBatch
		}
		out = append(out, s)
	}
	return out, nil
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

func (c *Conn) mutateExternal(ctx context.Context, op string, hashes []string, tier umbppb.TierType, rpc mutateRPC) (bool, error) {
	spans, err := c.hashSpans(op, hashes)
	if err != nil {
		return false, err
	}
	for _, s := range spans {
		resp, err := rpc(ctx, &umbppb.StandaloneExternalKvMutationRequest{
			Hashes:   hashes[s.start:s.end],
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
// not fit one request (ExternalKvBatch, the message limit) are refused.
func (c *Conn) MatchExternalKvOnce(ctx context.Context, hashes []string) ([]*umbppb.StandaloneExternalKvMatch, error) {
	const op = "MatchExternalKv"
	spans, err := c.hashSpans(op, hashes)
	if err != nil {
		return nil, err
	}
	if len(spans) > 1 {
		return nil, invalid(op, "%d hashes do not fit one request", len(hashes))
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

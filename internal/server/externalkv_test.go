package server

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// The answers are exactly those of MORI's server with a local backend:
// ok=true without an error for the mutations, empty messages for Match and
// hit counts (no entry per hash).
func TestExternalKVAnswersAsMORILocal(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	ctx := ctxT(t)
	ok := &umbppb.BoolResponse{Ok: true}
	for _, mut := range []*umbppb.StandaloneExternalKvMutationRequest{
		{Hashes: []string{"h1", "h2"}, Tier: umbppb.TierType_TIER_HBM, ClientId: "unregistered"},
		{}, // no hashes, no tier, no client: still ok
	} {
		for name, rpc := range map[string]func() (*umbppb.BoolResponse, error){
			"report": func() (*umbppb.BoolResponse, error) { return h.c.ReportExternalKvBlocks(ctx, mut) },
			"revoke": func() (*umbppb.BoolResponse, error) { return h.c.RevokeExternalKvBlocks(ctx, mut) },
			"revoke all": func() (*umbppb.BoolResponse, error) {
				return h.c.RevokeAllExternalKvBlocksAtTier(ctx, &umbppb.StandaloneExternalKvTierRequest{Tier: mut.Tier, ClientId: mut.ClientId})
			},
		} {
			r, err := rpc()
			if err != nil || !proto.Equal(r, ok) {
				t.Errorf("%s(%v) = %v, %v; want ok=true and nothing else", name, mut, r, err)
			}
		}
	}
	mr, err := h.c.MatchExternalKv(ctx, &umbppb.StandaloneMatchExternalKvRequest{Hashes: []string{"h1"}, CountAsHit: true})
	if err != nil || !proto.Equal(mr, &umbppb.StandaloneMatchExternalKvResponse{}) {
		t.Errorf("MatchExternalKv = %v, %v; want an empty answer", mr, err)
	}
	hr, err := h.c.GetExternalKvHitCounts(ctx, &umbppb.StandaloneExternalKvHitCountsRequest{Hashes: []string{"h1", "h2"}})
	if err != nil || !proto.Equal(hr, &umbppb.StandaloneExternalKvHitCountsResponse{}) {
		t.Errorf("GetExternalKvHitCounts = %v, %v; want an empty answer, no entry per hash", hr, err)
	}
}

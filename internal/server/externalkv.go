package server

import (
	"context"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// The external-KV calls, answered as MORI's standalone server answers them
// with a local backend (standalone_server.cpp at MORI 624002c8: each
// handler returns at once when the backend is not distributed): reports
// and revocations are ok=true with no error, whatever they hold and even
// while the server shuts down; MatchExternalKv and GetExternalKvHitCounts
// answer an empty message. This server has no distributed backend.

// ReportExternalKvBlocks is accepted and ignored.
func (v *service) ReportExternalKvBlocks(context.Context, *umbppb.StandaloneExternalKvMutationRequest) (*umbppb.BoolResponse, error) {
	return okReply(), nil
}

// RevokeExternalKvBlocks is accepted and ignored.
func (v *service) RevokeExternalKvBlocks(context.Context, *umbppb.StandaloneExternalKvMutationRequest) (*umbppb.BoolResponse, error) {
	return okReply(), nil
}

// RevokeAllExternalKvBlocksAtTier is accepted and ignored.
func (v *service) RevokeAllExternalKvBlocksAtTier(context.Context, *umbppb.StandaloneExternalKvTierRequest) (*umbppb.BoolResponse, error) {
	return okReply(), nil
}

// MatchExternalKv finds nothing: a local backend knows no external KV.
func (v *service) MatchExternalKv(context.Context, *umbppb.StandaloneMatchExternalKvRequest) (*umbppb.StandaloneMatchExternalKvResponse, error) {
	return &umbppb.StandaloneMatchExternalKvResponse{}, nil
}

// GetExternalKvHitCounts answers no entries.
func (v *service) GetExternalKvHitCounts(context.Context, *umbppb.StandaloneExternalKvHitCountsRequest) (*umbppb.StandaloneExternalKvHitCountsResponse, error) {
	return &umbppb.StandaloneExternalKvHitCountsResponse{}, nil
}

package umbp_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp"
)

// hostileMaster answers whatever the fuzzer chose.
type hostileMaster struct {
	umbppb.UnimplementedUMBPMasterServer
	lookup atomic.Pointer[umbppb.BatchLookupResponse]
	match  atomic.Pointer[umbppb.MatchExternalKvResponse]
}

func (m *hostileMaster) BatchLookup(_ context.Context, req *umbppb.BatchLookupRequest) (*umbppb.BatchLookupResponse, error) {
	if len(req.GetKeys()) == 0 { // the attach probe
		return &umbppb.BatchLookupResponse{}, nil
	}
	if r := m.lookup.Load(); r != nil {
		return r, nil
	}
	return &umbppb.BatchLookupResponse{}, nil
}

func (m *hostileMaster) MatchExternalKv(context.Context, *umbppb.MatchExternalKvRequest) (*umbppb.MatchExternalKvResponse, error) {
	if r := m.match.Load(); r != nil {
		return r, nil
	}
	return &umbppb.MatchExternalKvResponse{}, nil
}

// FuzzHostileMaster: whatever the master answers, a scheduler handle
// answers one result per key, one score per candidate, prefixes within the
// request, and never panics.
func FuzzHostileMaster(f *testing.F) {
	good, _ := proto.Marshal(&umbppb.MatchExternalKvResponse{Matches: []*umbppb.ExternalKvNodeMatch{{
		NodeId: "n1", PeerAddress: "p", HashesByTier: []*umbppb.TierHashes{{Tier: umbppb.TierType_TIER_HBM, Hashes: []string{"a", "b"}}},
	}}})
	found, _ := proto.Marshal(&umbppb.BatchLookupResponse{Found: []bool{true, true, false}})
	f.Add(good, found)
	f.Add([]byte{}, []byte{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	m := &hostileMaster{}
	srv := grpc.NewServer()
	umbppb.RegisterUMBPMasterServer(srv, m)
	go srv.Serve(lis)
	defer srv.Stop()
	h := newClusterHandle(f, clusterConfig(f, lis.Addr().String()))
	keys := []string{"a", "b", "c"}
	cands := []string{"n1", "n2"}
	f.Fuzz(func(t *testing.T, matchBytes, lookupBytes []byte) {
		var mr umbppb.MatchExternalKvResponse
		var lr umbppb.BatchLookupResponse
		if proto.Unmarshal(matchBytes, &mr) != nil || proto.Unmarshal(lookupBytes, &lr) != nil {
			return
		}
		m.match.Store(&mr)
		m.lookup.Store(&lr)
		ctx := context.Background()
		if got := h.Lookup(ctx, keys); len(got) != len(keys) {
			t.Fatalf("Lookup answered %d results for %d keys", len(got), len(keys))
		}
		if n := h.LookupPrefix(ctx, keys); n < 0 || n > len(keys) {
			t.Fatalf("LookupPrefix = %d", n)
		}
		for _, c := range [][]string{cands, nil} {
			s, err := h.Score(ctx, umbp.ScoreRequest{Candidates: c, BlockHashes: keys})
			if err != nil {
				t.Fatal(err)
			}
			if c != nil && len(s.Nodes) != len(c) {
				t.Fatalf("%d scores for %d candidates", len(s.Nodes), len(c))
			}
			if s.PoolPrefix < 0 || s.PoolPrefix > len(keys) || s.Best >= len(s.Nodes) {
				t.Fatalf("scores %+v", s)
			}
			for _, n := range s.Nodes {
				if n.Prefix < 0 || n.Prefix > len(keys) || n.HBM+n.DRAM+n.SSD != n.Prefix || n.Held > len(keys) {
					t.Fatalf("node score %+v for %d blocks", n, len(keys))
				}
			}
		}
	})
}

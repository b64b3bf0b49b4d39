package masterconn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	hbm  = umbppb.TierType_TIER_HBM
	dram = umbppb.TierType_TIER_DRAM
	ssd  = umbppb.TierType_TIER_SSD
)

func node(id string, tiers ...any) *umbppb.ExternalKvNodeMatch {
	m := &umbppb.ExternalKvNodeMatch{NodeId: id, PeerAddress: id + ":1"}
	for i := 0; i < len(tiers); i += 2 {
		m.HashesByTier = append(m.HashesByTier, &umbppb.TierHashes{Tier: tiers[i].(umbppb.TierType), Hashes: tiers[i+1].([]string)})
	}
	return m
}

func TestCheckMatchPrefixByFastestTier(t *testing.T) {
	hashes := []string{"a", "b", "c", "d", "e"}
	got, err := masterconn.CheckMatch(hashes, []*umbppb.ExternalKvNodeMatch{
		// b on DRAM and HBM counts as HBM; d held but after the gap at c.
		node("n1", dram, []string{"a", "b", "d"}, hbm, []string{"b"}),
		node("n2", ssd, []string{"e"}),
		node("n3", hbm, []string{"a", "b", "c", "d", "e"}),
	}, 16)
	if err != nil {
		t.Fatal(err)
	}
	want := []masterconn.NodeMatch{
		{NodeID: "n1", PeerAddress: "n1:1", Prefix: 2, PrefixByTier: [4]int{0, 1, 1, 0}, Held: 3},
		{NodeID: "n2", PeerAddress: "n2:1", Prefix: 0, Held: 1},
		{NodeID: "n3", PeerAddress: "n3:1", Prefix: 5, PrefixByTier: [4]int{0, 5, 0, 0}, Held: 5},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("node %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestCheckMatchRepeatedHashInRequest(t *testing.T) {
	got, err := masterconn.CheckMatch([]string{"a", "a", "b"}, []*umbppb.ExternalKvNodeMatch{node("n", hbm, []string{"a", "a"})}, 4)
	if err != nil || got[0].Prefix != 2 || got[0].Held != 2 {
		t.Fatalf("got %+v, %v; want prefix 2", got, err)
	}
}

func TestCheckMatchRefusesBadAnswers(t *testing.T) {
	hashes := []string{"a", "b"}
	for name, matches := range map[string][]*umbppb.ExternalKvNodeMatch{
		"too many nodes":    {node("1"), node("2"), node("3")},
		"duplicate node":    {node("n", hbm, []string{"a"}), node("n", dram, []string{"b"})},
		"empty node id":     {node("", hbm, []string{"a"})},
		"unknown tier":      {node("n", umbppb.TierType_TIER_UNKNOWN, []string{"a"})},
		"tier out of range": {node("n", umbppb.TierType(9), []string{"a"})},
		"hash not asked":    {node("n", hbm, []string{"a", "z"})},
		"too many hashes":   {node("n", hbm, []string{"a", "b", "a"})},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := masterconn.CheckMatch(hashes, matches, 2)
			if !errors.Is(err, masterconn.ErrBadReply) || got != nil {
				t.Fatalf("CheckMatch = %+v, %v; want ErrBadReply", got, err)
			}
		})
	}
}

func TestCheckAddress(t *testing.T) {
	for _, tc := range []struct {
		addr             string
		plaintext, allow bool
		ok               bool
	}{
		{"127.0.0.1:1", true, false, true},
		{"[::1]:1", true, false, true},
		{"localhost:1", true, false, true},
		{"10.0.0.1:1", true, false, false},
		{"master.example:1", true, false, false},
		{"10.0.0.1:1", true, true, true},
		{"10.0.0.1:1", false, false, true},
		{"10.0.0.1", false, false, false},
		{":1", true, true, false},
	} {
		err := masterconn.CheckAddress(tc.addr, tc.plaintext, tc.allow)
		if (err == nil) != tc.ok {
			t.Errorf("CheckAddress(%q, plaintext %v, allow %v) = %v", tc.addr, tc.plaintext, tc.allow, err)
		}
		if err != nil && tc.plaintext && !tc.allow && tc.ok == false && tc.addr != "10.0.0.1" && tc.addr != ":1" && !errors.Is(err, masterconn.ErrPlaintext) {
			t.Errorf("CheckAddress(%q) = %v; want ErrPlaintext", tc.addr, err)
		}
	}
}

func TestConnAgainstDouble(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	c, err := masterconn.New(masterconn.Options{Address: m.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw := c.Raw()
	if _, err := raw.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n1", PeerAddress: "p1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n1", IsFullSync: true, Bundles: []*umbppb.EventBundle{{
		Events: []*umbppb.KvEvent{{Key: "k1", Tier: dram, Size: 1}},
	}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n1", Hashes: []string{"h1", "h2"}, Tier: hbm}); err != nil {
		t.Fatal(err)
	}
	if err := c.Probe(ctx, true); err != nil {
		t.Fatal(err)
	}
	found, err := c.BatchLookup(ctx, []string{"k1", "k2"})
	if err != nil || len(found) != 2 || !found[0] || found[1] {
		t.Fatalf("BatchLookup = %v, %v", found, err)
	}
	nm, err := c.MatchExternalKv(ctx, []string{"h1", "h2", "h3"})
	if err != nil || len(nm) != 1 || nm[0].Prefix != 2 || nm[0].PeerAddress != "p1" {
		t.Fatalf("MatchExternalKv = %+v, %v", nm, err)
	}
	if _, err := c.BatchLookup(ctx, []string{""}); !errors.Is(err, masterconn.ErrInvalidArgument) {
		t.Fatalf("BatchLookup of an empty key = %v", err)
	}
	m.Kill()
	if _, err := c.BatchLookup(ctx, []string{"k1"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("BatchLookup of a killed master = %v; want ErrUnavailable", err)
	}
}

func TestPlaintextRefusedBeforeDial(t *testing.T) {
	_, err := masterconn.New(masterconn.Options{Address: "192.0.2.1:50051"})
	if !errors.Is(err, masterconn.ErrPlaintext) {
		t.Fatalf("New = %v; want ErrPlaintext", err)
	}
}

// FuzzCheckMatch feeds arbitrary answers: CheckMatch never panics, and
// what it accepts is consistent with the request.
func FuzzCheckMatch(f *testing.F) {
	seed, _ := proto.Marshal(&umbppb.MatchExternalKvResponse{Matches: []*umbppb.ExternalKvNodeMatch{
		node("n1", hbm, []string{"a", "b"}, dram, []string{"c"}), node("n2", ssd, []string{"x"}),
	}})
	f.Add(seed, "a,b,c")
	f.Add([]byte{}, "")
	f.Fuzz(func(t *testing.T, answer []byte, req string) {
		var resp umbppb.MatchExternalKvResponse
		if proto.Unmarshal(answer, &resp) != nil {
			return
		}
		var hashes []string
		start := 0
		for i := 0; i <= len(req); i++ {
			if i == len(req) || req[i] == ',' {
				hashes = append(hashes, req[start:i])
				start = i + 1
			}
		}
		got, err := masterconn.CheckMatch(hashes, resp.GetMatches(), 8)
		if err != nil {
			if !errors.Is(err, masterconn.ErrBadReply) {
				t.Fatalf("error %v does not wrap ErrBadReply", err)
			}
			return
		}
		if len(got) != len(resp.GetMatches()) {
			t.Fatalf("%d nodes from %d", len(got), len(resp.GetMatches()))
		}
		ids := map[string]bool{}
		for _, n := range got {
			sum := 0
			for _, c := range n.PrefixByTier {
				sum += c
			}
			if n.PrefixByTier[0] != 0 || sum != n.Prefix || n.Prefix > n.Held || n.Held > len(hashes) || ids[n.NodeID] {
				t.Fatalf("inconsistent %+v for %d hashes", n, len(hashes))
			}
			ids[n.NodeID] = true
		}
	})
}

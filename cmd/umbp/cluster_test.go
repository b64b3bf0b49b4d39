package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// clusterMaster is a test master with node n1 holding keys k1, k2 in the
// pool and hashes h0, h1 (HBM, DRAM) in the external KV index, and n2
// holding h0 on SSD.
func clusterMaster(t *testing.T) *umbptest.Master {
	t.Helper()
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	cc, err := grpc.NewClient("passthrough:///"+m.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := umbppb.NewUMBPMasterClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range []string{"n1", "n2"} {
		if _, err := c.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: id, PeerAddress: id + ":9"}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	steps := []func() error{
		func() error {
			_, err := c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n1", IsFullSync: true, Bundles: []*umbppb.EventBundle{{Events: []*umbppb.KvEvent{
				{Key: "k1", Tier: umbppb.TierType_TIER_DRAM, Size: 1}, {Key: "k2", Tier: umbppb.TierType_TIER_DRAM, Size: 1},
			}}}})
			return err
		},
		func() error {
			_, err := c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n1", Hashes: []string{"h0"}, Tier: umbppb.TierType_TIER_HBM})
			return err
		},
		func() error {
			_, err := c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n1", Hashes: []string{"h1"}, Tier: umbppb.TierType_TIER_DRAM})
			return err
		},
		func() error {
			_, err := c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n2", Hashes: []string{"h0"}, Tier: umbppb.TierType_TIER_SSD})
			return err
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func TestClusterCommand(t *testing.T) {
	m := clusterMaster(t)
	out, _ := mustRun(t, 0, "", "cluster", "lookup", "-master", m.Addr(), "k1", "x", "k2")
	mustContain(t, "cluster lookup", out, "held  k1", "-     x", "2 of 3 keys held, the leading 1")

	out, _ = mustRun(t, 0, "", "cluster", "match", "-master", m.Addr(), "-json", "h0", "h1")
	var ans scoreAnswer
	if err := json.Unmarshal([]byte(out), &ans); err != nil {
		t.Fatal(err)
	}
	if len(ans.Nodes) != 2 || ans.Nodes[0].Node != "n1" || ans.Nodes[0].Prefix != 2 || ans.Nodes[0].HBM != 1 || ans.Nodes[0].DRAM != 1 ||
		ans.Nodes[1].Node != "n2" || ans.Nodes[1].SSD != 1 || ans.Best != "n1" {
		t.Errorf("cluster match = %+v", ans)
	}

	out, _ = mustRun(t, 0, "", "cluster", "score", "-master", m.Addr(), "-nodes", "n2,ghost", "-w-ssd", "3", "h0", "h1")
	mustContain(t, "cluster score", out, "best n2")

	_, errOut := mustRun(t, 2, "", "cluster", "lookup", "-master", "192.0.2.1:5", "k")
	mustContain(t, "plaintext refusal", errOut, "plaintext", "192.0.2.1:5")
	_, errOut = mustRun(t, 2, "", "cluster", "score", "-master", m.Addr(), "h0")
	mustContain(t, "score without -nodes", errOut, "-nodes is required")
	t.Setenv("UMBP_MASTER_ADDRESS", "")
	_, errOut = mustRun(t, 2, "", "cluster", "lookup", "k")
	mustContain(t, "no master", errOut, "-master")
	if m.Calls("RouteGet")+m.Calls("BatchRouteGet") != 0 {
		t.Error("the command called RouteGet")
	}
}

func TestClusterCommandStalledMaster(t *testing.T) {
	m := clusterMaster(t)
	m.Stall("BatchLookup")
	defer m.Resume()
	// Attaching probes with BatchLookup: a stalled master fails the
	// command within -timeout.
	_, errOut := mustRun(t, 1, "", "cluster", "lookup", "-master", m.Addr(), "-timeout", "100ms", "k1")
	mustContain(t, "stalled master", errOut, "deadline exceeded")
}

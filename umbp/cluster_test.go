package umbp_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

// fakeNode is a node of the test master: registered, its keys sent in one
// full sync, its external KV reported.
type fakeNode struct {
	id  string
	raw umbppb.UMBPMasterClient
}

func dialMaster(t testing.TB, addr string) umbppb.UMBPMasterClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return umbppb.NewUMBPMasterClient(cc)
}

func newFakeNode(t testing.TB, raw umbppb.UMBPMasterClient, id string, keys []string) *fakeNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := raw.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: id, PeerAddress: id + ":7000"}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{id: id, raw: raw}
	n.sync(t, keys)
	return n
}

func (n *fakeNode) sync(t testing.TB, keys []string) {
	t.Helper()
	ev := make([]*umbppb.KvEvent, len(keys))
	for i, k := range keys {
		ev[i] = &umbppb.KvEvent{Key: k, Tier: umbppb.TierType_TIER_DRAM, Size: 1}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.raw.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: n.id, IsFullSync: true, Bundles: []*umbppb.EventBundle{{Events: ev}}}); err != nil {
		t.Fatal(err)
	}
}

func (n *fakeNode) report(t testing.TB, tier umbppb.TierType, hashes ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.raw.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: n.id, Hashes: hashes, Tier: tier}); err != nil {
		t.Fatal(err)
	}
}

func clusterConfig(t testing.TB, addr string) umbp.ClusterConfig {
	return umbp.ClusterConfig{
		Masters:        []string{addr},
		Timeout:        2 * time.Second,
		LookupTimeout:  200 * time.Millisecond,
		StartupTimeout: 5 * time.Second,
		Logger:         testLogger(t),
		GRPCLookups:    grpcLookups,
	}
}

func newClusterHandle(t testing.TB, cfg umbp.ClusterConfig) *umbp.SchedulerHandle {
	t.Helper()
	rt, err := umbp.NewClusterRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	})
	return h
}

func TestClusterLookups(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	raw := dialMaster(t, m.Addr())
	newFakeNode(t, raw, "n1", []string{"a", "b"})
	newFakeNode(t, raw, "n2", []string{"c"})
	h := newClusterHandle(t, clusterConfig(t, m.Addr()))
	ctx := context.Background()

	if got := h.Lookup(ctx, []string{"a", "x", "c", "", "b"}); !equalBools(got, true, false, true, false, true) {
		t.Errorf("Lookup = %v", got)
	}
	if got := h.LookupPrefix(ctx, []string{"a", "b", "c", "x", "a"}); got != 3 {
		t.Errorf("LookupPrefix = %d, want 3 (across nodes)", got)
	}
	if got := h.Lookup(ctx, nil); len(got) != 0 {
		t.Errorf("Lookup(nil) = %v", got)
	}
	s := h.Stats()
	if s.State != umbp.StateConnected || s.Capabilities.Mode != umbp.MasterMode || !s.Capabilities.Ready || s.Lookups.Calls != 2 || s.Lookups.Hits != 6 || s.Lookups.Misses != 4 {
		t.Errorf("Stats = %+v", s)
	}
	caps, err := h.Ping(ctx)
	if err != nil || caps.Mode != umbp.MasterMode {
		t.Errorf("Ping = %+v, %v", caps, err)
	}
	err = h.Clear(ctx)
	if !errors.Is(err, umbp.ErrNotSupported) || !strings.HasPrefix(err.Error(), "umbp: ") || strings.Count(err.Error(), m.Addr()) != 1 {
		t.Errorf("Clear = %v; want a refusal naming the master once", err)
	}
	if m.Calls("RouteGet")+m.Calls("BatchRouteGet") != 0 {
		t.Error("the handle probed with RouteGet")
	}
}

func equalBools(got []bool, want ...bool) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// A stalled master (SIGSTOP) is a miss within LookupTimeout; calls after
// it answer at once without asking until the stalled one returns.
func TestClusterStalledMasterMissesThenFailsFast(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	newFakeNode(t, dialMaster(t, m.Addr()), "n1", []string{"a"})
	cfg := clusterConfig(t, m.Addr())
	cfg.LookupTimeout = 50 * time.Millisecond
	h := newClusterHandle(t, cfg)
	ctx := context.Background()
	if !h.Lookup(ctx, []string{"a"})[0] {
		t.Fatal("no hit before the stall")
	}
	before := m.Calls("BatchLookup")
	m.Stall()
	start := time.Now()
	if h.Lookup(ctx, []string{"a"})[0] {
		t.Fatal("hit from a stalled master")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("stalled lookup took %v", d)
	}
	if h.Stats().Lookups.Timeouts != 1 {
		t.Errorf("Timeouts = %d, want 1", h.Stats().Lookups.Timeouts)
	}
	// The call that overran was ended, and left in flight a probe (a
	// lookup of no key) and a check of the store (a lookup of one key),
	// which the master sees.
	want := before + 3
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second) // does not hang
	defer cancel()
	if err := m.WaitCalls(wctx, "BatchLookup", want); err != nil {
		t.Fatalf("no probe reached the master: %v", err)
	}
	for range 10 {
		if h.LookupPrefix(ctx, []string{"a"}) != 0 || h.Lookup(ctx, []string{"a"})[0] {
			t.Fatal("hit while a call is stuck")
		}
	}
	if got := m.Calls("BatchLookup"); got != want {
		t.Fatalf("master saw %d lookups during the stall, want %d: later calls must fail fast", got-before, want-before)
	}
	if h.Stats().Lookups.Timeouts != 1 {
		t.Errorf("fail-fast calls counted as timeouts: %d", h.Stats().Lookups.Timeouts)
	}
	m.Resume()
	waitFor(t, "a hit after the master resumed", func() bool { return h.Lookup(ctx, []string{"a"})[0] })
}

// Killed and restarted on the same address, the master is found again by
// the same handle; meanwhile lookups answer misses at once.
func TestClusterMasterKilledAndRestarted(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	raw := dialMaster(t, m.Addr())
	newFakeNode(t, raw, "n1", []string{"a"})
	h := newClusterHandle(t, clusterConfig(t, m.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.Kill()
	if !h.WaitForStateChange(ctx, umbp.StateConnected) || h.State() != umbp.StateReconnecting {
		t.Fatalf("state after kill = %v", h.State())
	}
	start := time.Now()
	if h.Lookup(ctx, []string{"a"})[0] {
		t.Fatal("hit from a killed master")
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("lookup while reconnecting took %v; want at once", d)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	for h.State() != umbp.StateConnected {
		if !h.WaitForStateChange(ctx, h.State()) {
			t.Fatal("never reconnected")
		}
	}
	if h.Lookup(ctx, []string{"a"})[0] {
		t.Fatal("hit from an empty restarted master")
	}
	newFakeNode(t, dialMaster(t, m.Addr()), "n1", []string{"a"}) // the node registers again
	if !h.Lookup(ctx, []string{"a"})[0] {
		t.Fatal("no hit after the node re-registered")
	}
	if s := h.Stats(); s.Reconnects != 1 {
		t.Errorf("Reconnects = %d, want 1", s.Reconnects)
	}
}

// Close returns at once with a call stuck at the master, and leaks
// nothing (TestMain checks goroutines).
func TestClusterCloseWhileStalled(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	cfg := clusterConfig(t, m.Addr())
	cfg.LookupTimeout = 20 * time.Millisecond
	cfg.Timeout = time.Minute
	rt, err := umbp.NewClusterRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m.Stall("BatchLookup")
	h.Lookup(context.Background(), []string{"a"})
	start := time.Now()
	if err := h.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	if h.State() != umbp.StateClosed || h.Lookup(context.Background(), []string{"a"})[0] {
		t.Error("handle not closed")
	}
	m.Resume()
}

func TestClusterStartupTimeoutOnStalledMaster(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	m.Stall()
	cfg := clusterConfig(t, m.Addr())
	cfg.StartupTimeout = 50 * time.Millisecond
	rt, err := umbp.NewClusterRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = rt.NewSchedulerHandle(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) || strings.Count(err.Error(), m.Addr()) != 1 {
		t.Fatalf("NewSchedulerHandle on a stalled master = %v", err)
	}
	m.Resume()
}

func TestClusterPlaintextOnlyToLoopback(t *testing.T) {
	_, err := umbp.NewClusterRuntime(umbp.ClusterConfig{Masters: []string{"10.1.2.3:50051"}})
	if !errors.Is(err, umbp.ErrInvalidConfig) || !strings.Contains(err.Error(), "plaintext") || !strings.Contains(err.Error(), "10.1.2.3:50051") {
		t.Fatalf("NewClusterRuntime(plaintext, remote) = %v", err)
	}
	for _, cfg := range []umbp.ClusterConfig{
		{Masters: []string{"10.1.2.3:50051"}, AllowPlaintext: true},
		{Masters: []string{"127.0.0.1:50051"}},
		{Masters: []string{"[::1]:50051"}},
	} {
		if _, err := umbp.NewClusterRuntime(cfg); err != nil {
			t.Errorf("NewClusterRuntime(%+v) = %v", cfg, err)
		}
	}
}

func TestClusterScore(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	raw := dialMaster(t, m.Addr())
	n1 := newFakeNode(t, raw, "n1", []string{"b0", "b1", "b2"})
	n2 := newFakeNode(t, raw, "n2", nil)
	n3 := newFakeNode(t, raw, "n3", nil)
	n1.report(t, umbppb.TierType_TIER_DRAM, "b0", "b1", "b2")
	n1.report(t, umbppb.TierType_TIER_HBM, "b0")
	n2.report(t, umbppb.TierType_TIER_HBM, "b0", "b1")
	n3.report(t, umbppb.TierType_TIER_SSD, "b1", "b2", "b3") // no b0: prefix 0
	h := newClusterHandle(t, clusterConfig(t, m.Addr()))
	ctx := context.Background()
	req := umbp.ScoreRequest{
		Candidates:  []string{"n3", "n2", "n1", "ghost"},
		BlockHashes: []string{"b0", "b1", "b2", "b3"},
		Weights:     umbp.TierWeights{HBM: 1, DRAM: 0.5, SSD: 0.25},
	}
	s, err := h.Score(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Complete || s.PoolPrefix != 3 {
		t.Errorf("Complete %v PoolPrefix %d, want true 3", s.Complete, s.PoolPrefix)
	}
	want := []struct {
		prefix, hbm, dram, ssd int
		score                  float64
	}{{0, 0, 0, 0, 0}, {2, 2, 0, 0, 2}, {3, 1, 2, 0, 2}, {0, 0, 0, 0, 0}}
	for i, w := range want {
		n := s.Nodes[i]
		if n.Node != req.Candidates[i] || n.Prefix != w.prefix || n.HBM != w.hbm || n.DRAM != w.dram || n.SSD != w.ssd || n.Score != w.score {
			t.Errorf("node %d = %+v, want %+v", i, n, w)
		}
	}
	if s.Best != 1 { // n2 and n1 tie at 2: the first wins
		t.Errorf("Best = %d, want 1", s.Best)
	}
	if m.Calls("MatchExternalKv") != 1 || m.Calls("BatchLookup") != 2 { // one for the handle's attach
		t.Errorf("calls: %d matches, %d lookups", m.Calls("MatchExternalKv"), m.Calls("BatchLookup"))
	}
	// Scoring counts no hits: the index's hit counts stay as they were.
	if hc, err := raw.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: req.BlockHashes}); err != nil || len(hc.GetEntries()) != 0 {
		t.Errorf("hit counts after scoring = %v, %v; want none", hc, err)
	}
	// A node that unregisters drops out of the scores.
	if _, err := raw.UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: "n2"}); err != nil {
		t.Fatal(err)
	}
	s, _ = h.Score(ctx, req)
	if s.Nodes[1].Prefix != 0 || s.Best != 2 {
		t.Errorf("after n2 left: %+v, best %d", s.Nodes[1], s.Best)
	}
	// Quarantined keys end the prefix.
	h.QuarantineKeys([]string{"b1"})
	s, _ = h.Score(ctx, req)
	if s.Nodes[2].Prefix != 1 || s.PoolPrefix != 1 {
		t.Errorf("with b1 quarantined: %+v, pool prefix %d", s.Nodes[2], s.PoolPrefix)
	}
	if got := h.Lookup(ctx, []string{"b0", "b1"}); !equalBools(got, true, false) {
		t.Errorf("Lookup with b1 quarantined = %v", got)
	}
	if _, err := h.Score(ctx, umbp.ScoreRequest{Candidates: []string{"n1", "n1"}}); !errors.Is(err, umbp.ErrInvalidKey) {
		t.Errorf("Score with a candidate twice = %v", err)
	}
}

// badMaster answers MatchExternalKv with a hash nobody asked for.
type badMaster struct {
	umbppb.UnimplementedUMBPMasterServer
}

func (badMaster) BatchLookup(_ context.Context, req *umbppb.BatchLookupRequest) (*umbppb.BatchLookupResponse, error) {
	return &umbppb.BatchLookupResponse{Found: make([]bool, len(req.GetKeys())+1)}, nil // one too many
}

func (badMaster) MatchExternalKv(context.Context, *umbppb.MatchExternalKvRequest) (*umbppb.MatchExternalKvResponse, error) {
	return &umbppb.MatchExternalKvResponse{Matches: []*umbppb.ExternalKvNodeMatch{{
		NodeId: "n1", PeerAddress: "p", HashesByTier: []*umbppb.TierHashes{{Tier: umbppb.TierType_TIER_HBM, Hashes: []string{"b0", "forged"}}},
	}}}, nil
}

func TestClusterBadAnswersAreMisses(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	umbppb.RegisterUMBPMasterServer(srv, badMaster{})
	go srv.Serve(lis)
	defer srv.Stop()
	h := newClusterHandle(t, clusterConfig(t, lis.Addr().String()))
	ctx := context.Background()
	s, err := h.Score(ctx, umbp.ScoreRequest{Candidates: []string{"n1"}, BlockHashes: []string{"b0"}})
	if err != nil || s.Complete || s.Nodes[0].Prefix != 0 || s.Best != -1 || s.PoolPrefix != 0 {
		t.Errorf("Score from a forging master = %+v, %v; want nothing", s, err)
	}
	if got := h.Lookup(ctx, []string{"a"}); got[0] {
		t.Error("hit from a bad BatchLookup answer")
	}
	if h.Stats().Lookups.Failures == 0 {
		t.Error("bad answers not counted as failures")
	}
}

func TestClusterScoreEveryNode(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	raw := dialMaster(t, m.Addr())
	newFakeNode(t, raw, "z", nil).report(t, umbppb.TierType_TIER_HBM, "b0")
	newFakeNode(t, raw, "a", nil).report(t, umbppb.TierType_TIER_DRAM, "b0", "b1")
	newFakeNode(t, raw, "m", nil)
	h := newClusterHandle(t, clusterConfig(t, m.Addr()))
	s, err := h.Score(context.Background(), umbp.ScoreRequest{BlockHashes: []string{"b0", "b1"}})
	if err != nil || len(s.Nodes) != 2 || s.Nodes[0].Node != "a" || s.Nodes[0].Prefix != 2 || s.Nodes[1].Node != "z" || s.Best != 0 {
		t.Fatalf("Score without candidates = %+v, %v", s, err)
	}
}

// Errors of the cluster API read "umbp:" once and name the master once
// where it was asked.
func TestClusterErrorsSayItOnce(t *testing.T) {
	once := func(what string, err error, addr string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", what)
			return
		}
		if n := strings.Count(err.Error(), "umbp:"); n != 1 {
			t.Errorf("%s says umbp: %d times: %v", what, n, err)
		}
		if addr != "" && strings.Count(err.Error(), addr) != 1 {
			t.Errorf("%s names %s %d times: %v", what, addr, strings.Count(err.Error(), addr), err)
		}
	}
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	h := newClusterHandle(t, clusterConfig(t, m.Addr()))
	ctx := context.Background()
	once("clear", h.Clear(ctx), m.Addr())
	_, err := h.Score(ctx, umbp.ScoreRequest{Candidates: []string{""}})
	once("score", err, "")
	_, err = umbp.NewClusterRuntime(umbp.ClusterConfig{Masters: []string{"10.9.9.9:1"}})
	once("plaintext config", err, "10.9.9.9:1")
	m.Stall()
	cfg := clusterConfig(t, m.Addr())
	cfg.StartupTimeout = 50 * time.Millisecond
	rt, _ := umbp.NewClusterRuntime(cfg)
	_, err = rt.NewSchedulerHandle(ctx)
	once("attach to a stalled master", err, m.Addr())
	m.Resume()

	srv := newServer(t, umbptest.Options{})
	w := newWorker(t, newRuntime(t, testConfig(t, srv.Endpoint())))
	once("bad tier", w.ReportExternalKv(ctx, umbp.Tier(0), []string{"h"}), "")
	srv.FailNext("RevokeExternalKvBlocks", 1)
	once("failed revoke", w.RevokeExternalKv(ctx, umbp.TierSSD, []string{"h"}), strings.TrimPrefix(srv.Endpoint(), "unix://"))
}

// bigMaster answers every lookup with a reply far larger than asked.
type bigMaster struct {
	umbppb.UnimplementedUMBPMasterServer
}

func (bigMaster) BatchLookup(_ context.Context, req *umbppb.BatchLookupRequest) (*umbppb.BatchLookupResponse, error) {
	if len(req.GetKeys()) == 0 {
		return &umbppb.BatchLookupResponse{}, nil
	}
	return &umbppb.BatchLookupResponse{Found: make([]bool, 1<<20)}, nil
}

// An answer over MaxReplyBytes is refused by the transport: a miss.
func TestClusterReplyBound(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	umbppb.RegisterUMBPMasterServer(srv, bigMaster{})
	go srv.Serve(lis)
	defer srv.Stop()
	cfg := clusterConfig(t, lis.Addr().String())
	cfg.MaxReplyBytes = 4096
	// A megabyte's answer made and refused within the bound on a busy
	// machine: the refusal, not the bound, is what is tested.
	cfg.LookupTimeout, cfg.Timeout = 10*time.Second, 10*time.Second
	h := newClusterHandle(t, cfg)
	if got := h.Lookup(context.Background(), []string{"a"}); len(got) != 1 || got[0] {
		t.Fatalf("Lookup = %v; want one miss", got)
	}
	if h.Stats().Lookups.Failures != 1 || h.State() != umbp.StateConnected {
		t.Errorf("stats %+v", h.Stats())
	}
}

func TestClusterLookupTokens(t *testing.T) {
	hasher, err := vllmhash.NewHasher(vllmhash.SHA256, "0")
	if err != nil {
		t.Fatal(err)
	}
	keyer, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{Namespace: "ns", Groups: []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}}, Hasher: hasher})
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int32, 64)
	for i := range prompt {
		prompt[i] = int32(i)
	}
	keys, err := keyer.Keys(prompt, vllmhash.ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	raw := dialMaster(t, m.Addr())
	newFakeNode(t, raw, "n1", keys.Keys[:1])
	newFakeNode(t, raw, "n2", keys.Keys[1:3]) // blocks 0-2 across two nodes
	h := newClusterHandle(t, clusterConfig(t, m.Addr()))
	if n := h.LookupTokens(context.Background(), keys); n != 48 {
		t.Fatalf("LookupTokens = %d; want 48", n)
	}
	s, err := h.Score(context.Background(), umbp.ScoreRequest{Candidates: []string{"n1"}, Prompt: keys})
	if err != nil || s.PoolTokens != 48 || s.Nodes[0].Tokens != 0 {
		t.Fatalf("Score of a prompt = %+v, %v", s, err)
	}
	if _, err := h.Score(context.Background(), umbp.ScoreRequest{Prompt: keys, BlockHashes: keys.Keys}); !errors.Is(err, umbp.ErrInvalidKey) {
		t.Fatalf("Score of a prompt and hashes both = %v, want ErrInvalidKey", err)
	}
}

// deadlineMaster records whether each call it answers came with a
// deadline (a grpc-timeout header).
type deadlineMaster struct {
	umbppb.UnimplementedUMBPMasterServer
	mu        sync.Mutex
	deadlines map[string]int // calls with one, by method
	calls     map[string]int
}

func (m *deadlineMaster) saw(ctx context.Context, method string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[method]++
	if _, ok := ctx.Deadline(); ok {
		m.deadlines[method]++
	}
}

func (m *deadlineMaster) BatchLookup(ctx context.Context, req *umbppb.BatchLookupRequest) (*umbppb.BatchLookupResponse, error) {
	m.saw(ctx, "BatchLookup")
	return &umbppb.BatchLookupResponse{Found: make([]bool, len(req.GetKeys()))}, nil
}

func (m *deadlineMaster) MatchExternalKv(ctx context.Context, req *umbppb.MatchExternalKvRequest) (*umbppb.MatchExternalKvResponse, error) {
	m.saw(ctx, "MatchExternalKv")
	return &umbppb.MatchExternalKvResponse{}, nil
}

// A lookup or Score on the master carries no deadline to it: the caller's
// LookupTimeout bounds the call on this side, and a deadline would cost a
// timer on both sides of every call.
func TestClusterCallsCarryNoDeadline(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &deadlineMaster{deadlines: map[string]int{}, calls: map[string]int{}}
	srv := grpc.NewServer()
	umbppb.RegisterUMBPMasterServer(srv, m)
	go srv.Serve(lis)
	defer srv.Stop()
	h := newClusterHandle(t, clusterConfig(t, lis.Addr().String()))
	ctx := context.Background()
	m.mu.Lock()
	m.deadlines, m.calls = map[string]int{}, map[string]int{} // what attaching asked is its own
	m.mu.Unlock()
	for range 3 {
		h.Lookup(ctx, []string{"a", "b"})
		if _, err := h.Score(ctx, umbp.ScoreRequest{Candidates: []string{"n1"}, BlockHashes: []string{"b0"}}); err != nil {
			t.Fatal(err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.calls["BatchLookup"] < 6 || m.calls["MatchExternalKv"] < 3 {
		t.Fatalf("calls %v: want 6 lookups (3 and Score's 3) and 3 matches at least", m.calls)
	}
	if m.deadlines["BatchLookup"] != 0 || m.deadlines["MatchExternalKv"] != 0 {
		t.Errorf("calls with a deadline %v of %v: want none", m.deadlines, m.calls)
	}
}

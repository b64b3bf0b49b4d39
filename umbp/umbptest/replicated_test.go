package umbptest_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// rotating sends each call to the next of its connections: a client of
// replicas that are interchangeable.
type rotating struct {
	ccs  []*grpc.ClientConn
	next atomic.Uint64
}

func (r *rotating) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	i := (r.next.Add(1) - 1) % uint64(len(r.ccs))
	return r.ccs[i].Invoke(ctx, method, args, reply, opts...)
}

func (r *rotating) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return r.ccs[0].NewStream(ctx, desc, method, opts...)
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// newReplicatedTarget is a target whose every call goes to the next of
// three replicas: a node registers through one, heartbeats through
// another, and is looked up through the third. With UMBP_MASTER_ADDRS
// (comma-separated), the replicas are real masters.
func newReplicatedTarget(t *testing.T) *target {
	t.Helper()
	ids := fmt.Sprintf("%s-%d-%d-", t.Name(), os.Getpid(), runSeq.Add(1))
	if addrs := os.Getenv("UMBP_MASTER_ADDRS"); addrs != "" {
		t.Setenv("UMBP_MASTER_ADDR", strings.Split(addrs, ",")[0])
		tg := newTarget(t) // the real master's TTL and expiry
		rot := &rotating{}
		for _, a := range strings.Split(addrs, ",") {
			rot.ccs = append(rot.ccs, dial(t, a))
		}
		tg.c, tg.ids = umbppb.NewUMBPMasterClient(rot), ids
		return tg
	}
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	r := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{
		HeartbeatTTL: time.Second, MaxMissedHeartbeats: 3, ReaperInterval: -1, Now: clk.Now,
	})
	rot := &rotating{}
	for _, a := range r.Addrs() {
		rot.ccs = append(rot.ccs, dial(t, a))
	}
	tg := &target{c: umbppb.NewUMBPMasterClient(rot), ttl: time.Second, ids: ids, clock: clk}
	tg.expire = func(t *testing.T, node, _ string) {
		t.Helper()
		clk.Advance(3*time.Second + time.Millisecond)
		if got := r.Reap(); !slices.Contains(got, node) {
			t.Fatalf("Reap expired %v, want %s among them", got, node)
		}
	}
	return tg
}

// Every conformance test again, each call through the next replica.
func TestReplicatedConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func(*testing.T, *target)
	}{
		{"Register", testMasterRegister},
		{"RegisterSeqZeroIsAGap", testMasterRegisterSeqZeroIsAGap},
		{"HeartbeatIndex", testMasterHeartbeatIndex},
		{"HeartbeatSequence", testMasterHeartbeatSequence},
		{"Expiry", testMasterExpiry},
		{"ExternalKv", testMasterExternalKv},
		{"EmptyNodeIDAndLargeLookup", testMasterEmptyNodeIDAndLargeLookup},
		{"UnknownEventKindIsAdd", testMasterUnknownEventKindIsAdd},
	} {
		t.Run(c.name, func(t *testing.T) { c.f(t, newReplicatedTarget(t)) })
	}
}

func replicaClients(t *testing.T, r *umbptest.ReplicatedMaster) []umbppb.UMBPMasterClient {
	t.Helper()
	var cs []umbppb.UMBPMasterClient
	for _, a := range r.Addrs() {
		cs = append(cs, umbppb.NewUMBPMasterClient(dial(t, a)))
	}
	return cs
}

func lookupVia(t *testing.T, ctx context.Context, c umbppb.UMBPMasterClient, keys ...string) []bool {
	t.Helper()
	r, err := c.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: keys})
	if err != nil {
		t.Fatalf("BatchLookup: %v", err)
	}
	return r.GetFound()
}

// Calls are counted per replica and in all; hit counts add up across
// replicas; a node alive through one cannot register through another.
func TestReplicasShareState(t *testing.T) {
	r := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{ReaperInterval: -1})
	if r.Len() != 3 || len(slices.Compact(slices.Sorted(slices.Values(r.Addrs())))) != 3 {
		t.Fatalf("%d replicas at %v, want 3 addresses", r.Len(), r.Addrs())
	}
	cs := replicaClients(t, r)
	ctx := ctxT(t, 10*time.Second)
	if _, err := cs[0].RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n", PeerAddress: "n:1"}); err != nil {
		t.Fatal(err)
	}
	_, err := cs[1].RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n"})
	wantCode(t, err, codes.AlreadyExists)
	if _, err := cs[2].ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n", Hashes: []string{"h"}, Tier: umbppb.TierType_TIER_DRAM}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs[:2] {
		if _, err := c.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}, CountAsHit: true}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := cs[2].GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: []string{"h"}})
	if err != nil || len(h.GetEntries()) != 1 || h.GetEntries()[0].GetHitCountTotal() != 2 {
		t.Fatalf("hit counts through replica 2: %v, %v; want h:2", h, err)
	}
	if nd, ok := r.Node("n"); !ok || nd.Status != umbptest.MasterNodeAlive || nd.PeerAddress != "n:1" {
		t.Fatalf("Node(n) = %+v, %v", nd, ok)
	}
	if _, err := cs[1].UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: "n"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Replica(0).Node("n"); ok {
		t.Fatal("a node unregistered through replica 1 is still known to replica 0")
	}
	for i, want := range []int{1, 1, 0} {
		if got := r.Replica(i).Calls("MatchExternalKv"); got != want {
			t.Errorf("replica %d: %d calls of MatchExternalKv, want %d", i, got, want)
		}
	}
	if got := r.Calls("RegisterClient"); got != 2 {
		t.Errorf("%d calls of RegisterClient in all, want 2", got)
	}
	if err := r.WaitCalls(ctx, "MatchExternalKv", 2); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.WaitCalls(short, "MatchExternalKv", 3); err == nil {
		t.Fatal("WaitCalls for a call never made returned nil")
	}
}

// A killed replica refuses connections while the others serve; restarted
// on its address, it serves the whole shared state at once.
func TestReplicaKillAndRestart(t *testing.T) {
	r := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{ReaperInterval: -1})
	cs := replicaClients(t, r)
	ctx := ctxT(t, 10*time.Second)
	n := umbptest.NewNode(t, r.Replica(0).Addr(), umbptest.NodeOptions{ID: "n", Keys: map[umbptest.Tier][]string{umbptest.TierHBM: {"k"}}})
	for _, c := range cs {
		wantFound(t, lookupVia(t, ctx, c, "k", "x"), true, false)
	}
	addr := r.Replica(1).Addr()
	r.Replica(1).Kill()
	_, err := cs[1].BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
	wantCode(t, err, codes.Unavailable)
	// A new connection is refused.
	_, err = umbppb.NewUMBPMasterClient(dial(t, addr)).BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("a call to a killed replica: %v, want Unavailable, connection refused", err)
	}
	wantFound(t, lookupVia(t, ctx, cs[2], "k"), true)
	if err := n.Add(ctx, umbptest.TierDRAM, "k2"); err != nil { // through replica 0
		t.Fatal(err)
	}
	if nd, ok := r.Replica(1).Node("n"); !ok || nd.Keys != 2 {
		t.Fatalf("the shared state seen from a killed replica: %+v, %v", nd, ok)
	}

	if err := r.Replica(1).Restart(); err != nil {
		t.Fatal(err)
	}
	if got := r.Replica(1).Addr(); got != addr {
		t.Fatalf("restarted at %s, was %s", got, addr)
	}
	// The first call it answers has the whole picture. (A new connection:
	// cs[1] redials after gRPC's backoff.)
	c1 := umbppb.NewUMBPMasterClient(dial(t, addr))
	wantFound(t, lookupVia(t, ctx, c1, "k", "k2"), true, true)
	hb, err := c1.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n"})
	if err != nil || hb.GetStatus() != umbppb.ClientStatus_CLIENT_STATUS_ALIVE || hb.GetAckedSeq() != 1 {
		t.Fatalf("a keepalive through the restarted replica: %v, %v; want ALIVE, acked 1", hb, err)
	}
}

// A suspended replica takes connections and answers nothing: calls on an
// open connection and new connections alike time out, and reach it only
// once it resumes.
func TestReplicaSuspend(t *testing.T) {
	r := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{ReaperInterval: -1})
	cs := replicaClients(t, r)
	ctx := ctxT(t, 10*time.Second)
	umbptest.NewNode(t, r.Replica(1).Addr(), umbptest.NodeOptions{ID: "n", Keys: map[umbptest.Tier][]string{umbptest.TierHBM: {"k"}}})
	wantFound(t, lookupVia(t, ctx, cs[0], "k"), true) // connected
	m := r.Replica(0)
	before := m.Calls("BatchLookup")

	m.Suspend()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := cs[0].BatchLookup(short, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)
	fresh := dial(t, m.Addr())
	short, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = umbppb.NewUMBPMasterClient(fresh).BatchLookup(short, &umbppb.BatchLookupRequest{Keys: []string{"k"}}, grpc.WaitForReady(true))
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)
	if s := fresh.GetState(); s == connectivity.Ready {
		t.Fatalf("a connection to a suspended replica is %v", s)
	}
	if got := m.Calls("BatchLookup"); got != before {
		t.Fatalf("%d calls reached a suspended replica", got-before)
	}
	wantFound(t, lookupVia(t, ctx, cs[1], "k"), true) // the other replica serves

	// What waits is served once it resumes.
	got := make(chan error, 2)
	for _, c := range []umbppb.UMBPMasterClient{cs[0], umbppb.NewUMBPMasterClient(fresh)} {
		go func() {
			r, err := c.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k"}}, grpc.WaitForReady(true))
			if err == nil && !r.GetFound()[0] {
				err = fmt.Errorf("found %v", r.GetFound())
			}
			got <- err
		}()
	}
	m.Resume()
	for range 2 {
		if err := <-got; err != nil {
			t.Fatalf("a call to a suspended replica after Resume: %v", err)
		}
	}
	if err := m.WaitCalls(ctx, "BatchLookup", before+2); err != nil {
		t.Fatal(err)
	}

	// Kill ends a suspension: what waits fails, and the replica restarts
	// running.
	m.Suspend()
	go func() {
		_, err := cs[0].BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
		got <- err
	}()
	m.Kill()
	wantCode(t, <-got, codes.Unavailable)
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	wantFound(t, lookupVia(t, ctx, umbppb.NewUMBPMasterClient(dial(t, m.Addr())), "k"), true)
	// Close releases a suspended replica.
	m.Suspend()
}

// The store's outages, as every replica answers them.
func TestStoreOutage(t *testing.T) {
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	const timeout = 30 * time.Millisecond
	r := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{
		ReaperInterval: -1, StoreTimeout: timeout, HeartbeatTTL: time.Second, MaxMissedHeartbeats: 1, Now: clk.Now,
	})
	cs := replicaClients(t, r)
	ctx := ctxT(t, 10*time.Second)
	umbptest.NewNode(t, r.Replica(0).Addr(), umbptest.NodeOptions{
		ID: "n", PeerAddress: "n:1", HeartbeatInterval: time.Hour,
		Keys:     map[umbptest.Tier][]string{umbptest.TierHBM: {"k"}},
		External: map[umbptest.Tier][]string{umbptest.TierDRAM: {"h"}},
	})
	wantStore := func(t *testing.T, err error, method string) {
		t.Helper()
		st := status.Convert(err)
		if st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), method+": "+umbptest.StoreUnavailable+": ") {
			t.Fatalf("got %v, want Unavailable %q", err, method+": "+umbptest.StoreUnavailable+": …")
		}
	}
	lookup := func(c umbppb.UMBPMasterClient) error {
		_, err := c.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
		return err
	}
	heartbeat := func(c umbppb.UMBPMasterClient) error {
		_, err := c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n"})
		return err
	}
	back := func(t *testing.T) {
		t.Helper()
		r.RestoreStore()
		for _, c := range cs {
			wantFound(t, lookupVia(t, ctx, c, "k"), true)
		}
	}

	r.FailStore(umbptest.StoreDown)
	for _, c := range cs {
		wantStore(t, lookup(c), "BatchLookup")
		wantStore(t, heartbeat(c), "Heartbeat")
	}
	// Arguments are checked first.
	_, err := cs[0].ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n"})
	wantCode(t, err, codes.InvalidArgument)
	clk.Advance(2 * time.Second)
	if got := r.Reap(); len(got) != 0 {
		t.Fatalf("Reap with the store down expired %v", got)
	}
	back(t)
	if _, err := cs[1].Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n"}); err != nil {
		t.Fatal(err)
	}

	r.FailStore(umbptest.StoreStopped)
	for _, c := range cs {
		start := time.Now()
		wantStore(t, lookup(c), "BatchLookup")
		if d := time.Since(start); d < timeout {
			t.Fatalf("a stopped store failed a call after %v, before its timeout %v", d, timeout)
		}
	}
	back(t)

	r.FailStore(umbptest.StoreClusterDown)
	for _, c := range cs {
		wantFound(t, lookupVia(t, ctx, c, "k", "x"), false, false)
		m, err := c.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}})
		if err != nil || len(m.GetMatches()) != 0 {
			t.Fatalf("a match in a failed cluster: %v, %v; want OK, no node", m, err)
		}
		wantStore(t, heartbeat(c), "Heartbeat")
	}
	back(t)
	m, err := cs[2].MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}})
	if err != nil || len(m.GetMatches()) != 1 || m.GetMatches()[0].GetPeerAddress() != "n:1" {
		t.Fatalf("a match after the outage: %v, %v", m, err)
	}
	for f, want := range map[umbptest.StoreFault]string{umbptest.StoreStopped: "store stopped", umbptest.StoreDown: "store down", umbptest.StoreClusterDown: "store cluster down", 0: "StoreFault(0)"} {
		if got := f.String(); got != want {
			t.Errorf("StoreFault(%d).String() = %q, want %q", int(f), got, want)
		}
	}
}

// A store restarted empty has forgotten every node: nodes heartbeat
// UNKNOWN, register again and send their keys; their external KV is gone.
func TestWipeStore(t *testing.T) {
	r := umbptest.NewReplicatedMaster(t, 3, umbptest.MasterOptions{ReaperInterval: -1})
	cs := replicaClients(t, r)
	ctx := ctxT(t, 10*time.Second)
	var nodes []*umbptest.Node
	for i := range 2 {
		nodes = append(nodes, umbptest.NewNode(t, r.Replica(i).Addr(), umbptest.NodeOptions{
			ID: fmt.Sprint("n", i), HeartbeatInterval: time.Hour,
			Keys:     map[umbptest.Tier][]string{umbptest.TierHBM: {fmt.Sprint("k", i)}},
			External: map[umbptest.Tier][]string{umbptest.TierHBM: {fmt.Sprint("h", i)}},
		}))
	}
	wantFound(t, lookupVia(t, ctx, cs[2], "k0", "k1"), true, true)
	r.WipeStore()
	wantFound(t, lookupVia(t, ctx, cs[2], "k0", "k1"), false, false)
	for _, n := range nodes {
		if err := n.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wantFound(t, lookupVia(t, ctx, cs[2], "k0", "k1"), true, true)
	m, err := cs[2].MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h0", "h1"}})
	if err != nil || len(m.GetMatches()) != 0 {
		t.Fatalf("external KV after a wipe: %v, %v; want none", m, err)
	}
}

func TestReplicatedMasterOptions(t *testing.T) {
	if _, err := umbptest.StartReplicatedMaster(0, umbptest.MasterOptions{}); err == nil {
		t.Fatal("0 replicas started")
	}
	if _, err := umbptest.StartReplicatedMaster(2, umbptest.MasterOptions{Addr: "127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "port 0") {
		t.Fatalf("2 replicas on one port: %v", err)
	}
	if _, err := umbptest.StartReplicatedMaster(1, umbptest.MasterOptions{Addr: "no port"}); err == nil {
		t.Fatal("an address without a port started")
	}
	r, err := umbptest.StartReplicatedMaster(2, umbptest.MasterOptions{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	// A replica closed alone stays closed; the others serve.
	if err := r.Replica(0).Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Replica(0).Restart(); err == nil {
		t.Fatal("a closed replica restarted")
	}
	ctx := ctxT(t, 10*time.Second)
	wantFound(t, lookupVia(t, ctx, umbppb.NewUMBPMasterClient(dial(t, r.Replica(1).Addr())), "k"), false)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// The replicas' reaper expires a silent node on its own.
func TestReplicatedBackgroundReaper(t *testing.T) {
	r := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{HeartbeatTTL: time.Millisecond, MaxMissedHeartbeats: 1, ReaperInterval: time.Millisecond})
	ctx := ctxT(t, 10*time.Second)
	if _, err := replicaClients(t, r)[1].RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n"}); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitExpired(ctx, "n"); err != nil {
		t.Fatal(err)
	}
	if nd, ok := r.Node("n"); !ok || nd.Status != umbptest.MasterNodeExpired || nd.Status.String() != "expired" {
		t.Fatalf("Node(n) = %+v, %v", nd, ok)
	}
}

// A replica answers what FailNextWith says, in order after FailNext's.
func TestFailNextWith(t *testing.T) {
	r := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{ReaperInterval: -1})
	cs := replicaClients(t, r)
	ctx := ctxT(t, 10*time.Second)
	m := r.Replica(1)
	m.FailNext("BatchLookup", 1)
	m.FailNextWith("BatchLookup", 2, status.Error(codes.ResourceExhausted, "busy"))
	_, err := cs[1].BatchLookup(ctx, &umbppb.BatchLookupRequest{})
	wantCode(t, err, codes.Unavailable)
	for range 2 {
		_, err := cs[1].BatchLookup(ctx, &umbppb.BatchLookupRequest{})
		if st := status.Convert(err); st.Code() != codes.ResourceExhausted || st.Message() != "busy" {
			t.Fatalf("got %v, want ResourceExhausted busy", err)
		}
		wantFound(t, lookupVia(t, ctx, cs[0])) // the other replica has no failures
	}
	wantFound(t, lookupVia(t, ctx, cs[1]))
	m.FailNextWith("BatchLookup", 5, status.Error(codes.Internal, "x"))
	m.FailNextWith("BatchLookup", 0, nil)
	wantFound(t, lookupVia(t, ctx, cs[1]))
}

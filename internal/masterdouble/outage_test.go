package masterdouble

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bounded is a context that ends a test that would hang.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// call is one method of the service with arguments that pass its checks.
type call struct {
	name string
	read bool
	do   func(context.Context, *Service) error
}

func calls() []call {
	dram := umbppb.TierType_TIER_DRAM
	return []call{
		{"RegisterClient", false, func(ctx context.Context, s *Service) error {
			_, err := s.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "new"})
			return err
		}},
		{"UnregisterClient", false, func(ctx context.Context, s *Service) error {
			_, err := s.UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: "nobody"})
			return err
		}},
		{"Heartbeat", false, func(ctx context.Context, s *Service) error {
			_, err := s.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n"})
			return err
		}},
		{"ReportExternalKvBlocks", false, func(ctx context.Context, s *Service) error {
			_, err := s.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n", Hashes: []string{"h2"}, Tier: dram})
			return err
		}},
		{"RevokeExternalKvBlocks", false, func(ctx context.Context, s *Service) error {
			_, err := s.RevokeExternalKvBlocks(ctx, &umbppb.RevokeExternalKvBlocksRequest{NodeId: "n", Hashes: []string{"h9"}, Tier: dram})
			return err
		}},
		{"RevokeAllExternalKvBlocksAtTier", false, func(ctx context.Context, s *Service) error {
			_, err := s.RevokeAllExternalKvBlocksAtTier(ctx, &umbppb.RevokeAllExternalKvBlocksAtTierRequest{NodeId: "nobody", Tier: dram})
			return err
		}},
		{"RevokeAllExternalKvBlocksForNode", false, func(ctx context.Context, s *Service) error {
			_, err := s.RevokeAllExternalKvBlocksForNode(ctx, &umbppb.RevokeAllExternalKvBlocksForNodeRequest{NodeId: "nobody"})
			return err
		}},
		{"BatchLookup", true, func(ctx context.Context, s *Service) error {
			r, err := s.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k", "k", "x"}})
			if err == nil && len(r.GetFound()) != 3 {
				return status.Errorf(codes.Internal, "%d answers for 3 keys", len(r.GetFound()))
			}
			return err
		}},
		{"MatchExternalKv", true, func(ctx context.Context, s *Service) error {
			_, err := s.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}, CountAsHit: true})
			return err
		}},
		{"GetExternalKvHitCounts", true, func(ctx context.Context, s *Service) error {
			_, err := s.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: []string{"h"}})
			return err
		}},
	}
}

// populated is a store with one node "n" holding key "k" and external
// block "h", which has one hit.
func populated(t *testing.T, opts Options) *Service {
	t.Helper()
	s := New(opts)
	ctx := context.Background()
	if _, err := s.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n", PeerAddress: "n:1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n", Bundles: []*umbppb.EventBundle{{Seq: 1, Events: []*umbppb.KvEvent{{Key: "k", Tier: umbppb.TierType_TIER_HBM}}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n", Hashes: []string{"h"}, Tier: umbppb.TierType_TIER_HBM}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}, CountAsHit: true}); err != nil {
		t.Fatal(err)
	}
	return s
}

func wantStoreUnavailable(t *testing.T, err error, method string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), method+": "+StoreUnavailable+": ") {
		t.Fatalf("%s: got %v, want Unavailable %q", method, err, method+": "+StoreUnavailable+": …")
	}
}

// wantIntact checks that the store still holds what populated put in it,
// and that no outage counted a hit.
func wantIntact(t *testing.T, s *Service) {
	t.Helper()
	ctx := context.Background()
	r, err := s.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
	if err != nil || !slices.Equal(r.GetFound(), []bool{true}) {
		t.Fatalf("lookup after the outage: %v, %v", r.GetFound(), err)
	}
	m, err := s.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}})
	if err != nil || len(m.GetMatches()) != 1 || m.GetMatches()[0].GetPeerAddress() != "n:1" {
		t.Fatalf("match after the outage: %v, %v", m, err)
	}
	h, err := s.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: []string{"h"}})
	if err != nil || len(h.GetEntries()) != 1 || h.GetEntries()[0].GetHitCountTotal() != 1 {
		t.Fatalf("hit counts after the outage: %v, %v", h, err)
	}
	if n, ok := s.Node("new"); ok {
		t.Fatalf("a registration that failed on the store was applied: %+v", n)
	}
}

// A store that refuses connections fails every call at once, after its
// arguments are checked; nothing is lost.
func TestOutageDown(t *testing.T) {
	s := populated(t, Options{StoreTimeout: time.Hour})
	s.SetOutage(StoreDown)
	ctx := context.Background()
	for _, c := range calls() {
		wantStoreUnavailable(t, c.do(ctx, s), c.name)
	}
	// A bad argument is answered as usual.
	_, err := s.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{Hashes: []string{"h"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a report without a node id during an outage: %v", err)
	}
	_, err = s.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: make([]string, 4097)})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("too many hashes during an outage: %v", err)
	}
	if _, err := s.ReportMetrics(ctx, &umbppb.ReportMetricsRequest{}); err != nil {
		t.Fatalf("ReportMetrics needs no store: %v", err)
	}
	if s.Outage() != StoreDown {
		t.Fatalf("Outage() = %v", s.Outage())
	}
	s.SetOutage(StoreUp)
	wantIntact(t, s)
}

// A failed Redis Cluster answers reads as "nothing found" and fails writes.
func TestOutageClusterDown(t *testing.T) {
	s := populated(t, Options{StoreTimeout: time.Hour})
	s.SetOutage(StoreClusterDown)
	ctx := context.Background()
	for _, c := range calls() {
		err := c.do(ctx, s)
		if c.read {
			if err != nil {
				t.Fatalf("%s: %v, want OK", c.name, err)
			}
			continue
		}
		wantStoreUnavailable(t, err, c.name)
	}
	r, _ := s.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k", "x"}})
	if !slices.Equal(r.GetFound(), []bool{false, false}) {
		t.Fatalf("lookup in a failed cluster found %v", r.GetFound())
	}
	m, _ := s.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}})
	if len(m.GetMatches()) != 0 {
		t.Fatalf("match in a failed cluster: %v", m)
	}
	h, _ := s.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: []string{"h"}})
	if len(h.GetEntries()) != 0 {
		t.Fatalf("hit counts in a failed cluster: %v", h)
	}
	s.SetOutage(StoreUp)
	wantIntact(t, s)
}

// A stopped store fails a call after StoreTimeout; a call that waits when
// the store comes back goes on; one whose context ends fails with it.
func TestOutageStopped(t *testing.T) {
	s := populated(t, Options{StoreTimeout: 20 * time.Millisecond})
	s.SetOutage(StoreStopped)
	ctx := bounded(t)
	for _, c := range calls() {
		start := time.Now()
		wantStoreUnavailable(t, c.do(ctx, s), c.name)
		if d := time.Since(start); d < 20*time.Millisecond {
			t.Fatalf("%s failed after %v, before the store's timeout", c.name, d)
		}
	}
	// A lookup of no key does not touch the store: it answers at once.
	if r, err := s.BatchLookup(ctx, &umbppb.BatchLookupRequest{}); err != nil || len(r.GetFound()) != 0 {
		t.Fatalf("a lookup of no key with the store stopped: %v, %v", r, err)
	}
	s.SetOutage(StoreUp)
	wantIntact(t, s)

	s = populated(t, Options{StoreTimeout: time.Hour})
	waiting := make(chan struct{}, 1)
	s.onWait = func(string) { waiting <- struct{}{} }
	s.SetOutage(StoreStopped)
	got := make(chan error, 1)
	go func() {
		r, err := s.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
		if err == nil && !slices.Equal(r.GetFound(), []bool{true}) {
			err = status.Errorf(codes.Internal, "found %v", r.GetFound())
		}
		got <- err
	}()
	<-waiting
	s.SetOutage(StoreUp)
	if err := <-got; err != nil {
		t.Fatalf("a lookup waiting when the store came back: %v", err)
	}

	// A store that goes down while a call waits fails it at once.
	s.SetOutage(StoreStopped)
	go func() {
		_, err := s.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n"})
		got <- err
	}()
	<-waiting
	s.SetOutage(StoreDown)
	wantStoreUnavailable(t, <-got, "Heartbeat")

	s.SetOutage(StoreStopped)
	short, cancel := context.WithCancel(ctx)
	go func() {
		_, err := s.BatchLookup(short, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
		got <- err
	}()
	<-waiting
	cancel()
	if err := <-got; status.Code(err) != codes.Canceled {
		t.Fatalf("a lookup whose context ended while the store was stopped: %v", err)
	}
}

// The reaper does nothing while the store is out; it expires the node
// once the store is back.
func TestReapDuringOutage(t *testing.T) {
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	s := populated(t, Options{HeartbeatTTL: time.Second, MaxMissedHeartbeats: 1, Now: c.Now})
	c.Add(2 * time.Second)
	for _, o := range []Outage{StoreStopped, StoreDown, StoreClusterDown} {
		s.SetOutage(o)
		if dead := s.Reap(); len(dead) != 0 {
			t.Fatalf("Reap with the store %v expired %v", o, dead)
		}
	}
	s.SetOutage(StoreUp)
	if dead := s.Reap(); !slices.Equal(dead, []string{"n"}) {
		t.Fatalf("Reap after the outage expired %v, want [n]", dead)
	}
}

// A wiped store has forgotten everything: its nodes heartbeat UNKNOWN,
// and whoever waits for one to expire is woken.
func TestWipe(t *testing.T) {
	s := populated(t, Options{})
	waiting := make(chan string, 1)
	s.onWait = func(what string) { waiting <- what }
	ctx := bounded(t)
	done := make(chan error, 1)
	go func() { done <- s.WaitExpired(ctx, "n") }()
	if what := <-waiting; what != "expiry" {
		t.Fatalf("waiting for %s", what)
	}
	s.Wipe()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	hb, err := s.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n"})
	if err != nil || hb.GetStatus() != umbppb.ClientStatus_CLIENT_STATUS_UNKNOWN {
		t.Fatalf("heartbeat after a wipe: %v, %v", hb, err)
	}
	r, _ := s.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{"k"}})
	m, _ := s.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}})
	h, _ := s.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: []string{"h"}})
	if r.GetFound()[0] || len(m.GetMatches()) != 0 || len(h.GetEntries()) != 0 {
		t.Fatalf("after a wipe: found %v, matches %v, hits %v", r.GetFound(), m, h)
	}
	// It registers again as a new node.
	if _, err := s.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n"}); err != nil {
		t.Fatal(err)
	}
}

func TestOutageString(t *testing.T) {
	for o, want := range map[Outage]string{StoreUp: "up", StoreStopped: "stopped", StoreDown: "down", StoreClusterDown: "cluster down", 9: "Outage(9)"} {
		if got := o.String(); got != want {
			t.Errorf("%d: %q, want %q", int(o), got, want)
		}
	}
}

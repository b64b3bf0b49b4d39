package umbp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func newWorker(t *testing.T, rt *umbp.StandaloneRuntime) *umbp.WorkerHandle {
	t.Helper()
	w, err := rt.NewWorkerHandle(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// A local-mode server accepts reports and matches nothing, as MORI's does;
// a report is cut into requests of at most 4096 hashes.
func TestWorkerExternalKvOnLocalServer(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	w := newWorker(t, newRuntime(t, testConfig(t, srv.Endpoint())))
	ctx := context.Background()
	hashes := make([]string, 5000)
	for i := range hashes {
		hashes[i] = fmt.Sprintf("h%d", i)
	}
	if err := w.ReportExternalKv(ctx, umbp.TierHBM, hashes); err != nil {
		t.Fatal(err)
	}
	if n := srv.Calls("ReportExternalKvBlocks"); n != 2 {
		t.Errorf("%d report requests for 5000 hashes, want 2", n)
	}
	if err := w.RevokeExternalKv(ctx, umbp.TierHBM, hashes[:3]); err != nil {
		t.Fatal(err)
	}
	if err := w.RevokeAllExternalKv(ctx, umbp.TierDRAM); err != nil {
		t.Fatal(err)
	}
	m, err := w.MatchExternalKv(ctx, hashes[:10])
	if err != nil || len(m) != 0 {
		t.Errorf("MatchExternalKv = %v, %v; want nothing from a local server", m, err)
	}
	err = w.ReportExternalKv(ctx, umbp.Tier(7), hashes)
	if !errors.Is(err, umbp.ErrInvalidKey) || !strings.HasPrefix(err.Error(), "umbp: ") {
		t.Errorf("report on tier 7 = %v", err)
	}
	if _, err := w.MatchExternalKv(ctx, hashes[:4097]); err == nil {
		t.Error("a match of more than 4096 hashes was sent")
	}
	// A stalled server: the report ends within Timeout, never hangs.
	srv.Stall("ReportExternalKvBlocks")
	defer srv.Resume()
	start := time.Now()
	err = w.ReportExternalKv(ctx, umbp.TierHBM, hashes[:1])
	if !errors.Is(err, context.DeadlineExceeded) || strings.Count(err.Error(), srv.Endpoint()) != 1 {
		t.Errorf("report to a stalled server = %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("report to a stalled server took %v", d)
	}
}

func TestRequireDistributedRefusesLocalServer(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.RequireDistributed = true
	rt := newRuntime(t, cfg)
	_, err := rt.NewSchedulerHandle(context.Background())
	if !errors.Is(err, umbp.ErrNotSupported) || !strings.Contains(err.Error(), "STANDALONE_BACKEND_LOCAL") || strings.Count(err.Error(), srv.Endpoint()) != 1 {
		t.Fatalf("NewSchedulerHandle on a local server with RequireDistributed = %v", err)
	}
	if _, err := rt.NewWorkerHandle(context.Background(), nil); !errors.Is(err, umbp.ErrNotSupported) {
		t.Fatalf("NewWorkerHandle = %v", err)
	}
	if s := newSchedulerLocal(t, srv); s.Stats().Capabilities.Mode != "STANDALONE_BACKEND_LOCAL" {
		t.Errorf("Mode = %q", s.Stats().Capabilities.Mode)
	}
}

func newSchedulerLocal(t *testing.T, srv *umbptest.Server) *umbp.SchedulerHandle {
	t.Helper()
	h, err := newRuntime(t, testConfig(t, srv.Endpoint())).NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// Quarantine on a standalone handle: on by default, as on the master's
// (DefaultLoadFailureQuarantine), off when LoadFailureQuarantine is
// negative.
func TestStandaloneQuarantine(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.LoadFailureQuarantine = -1
	off, err := newRuntime(t, cfg).NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	off.QuarantineKeys([]string{"k"})
	on, err := newRuntime(t, testConfig(t, srv.Endpoint())).NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer on.Close()
	keys := storeKeys(t, newRuntime(t, testConfig(t, srv.Endpoint())), 2)
	ctx := context.Background()
	on.QuarantineKeys(keys[:1])
	if got := on.LookupPrefix(ctx, keys); got != 0 {
		t.Errorf("LookupPrefix with the first key quarantined = %d", got)
	}
	if got := on.Lookup(ctx, keys); got[0] || !got[1] {
		t.Errorf("Lookup = %v; want the quarantined key a miss", got)
	}
	off.QuarantineKeys(keys[:1])
	if got := off.LookupPrefix(ctx, keys); got != len(keys) {
		t.Errorf("LookupPrefix without quarantine = %d, want %d", got, len(keys))
	}
}

// On the standalone path Score asks the server: a local one matches no
// node, and the pool prefix is its BatchExistsConsecutive.
func TestStandaloneScore(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	keys := storeKeys(t, newRuntime(t, testConfig(t, srv.Endpoint())), 3)
	h := newSchedulerLocal(t, srv)
	s, err := h.Score(context.Background(), umbp.ScoreRequest{Candidates: []string{"n1"}, BlockHashes: append(keys, "missing")})
	if err != nil || !s.Complete || s.PoolPrefix != 3 || s.Best != -1 || s.Nodes[0].Prefix != 0 {
		t.Fatalf("Score = %+v, %v", s, err)
	}
	if srv.Calls("MatchExternalKv") != 1 || srv.Calls("BatchExistsConsecutive") != 1 {
		t.Errorf("calls: %d matches, %d prefix lookups; want one each", srv.Calls("MatchExternalKv"), srv.Calls("BatchExistsConsecutive"))
	}
}

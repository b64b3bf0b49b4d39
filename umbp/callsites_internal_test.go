package umbp

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/server"
)

// goid is the calling goroutine's id, from its stack's first line.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// seenSource records the goroutine each of a source's calls ran on.
type seenSource struct {
	lookupSource
	mu  sync.Mutex
	ran map[string]uint64
}

func (s *seenSource) saw(what string) {
	s.mu.Lock()
	s.ran[what] = goid()
	s.mu.Unlock()
}

func (s *seenSource) where(what string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ran[what]
	return id, ok
}

func (s *seenSource) exists(ctx context.Context, keys encoded.Keys) ([]bool, error) {
	s.saw("exists")
	return s.lookupSource.exists(ctx, keys)
}

func (s *seenSource) prefix(ctx context.Context, keys encoded.Keys) (int, error) {
	s.saw("prefix")
	return s.lookupSource.prefix(ctx, keys)
}

func (s *seenSource) match(ctx context.Context, hashes []string) ([]masterconn.NodeMatch, error) {
	s.saw("match")
	return s.lookupSource.match(ctx, hashes)
}

func (s *seenSource) clear(ctx context.Context) (bool, error) {
	s.saw("clear")
	return s.lookupSource.clear(ctx)
}

func (s *seenSource) ping(ctx context.Context) (ServerCapabilities, error) {
	s.saw("ping")
	return s.lookupSource.ping(ctx)
}

// seenBackend hands out one seenSource over its backend's current source.
type seenBackend struct {
	lookupBackend
	mu   sync.Mutex
	srcs map[lookupSource]*seenSource
}

func (b *seenBackend) session() (lookupSource, error) {
	src, err := b.lookupBackend.session()
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.srcs[src]
	if !ok {
		s = &seenSource{lookupSource: src, ran: map[string]uint64{}}
		b.srcs[src] = s
	}
	return s, nil
}

// TestWhereCallsRun: each kind of call runs where callsites.go (and so the
// documents) say: a default lookup on the caller's own goroutine, Score,
// Clear, Ping and GRPCLookups lookups on a detached one, transfers on the
// transfer goroutines (Store returns while the server holds them), and
// RegisterBuffers and the external-KV calls on the caller's.
func TestWhereCallsRun(t *testing.T) {
	if whereLookups != "on the caller's own goroutine" || whereOtherCalls != "on a detached goroutine" ||
		whereTransfers != "on one of the handle's detached transfer goroutines, or on the goroutine of a Wait that finds it queued as the handle's one job" ||
		whereWorkerCalls != "on the caller's own goroutine" {
		t.Fatal("callsites.go says something this test does not check: change the test with it")
	}
	dir := t.TempDir()
	srv, err := server.New(server.Options{Endpoint: "unix://" + dir + "/w.grpc.sock", Capacity: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	for _, grpcLookups := range []bool{false, true} {
		rt, err := NewStandaloneRuntime(Config{Endpoint: srv.Endpoint(), GRPCLookups: grpcLookups})
		if err != nil {
			t.Fatal(err)
		}
		h, err := rt.NewSchedulerHandle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seen := &seenBackend{lookupBackend: h.calls.backend, srcs: map[lookupSource]*seenSource{}}
		h.calls.backend = seen
		me := goid()
		h.Lookup(ctx, []string{"k"})
		h.LookupPrefix(ctx, []string{"k"})
		if _, err := h.Score(ctx, ScoreRequest{Candidates: []string{"n"}, BlockHashes: []string{"b"}}); err != nil {
			t.Fatal(err)
		}
		if err := h.Clear(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		src, err := seen.session()
		if err != nil {
			t.Fatal(err)
		}
		s := src.(*seenSource)
		for _, c := range []struct {
			what   string
			caller bool
		}{
			{"exists", !grpcLookups}, {"prefix", true /* Score's, last: lock-step on its goroutine either way */},
			{"match", false}, {"clear", false}, {"ping", false},
		} {
			id, ok := s.where(c.what)
			switch {
			case !ok:
				t.Errorf("GRPCLookups %v: no %s call was made", grpcLookups, c.what)
			case c.what == "prefix":
				// LookupPrefix ran first, then Score's prefix half on
				// Score's detached goroutine.
				if id == me {
					t.Errorf("GRPCLookups %v: Score's prefix lookup ran on the caller's goroutine, want %s", grpcLookups, whereOtherCalls)
				}
			case c.caller && id != me:
				t.Errorf("GRPCLookups %v: %s ran on goroutine %d, not the caller's (%d): want %s", grpcLookups, c.what, id, me, whereLookups)
			case !c.caller && id == me:
				t.Errorf("GRPCLookups %v: %s ran on the caller's goroutine, want %s", grpcLookups, c.what, whereOtherCalls)
			}
		}
		// LookupPrefix alone: where a default lookup runs.
		h.LookupPrefix(ctx, []string{"k"})
		if id, _ := s.where("prefix"); (id == me) == grpcLookups {
			t.Errorf("GRPCLookups %v: LookupPrefix ran on goroutine %d (the caller is %d)", grpcLookups, id, me)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// Transfers are detached: a Store returns while the server holds its
	// request; registration and the external-KV calls are the caller's.
	rt, err := NewStandaloneRuntime(Config{Endpoint: srv.Endpoint(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	buf, err := NewHostBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	if err := w.RegisterBuffers(ctx, map[string]Buffer{"b": buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	// The first job runs on a transfer goroutine (its Wait finds no idle
	// transfer connection yet); the next, queued as the handle's one job
	// when its Wait comes (the transfer goroutine held back until it has
	// ended), on the Wait's goroutine; one nobody waits for, on a
	// transfer goroutine.
	plans := []BlockTransferPlan{{Key: "t", Ranges: []KVRange{{BaseAddress: buf.Buffer().Ptr, Length: 4096}}}}
	if err := w.Wait(ctx, w.Store(plans)); err != nil {
		t.Fatal(err)
	}
	me := goid()
	var ranOn atomic.Uint64
	record := func() { ranOn.Store(goid()) }
	testHookWaitedRun.Store(&record)
	defer testHookWaitedRun.Store(nil)
	hold := func(j *TransferJob) { <-j.Done() }
	testHookPoolClaim.Store(&hold)
	job := w.Load(plans)
	err = w.Wait(ctx, job)
	testHookPoolClaim.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	if id := ranOn.Load(); id != me {
		t.Errorf("a Wait of the handle's one job queued: its request ran on goroutine %d, not the Wait's (%d)", id, me)
	}
	ranOn.Store(0)
	job = w.Load(plans)
	<-job.Done()
	if id := ranOn.Load(); id != 0 {
		t.Errorf("a job nobody waited for ran on goroutine %d, a Wait's", id)
	}
	if n := w.xfer.stats.submitted.Load(); n != 3 {
		t.Errorf("%d jobs handed to the transfer goroutines, want 3", n)
	}
	// The caller's own: a call whose context is already done fails at
	// once, which a call handed to another goroutine bounded by Timeout
	// would not say as the caller's context.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := w.ReportExternalKv(done, TierDRAM, []string{"h"}); err == nil {
		t.Error("ReportExternalKv with a done context succeeded: it did not run on the caller's goroutine with the caller's context")
	}
}

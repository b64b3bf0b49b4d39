package umbp_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// These tests pin the guarantees whose regressions other tests would catch
// only by chance, narrowly, or as a hang: each fails with a message, within
// a bound, when its guarantee breaks.

// returnsWithin runs f and fails the test, with a message, if it has not returned
// within bound: a call that must never hang is caught as a failure, not as
// the test binary's timeout.
func returnsWithin(t *testing.T, bound time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("%s did not return within %v", what, bound)
	}
}

// A stalled server is a miss within LookupTimeout, not within Timeout: with
// Timeout far larger, a lookup that waited Timeout (or anything near it)
// fails here, on both kinds of scheduler handle.
func TestLookupBoundIsLookupTimeoutNotTimeout(t *testing.T) {
	const lookup, timeout = 100 * time.Millisecond, time.Minute
	bound := lookup + time.Second // far below timeout
	check := func(t *testing.T, h *umbp.SchedulerHandle, stall func(), keys []string) {
		ctx := context.Background()
		if !h.Lookup(ctx, keys)[0] {
			t.Fatal("no hit before the stall")
		}
		stall()
		var hit bool
		returnsWithin(t, bound, fmt.Sprintf("a lookup of a stalled server (LookupTimeout %v, Timeout %v)", lookup, timeout), func() {
			hit = h.Lookup(ctx, keys)[0]
		})
		if hit {
			t.Fatal("hit from a stalled server")
		}
		if s := h.Stats().Lookups; s.Timeouts != 1 {
			t.Fatalf("Timeouts = %d, want 1", s.Timeouts)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		srv := newServer(t, umbptest.Options{})
		cfg := testConfig(t, srv.Endpoint())
		cfg.LookupTimeout, cfg.Timeout = lookup, timeout
		rt := newRuntime(t, cfg)
		keys := storeKeys(t, newRuntime(t, testConfig(t, srv.Endpoint())), 1)
		h, err := rt.NewSchedulerHandle(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Resume()
		check(t, h, func() { srv.Stall() }, keys)
		srv.Resume()
		returnsWithin(t, 10*time.Second, "Close", func() { _ = h.Close() })
	})
	t.Run("master", func(t *testing.T) {
		m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
		newFakeNode(t, dialMaster(t, m.Addr()), "n1", []string{"a"})
		cfg := clusterConfig(t, m.Addr())
		cfg.LookupTimeout, cfg.Timeout = lookup, timeout
		h := newClusterHandle(t, cfg)
		defer m.Resume()
		check(t, h, func() { m.Stall() }, []string{"a"})
	})
}

// Close with a call stuck in the server returns within its bound, on both
// kinds of scheduler handle, and says the connection was left open where it
// was (a standalone server, whose gRPC connection a stuck call holds).
func TestSchedulerCloseWithStuckCallIsBounded(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := newServer(t, umbptest.Options{})
		cfg := testConfig(t, srv.Endpoint())
		cfg.Timeout = 500 * time.Millisecond
		h, err := newRuntime(t, cfg).NewSchedulerHandle(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		srv.Stall()
		defer srv.Resume()
		h.Lookup(context.Background(), []string{"k"})
		var cerr error
		returnsWithin(t, cfg.Timeout+margin, "Close with a stuck lookup", func() { cerr = h.Close() })
		switch {
		case grpcLookups && (cerr == nil || !strings.Contains(cerr.Error(), "left open")):
			t.Fatalf("Close = %v, want it to say the connection was left open", cerr)
		case !grpcLookups && cerr != nil:
			// A lock-step lookup leaves a probe in flight, which closing
			// the connection ends: nothing is left open.
			t.Fatalf("Close = %v", cerr)
		}
	})
	t.Run("master", func(t *testing.T) {
		m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
		cfg := clusterConfig(t, m.Addr())
		cfg.LookupTimeout, cfg.Timeout = 20*time.Millisecond, time.Minute
		rt, err := umbp.NewClusterRuntime(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h, err := rt.NewSchedulerHandle(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m.Stall("BatchLookup")
		defer m.Resume()
		h.Lookup(context.Background(), []string{"a"})
		returnsWithin(t, margin, "Close with a call stuck at the master", func() {
			if err := h.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
		})
	})
}

// Every key's outcome stays with its own plan, whatever path its item took:
// plain segments, ranged parts, a staging buffer, a plan that failed in
// planning, a key the pool lacks. Outcomes shifted by one plan (or sorted
// into the order items were sent) fail here.
func TestKeyOutcomesStayWithTheirPlans(t *testing.T) {
	for _, ranged := range []bool{true, false} {
		t.Run(fmt.Sprintf("ranged=%v", ranged), func(t *testing.T) {
			srv := newServer(t, umbptest.Options{DisableRangedIO: !ranged})
			rt := newRuntime(t, testConfig(t, srv.Endpoint()))
			// Two layers: a block is two ranges (a staged or ranged item);
			// one contiguous layer makes single-range (plain) items.
			multi := newEngine(t, rt, 2, 16, 256)
			single := newEngine(t, rt, 1, 16, 512)
			e := map[bool]*engine{true: multi, false: single}

			// Store the even blocks only, through both layouts.
			for _, m := range []bool{true, false} {
				var stored []umbp.BlockTransferPlan
				for b := 0; b < 16; b += 2 {
					stored = append(stored, e[m].plans(t, fmt.Sprintf("o%v", m), b)...)
				}
				e[m].fill(stored, 3)
				waitJob(t, e[m].w, e[m].w.Store(stored))
			}

			// A load job on the multi-range engine of every block, in an
			// order that interleaves present, absent and bad plans.
			order := []int{5, 0, 7, 2, 9, 4, 11, 6, 13, 8, 15, 10, 1, 12, 3, 14}
			plans := multi.plans(t, "otrue", order...)
			bad := map[int]bool{3: true, 10: true} // indexes in plans
			for i := range bad {
				plans[i].Ranges[0].BaseAddress = 0x1000 // outside registered memory
			}
			job := multi.w.Load(plans)
			waitJob(t, multi.w, job)
			var wantDone, wantFailed []string
			var wantIDs []int
			for i, b := range order {
				err := job.KeyErr(i)
				switch {
				case bad[i]:
					if !errors.Is(err, umbp.ErrNotAttempted) || !errors.Is(err, umbp.ErrInvalidPlan) || !strings.Contains(err.Error(), plans[i].Key) {
						t.Errorf("plan %d (%s, bad): KeyErr = %v", i, plans[i].Key, err)
					}
				case b%2 == 1:
					if !errors.Is(err, umbp.ErrNotInPool) || !strings.Contains(err.Error(), plans[i].Key) {
						t.Errorf("plan %d (%s, never stored): KeyErr = %v", i, plans[i].Key, err)
					}
				default:
					if err != nil {
						t.Errorf("plan %d (%s, stored): KeyErr = %v", i, plans[i].Key, err)
					}
					wantDone = append(wantDone, plans[i].Key)
					continue
				}
				wantFailed = append(wantFailed, plans[i].Key)
				wantIDs = append(wantIDs, b)
			}
			if got := job.CompletedKeys(); !slices.Equal(got, wantDone) {
				t.Errorf("CompletedKeys = %v, want %v", got, wantDone)
			}
			if got := job.FailedKeys(); !slices.Equal(got, wantFailed) {
				t.Errorf("FailedKeys = %v, want %v", got, wantFailed)
			}
			if got := job.FailedBlockIDs(); !slices.Equal(got, wantIDs) {
				t.Errorf("FailedBlockIDs = %v, want %v", got, wantIDs)
			}
			var good []umbp.BlockTransferPlan
			var ids []int
			for i, b := range order {
				if job.KeyErr(i) == nil {
					good = append(good, plans[i])
					ids = append(ids, b)
				}
			}
			multi.check(t, good, 3, ids)

			// A mixed job on one worker: a multi-range plan, a one-range
			// plan over the same memory (a plain segment), a plan outside
			// registered memory, another multi-range plan.
			one := multi.plans(t, "mx", 5)[0]
			one.Key, one.Ranges = "mx-one-5", one.Ranges[:1]
			outside := multi.plans(t, "mx", 6)[0]
			outside.Key = "mx-outside-6"
			outside.Ranges[1].BaseAddress = 0x1000
			mixed := []umbp.BlockTransferPlan{multi.plans(t, "mx", 1)[0], one, outside, multi.plans(t, "mx", 3)[0]}
			multi.fill(mixed[:2], 5)
			multi.fill(mixed[3:], 5)
			for _, load := range []bool{false, true} {
				var j *umbp.TransferJob
				if load {
					j = multi.w.Load(mixed)
				} else {
					j = multi.w.Store(mixed)
				}
				waitJob(t, multi.w, j)
				for i, p := range mixed {
					if err := j.KeyErr(i); (i == 2) != (err != nil) {
						t.Errorf("mixed job (load %v) plan %d (%s): KeyErr = %v", load, i, p.Key, err)
					}
				}
			}
		})
	}
}

// While a transfer is blocked, every kind of new transfer is refused at
// once as not attempted, and nothing reaches the server; once it has
// ended, transfers go again.
func TestEveryTransferRefusedWhileBlocked(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 200 * time.Millisecond
	rt := newRuntime(t, cfg)
	a := newEngine(t, rt, 2, 8, 256)
	srv.Stall()
	stuck := a.w.Store(a.plans(t, "b", 0))
	waitCalls(t, srv, "BatchPutRanges", 1)
	if err := a.w.Wait(context.Background(), stuck); !errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("Wait = %v, want ErrBuffersInUse", err)
	}
	puts, gets := srv.Calls("BatchPutRanges"), srv.Calls("BatchGetRanges")
	for name, submit := range map[string]func() *umbp.TransferJob{
		"Store":       func() *umbp.TransferJob { return a.w.Store(a.plans(t, "b", 1)) },
		"Load":        func() *umbp.TransferJob { return a.w.Load(a.plans(t, "b", 2)) },
		"StoreBlocks": func() *umbp.TransferJob { return a.w.StoreBlocks([]umbp.Block{{Key: "b-3", BlockID: 3}}) },
		"LoadBlocks":  func() *umbp.TransferJob { return a.w.LoadBlocks([]umbp.Block{{Key: "b-4", BlockID: 4}}) },
	} {
		j := submit()
		if j.Status() != umbp.JobFailed || !errors.Is(j.Err(), umbp.ErrNotAttempted) || !strings.Contains(j.Err().Error(), "still blocked") {
			t.Errorf("%s while blocked: %s %v", name, j.Status(), j.Err())
		}
	}
	if p, g := srv.Calls("BatchPutRanges"), srv.Calls("BatchGetRanges"); p != puts || g != gets {
		t.Fatalf("the server saw %d puts and %d gets while a transfer was blocked", p-puts, g-gets)
	}
	if s := a.w.Stats().Transfers; s.Blocked != 1 || s.Refused != 4 {
		t.Fatalf("Stats: %d blocked, %d refused; want 1 and 4", s.Blocked, s.Refused)
	}
	srv.Resume()
	awaitEnd(t, stuck)
	next := a.w.Store(a.plans(t, "b", 5))
	waitJob(t, a.w, next)
	if next.Status() != umbp.JobCompleted {
		t.Fatalf("store once nothing is blocked: %s %v", next.Status(), next.Err())
	}
}

// Quarantine ends prefixes and masks hits on both kinds of scheduler
// handle: in Lookup, LookupPrefix, LookupTokens and Score.
func TestQuarantineOnEveryPath(t *testing.T) {
	check := func(t *testing.T, h *umbp.SchedulerHandle, keys []string) {
		ctx := context.Background()
		if n := h.LookupPrefix(ctx, keys); n != len(keys) {
			t.Fatalf("LookupPrefix before quarantine = %d, want %d", n, len(keys))
		}
		h.QuarantineKeys(keys[1:2])
		if n := h.LookupPrefix(ctx, keys); n != 1 {
			t.Errorf("LookupPrefix with key 1 quarantined = %d, want 1", n)
		}
		if got := h.Lookup(ctx, keys); !got[0] || got[1] || !got[2] {
			t.Errorf("Lookup with key 1 quarantined = %v", got)
		}
		s, err := h.Score(ctx, umbp.ScoreRequest{BlockHashes: keys})
		if err != nil {
			t.Fatal(err)
		}
		if s.PoolPrefix != 1 {
			t.Errorf("Score's PoolPrefix with key 1 quarantined = %d, want 1", s.PoolPrefix)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		srv := newServer(t, umbptest.Options{})
		keys := storeKeys(t, newRuntime(t, testConfig(t, srv.Endpoint())), 3)
		cfg := testConfig(t, srv.Endpoint())
		cfg.LoadFailureQuarantine = time.Hour
		h, err := newRuntime(t, cfg).NewSchedulerHandle(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		check(t, h, keys)
	})
	t.Run("master", func(t *testing.T) {
		m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
		keys := []string{"q0", "q1", "q2"}
		newFakeNode(t, dialMaster(t, m.Addr()), "n1", keys)
		cfg := clusterConfig(t, m.Addr())
		cfg.LoadFailureQuarantine = time.Hour
		check(t, newClusterHandle(t, cfg), keys)
	})
}

package umbp_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func ids(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// roundTrip stores blocks from engine A and loads them into engine B at
// other block ids, checking every byte.
func roundTrip(t *testing.T, opts umbptest.Options, layers int) {
	srv := newServer(t, opts)
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	const blocks, blockBytes = 16, 512
	a := newEngine(t, rt, layers, blocks, blockBytes)
	b := newEngine(t, rt, layers, blocks, blockBytes)

	src := a.plans(t, "rt", ids(8)...)
	a.fill(src, 0x5a)
	job := a.w.Store(src)
	waitJob(t, a.w, job)
	if job.Status() != umbp.JobCompleted || len(job.CompletedKeys()) != 8 {
		t.Fatalf("store: %s %q", job.Status(), job.Err())
	}
	// Load into B's blocks 8..15, under A's keys.
	dst := make([]umbp.BlockTransferPlan, 8)
	for i := range dst {
		p, err := b.plan.PlanForBlock(src[i].Key, 0, 8+i)
		if err != nil {
			t.Fatal(err)
		}
		dst[i] = p
	}
	job = b.w.Load(dst)
	waitJob(t, b.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("load: %s %q", job.Status(), job.Err())
	}
	b.check(t, dst, 0x5a, ids(8))

	// The bulk paths give the same bytes.
	b2 := newEngine(t, rt, layers, blocks, blockBytes)
	bs := make([]umbp.Block, 8)
	for i, k := range job.Keys() {
		bs[i] = umbp.Block{Key: k, BlockID: i}
	}
	lj := b2.w.LoadBlocks(bs)
	waitJob(t, b2.w, lj)
	if lj.Status() != umbp.JobCompleted {
		t.Fatalf("LoadBlocks: %s %q", lj.Status(), lj.Err())
	}
	b2.check(t, b2.plans(t, "x", ids(8)...), 0x5a, ids(8))
}

func TestRoundTripRanged(t *testing.T) { roundTrip(t, umbptest.Options{}, 12) }

func TestRoundTripWithoutRangedIO(t *testing.T) {
	t.Run("v2-no-ranged", func(t *testing.T) { roundTrip(t, umbptest.Options{DisableRangedIO: true}, 12) })
	t.Run("v1", func(t *testing.T) { roundTrip(t, umbptest.Options{Version: 1}, 12) })
	t.Run("v1-single-range", func(t *testing.T) { roundTrip(t, umbptest.Options{Version: 1}, 1) })
}

func TestStoreBlocksBulkPath(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	a := newEngine(t, rt, 4, 8, 128)
	plans := a.plans(t, "bulk", 0, 1, 2)
	a.fill(plans, 3)
	bare := make([]umbp.Block, len(plans))
	for i, p := range plans {
		bare[i] = umbp.Block{Key: p.Key, BlockID: p.BlockID}
	}
	job := a.w.StoreBlocks(bare)
	waitJob(t, a.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("%s %v", job.Status(), job.Err())
	}
	// Blocks the layout cannot plan fail their own keys, with the
	// planner's error, as not attempted; their siblings still run.
	mixed := []umbp.Block{
		{Key: "b-ok", BlockID: 4},
		{Key: "", BlockID: 5},
		{Key: "b-out", BlockID: 99},
		{Key: "b-group", GroupID: 7},
		{Key: "b-neg", BlockID: -1},
	}
	job = a.w.StoreBlocks(mixed)
	waitJob(t, a.w, job)
	if got := fmt.Sprint(job.CompletedKeys()); got != "[b-ok]" {
		t.Fatalf("completed %s (%v)", got, job.Err())
	}
	for i := 1; i < len(mixed); i++ {
		if err := job.KeyErr(i); !errors.Is(err, umbp.ErrNotAttempted) || !errors.Is(err, umbp.ErrInvalidPlan) {
			t.Errorf("key %d: %v, want ErrNotAttempted and ErrInvalidPlan", i, err)
		}
	}
	// Without a layout every block fails as not attempted, and nothing
	// reaches the server.
	w, err := rt.NewWorkerHandle(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	puts, gets := srv.Calls("BatchPutRanges")+srv.Calls("BatchPut"), srv.Calls("BatchGetRanges")+srv.Calls("BatchGet")
	for _, j := range []*umbp.TransferJob{w.StoreBlocks(bare), w.LoadBlocks(bare)} {
		if j.Status() != umbp.JobFailed || !errors.Is(j.Err(), umbp.ErrInvalidLayout) || !errors.Is(j.KeyErr(0), umbp.ErrNotAttempted) {
			t.Fatalf("a block-wise call without a layout: %s %v; want every key failed, not attempted, ErrInvalidLayout", j.Status(), j.Err())
		}
	}
	if p, g := srv.Calls("BatchPutRanges")+srv.Calls("BatchPut"), srv.Calls("BatchGetRanges")+srv.Calls("BatchGet"); p != puts || g != gets {
		t.Fatal("a block-wise call without a layout reached the server")
	}
}

func TestBadPlansFailOnlyThemselves(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	a := newEngine(t, rt, 2, 4, 256)
	plans := a.plans(t, "ok", 0, 1)
	outside := a.plans(t, "outside", 2)[0]
	outside.Ranges[0].BaseAddress = 0x1000 // not registered
	gap := a.plans(t, "gap", 3)[0]
	gap.Ranges[1].ObjectOffset += 8
	all := []umbp.BlockTransferPlan{plans[0], outside, gap, plans[1]}
	job := a.w.Store(all)
	waitJob(t, a.w, job)
	if job.Status() != umbp.JobFailed {
		t.Fatalf("status %s", job.Status())
	}
	if got := fmt.Sprint(job.CompletedKeys()); got != "[ok-0 ok-1]" {
		t.Fatalf("completed %s", got)
	}
	if got := fmt.Sprint(job.FailedKeys()); got != "[outside-2 gap-3]" {
		t.Fatalf("failed %s", got)
	}
	if fmt.Sprint(job.FailedBlockIDs()) != "[2 3]" {
		t.Fatalf("failed ids %v", job.FailedBlockIDs())
	}
	for _, frag := range []string{`key "outside-2" range 0`, "outside registered memory", "gap-3"} {
		if !strings.Contains(job.Err().Error(), frag) {
			t.Errorf("Err() = %q, want it to mention %q", job.Err(), frag)
		}
	}
	for _, i := range []int{1, 2} {
		if err := job.KeyErr(i); !errors.Is(err, umbp.ErrNotAttempted) || !errors.Is(err, umbp.ErrInvalidPlan) {
			t.Errorf("KeyErr(%d) = %v, want a not-attempted invalid plan", i, err)
		}
		wantReferenceText(t, job.KeyErr(i))
	}
	if err := job.KeyErr(0); err != nil {
		t.Errorf("KeyErr(0) = %v for a key that completed", err)
	}
	// A load of a missing key fails that key only.
	lp := a.plans(t, "ok", 0, 1)
	lp = append(lp, a.plans(t, "never-stored", 2)...)
	lj := a.w.Load(lp)
	waitJob(t, a.w, lj)
	if fmt.Sprint(lj.FailedKeys()) != "[never-stored-2]" || len(lj.CompletedKeys()) != 2 {
		t.Fatalf("load: completed %v failed %v", lj.CompletedKeys(), lj.FailedKeys())
	}
	if err := a.w.Publish(lj); err == nil {
		t.Fatal("Publish of a failed job succeeded")
	}
	if err := a.w.Publish(job); err == nil {
		t.Fatal("Publish of a failed store succeeded")
	}
}

func TestRegisterBuffers(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	w, err := rt.NewWorkerHandle(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	buf, err := umbp.NewHostBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	base := buf.Buffer().Ptr
	goHeap := make([]byte, 4096)
	err = w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{
		"k":      {Ptr: base, Size: 1 << 19, Location: umbp.LocationHost},
		"v":      {Ptr: base + 1<<19, Size: 1 << 19},
		"heap":   {Ptr: uintptr(unsafe.Pointer(&goHeap[0])), Size: 4096, Location: umbp.LocationHost},
		"gpu":    {Ptr: 0xdead0000, Size: 4096, Location: umbp.LocationGPU},
		"empty":  {Ptr: base, Size: 0},
		"spills": {Ptr: base + 1<<19, Size: 1 << 20, Location: umbp.LocationHost},
	})
	if err == nil {
		t.Fatal("bad buffers accepted")
	}
	for _, frag := range []string{`"heap"`, "HostBuffer", `"gpu"`, `"empty"`, `"spills"`} {
		if !strings.Contains(err.Error(), frag) {
			t.Errorf("error %q does not mention %s", err, frag)
		}
	}
	if !errors.Is(err, umbp.ErrNotSupported) && !strings.Contains(err.Error(), "not supported") {
		t.Errorf("GPU buffer error does not say not supported: %v", err)
	}
	if n := srv.Calls("RegisterMemory"); n != 1 {
		t.Fatalf("two buffers in one allocation made %d registrations, want 1", n)
	}
	// Registered memory cannot be let go while the handle holds it.
	if err := buf.Close(); !errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("Close of a registered buffer = %v, want ErrBuffersInUse", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := buf.Close(); err != nil {
		t.Fatalf("Close after the handle deregistered: %v", err)
	}
	if n := srv.Calls("DeregisterMemory"); n != 1 {
		t.Fatalf("DeregisterMemory calls = %d", n)
	}
	if err := w.RegisterBuffers(context.Background(), nil); !errors.Is(err, umbp.ErrClosed) {
		t.Fatalf("register after close = %v", err)
	}
	if job := w.Store(nil); job.Status() == umbp.JobRunning {
		t.Fatal("store after close is running")
	}
}

func TestKilledServerEndsJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	ep := filepath.Join(shortDir(t), "k.grpc.sock")
	p := startServerProcess(t, ep)
	cfg := testConfig(t, ep)
	cfg.Timeout = 5 * time.Second
	rt := newRuntime(t, cfg)
	a := newEngine(t, rt, 8, 64, 4096)
	var jobs []*umbp.TransferJob
	for i := range 16 {
		jobs = append(jobs, a.w.Store(a.plans(t, fmt.Sprintf("kill%d", i), ids(64)...)))
	}
	p.kill()
	for i := range 4 {
		jobs = append(jobs, a.w.Load(a.plans(t, fmt.Sprintf("kill%d", i), ids(64)...)))
	}
	for _, j := range jobs {
		select {
		case <-j.Done():
		case <-time.After(cfg.Timeout + margin):
			t.Fatalf("job %s still %s after the server died", j.Keys()[0], j.Status())
		}
	}
}

// TestJobOwnsItsPlans: an engine may reuse its plan slice as soon as Load
// returns; the job still reports its own keys and blocks.
func TestJobOwnsItsPlans(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	a := newEngine(t, rt, 2, 8, 256)
	stored := a.plans(t, "own", 0)
	waitJob(t, a.w, a.w.Store(stored))
	plans := append(a.plans(t, "own", 0), a.plans(t, "missing", 7)...)
	job := a.w.Load(plans)
	plans[1] = a.plans(t, "other", 3)[0] // reused at once
	waitJob(t, a.w, job)
	if fmt.Sprint(job.FailedKeys()) != "[missing-7]" || fmt.Sprint(job.FailedBlockIDs()) != "[7]" {
		t.Fatalf("job reports failed keys %v blocks %v", job.FailedKeys(), job.FailedBlockIDs())
	}
}

// TestCloseWhileStaging: Close does not keep the registration lock, so a
// running store that needs a staging buffer finishes, and Close abandons
// nothing.
func TestCloseWhileStaging(t *testing.T) {
	srv := newServer(t, umbptest.Options{Version: 1})
	cfg := testConfig(t, srv.Endpoint())
	cfg.NumWorkers = 1
	rt := newRuntime(t, cfg)
	e := newEngine(t, rt, 2, 8, 4096)
	multi := e.plans(t, "m", 1) // two ranges: staged
	single := e.plans(t, "s", 2)
	single[0].Ranges = single[0].Ranges[:1]
	srv.Stall()
	job := e.w.Store(append(single, multi...))
	waitCalls(t, srv, "BatchPut", 1)
	errc := make(chan error, 1)
	go func() { errc <- e.w.Close() }()
	waitFor(t, "Close to begin", func() bool { return e.w.State() == umbp.StateClosed })
	srv.Resume()
	if err := <-errc; err != nil {
		t.Fatalf("Close = %v, want nil: nothing was left in the server", err)
	}
	awaitEnd(t, job)
}

// TestFallbackKeyErrors: on a server without ranged I/O, single-range blocks
// and multi-range blocks (staged) travel in separate requests, and each key
// carries the error of its own request only.
func TestFallbackKeyErrors(t *testing.T) {
	srv := newServer(t, umbptest.Options{DisableRangedIO: true})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 4, 4, 512)
	multi := e.plans(t, "multi", 0)
	// Block 1 of the first layer alone: one range, sent as a plain segment.
	single := umbp.BlockTransferPlan{Key: "single", Ranges: []umbp.KVRange{{
		BaseAddress: e.layout.Regions[0].BaseAddress + 512, Length: 512, LayerName: "layer.0",
	}}}
	// A handle without a layout prepares no staging buffer: the one its
	// first staged load makes fails to register; the plain request is
	// answered (a miss).
	w := newBareEngine(t, rt, e.buf)
	defer w.Close()
	srv.FailNext("FDHandoff", 1)
	job := w.Load([]umbp.BlockTransferPlan{single, multi[0]})
	waitJob(t, w, job)
	if job.Status() != umbp.JobFailed || len(job.FailedKeys()) != 2 {
		t.Fatalf("load: %s, failed %v", job.Status(), job.FailedKeys())
	}
	miss, staged := job.KeyErr(0), job.KeyErr(1)
	if !errors.Is(miss, umbp.ErrNotInPool) || strings.Contains(miss.Error(), "FDHandoff") || strings.Contains(miss.Error(), "staging") {
		t.Errorf("the missing single-range key carries %v, want a plain miss", miss)
	}
	if errors.Is(staged, umbp.ErrNotInPool) || !strings.Contains(staged.Error(), "staging") {
		t.Errorf("the staged key carries %v, want the staging buffer's error", staged)
	}
	if !errors.Is(staged, umbp.ErrNotAttempted) {
		t.Errorf("the staged key carries %v, want ErrNotAttempted: without a staging buffer nothing went out", staged)
	}
}

// TestTransferInParts: a job of more ranges than one part holds goes to the
// server as several requests, run concurrently, and moves every byte.
func TestTransferInParts(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	const layers, blocks = 32, 600 // 19200 ranges: 3 parts of at most 8192
	a := newEngine(t, rt, layers, blocks, 256)
	b := newEngine(t, rt, layers, blocks, 256)
	plans := a.plans(t, "parts", ids(blocks)...)
	a.fill(plans, 0x3c)
	before := srv.Calls("BatchPutRanges")
	job := a.w.Store(plans)
	waitJob(t, a.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("store: %s %q", job.Status(), job.Err())
	}
	if n := srv.Calls("BatchPutRanges") - before; n != 3 {
		t.Fatalf("the store made %d requests, want 3", n)
	}
	before = srv.Calls("BatchGetRanges")
	loads := b.plans(t, "parts", ids(blocks)...)
	job = b.w.Load(loads)
	waitJob(t, b.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("load: %s %q", job.Status(), job.Err())
	}
	if n := srv.Calls("BatchGetRanges") - before; n != 3 {
		t.Fatalf("the load made %d requests, want 3", n)
	}
	b.check(t, loads, 0x3c, ids(blocks))
}

// TestStoreRetryTransportFails: a store retry whose transport fails ends the
// key with that error, like a first attempt that failed so, instead of being
// dropped as a plain refusal.
func TestStoreRetryTransportFails(t *testing.T) {
	t.Cleanup(umbp.SetStoreRetryBackoff([]time.Duration{2 * time.Second}))
	srv := newServer(t, umbptest.Options{Capacity: 4096})
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 10 * time.Second
	rt := newRuntime(t, cfg)
	e := newEngine(t, rt, 1, 4, 8192) // a block larger than the pool: refused
	plans := e.plans(t, "big", 0)
	before := srv.Calls("BatchPut")
	job := e.w.Store(plans) // one host range: a plain segment
	// The retry comes 2 s after the refused first attempt: make it fail in
	// transport.
	waitCalls(t, srv, "BatchPut", before+1)
	srv.FailNext("BatchPut", 1)
	waitJob(t, e.w, job)
	if job.Status() != umbp.JobFailed || !errors.Is(job.KeyErr(0), umbp.ErrUnavailable) {
		t.Fatalf("store: %s, key error %v; want the retry's transport error", job.Status(), job.KeyErr(0))
	}
}

// TestStoreEndsWithoutFlush: a store is done when its BatchPut answers (the
// server copies on to a lower tier from its pool, never from the engine's
// memory), so no store waits for a Flush; a refused key's retry, on a server
// without ranged I/O, follows one.
func TestStoreEndsWithoutFlush(t *testing.T) {
	t.Cleanup(umbp.SetStoreRetryBackoff([]time.Duration{time.Millisecond}))
	srv := newServer(t, umbptest.Options{Version: 1, Capacity: 64 << 10})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 1, 4, 16<<10)
	job := e.w.Store(e.plans(t, "fits", 0, 1))
	waitJob(t, e.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("store: %s %v", job.Status(), job.Err())
	}
	if n := srv.Calls("Flush"); n != 0 {
		t.Fatalf("a store that the server took sent %d Flush calls", n)
	}
	big := newEngine(t, rt, 1, 1, 128<<10) // larger than the pool: refused
	job = big.w.Store(big.plans(t, "big", 0))
	waitJob(t, big.w, job)
	if !errors.Is(job.KeyErr(0), umbp.ErrRefused) {
		t.Fatalf("store of an object larger than the pool: %v, want ErrRefused", job.KeyErr(0))
	}
	if n := srv.Calls("Flush"); n != 1 {
		t.Fatalf("a refused key's retry followed %d Flush calls, want 1", n)
	}
}

// TestStagingBufferBackOnceServerExits: a staging buffer whose request's
// transport failed is used again once that server process has exited, not
// kept aside (registered, on every later server) until Close.
func TestStagingBufferBackOnceServerExits(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	ep := filepath.Join(shortDir(t), "s.grpc.sock")
	p := startServerProcess(t, ep, "-prefault=false", "-version", "1")
	cfg := testConfig(t, ep)
	cfg.Timeout = 300 * time.Millisecond
	rt := newRuntime(t, cfg)
	a := newEngine(t, rt, 2, 8, 4096) // two ranges a block: staged
	waitJob(t, a.w, a.w.Store(a.plans(t, "warm", 0)))
	if all, free := umbp.StagingBuffers(a.w); all != 1 || free != 1 {
		t.Fatalf("staging buffers after the warm-up: %d, %d free; want 1, 1", all, free)
	}
	p.signal(syscall.SIGSTOP) // the next store is sent and never answered
	stuck := a.w.Store(a.plans(t, "stuck", 1))
	waitFor(t, "the store to block", func() bool { return a.w.Stats().Transfers.Blocked == 1 })
	p.kill() // its transport fails; its server is gone
	awaitEnd(t, stuck)
	waitFor(t, "the staging buffer to come back", func() bool { _, free := umbp.StagingBuffers(a.w); return free == 1 })

	startServerProcess(t, ep, "-prefault=false", "-version", "1")
	waitReconnects(t, a.w, 1)
	waitJob(t, a.w, a.w.Store(a.plans(t, "after", 2)))
	if all, _ := umbp.StagingBuffers(a.w); all != 1 {
		t.Fatalf("%d staging buffers after the restart, want the first one again", all)
	}
}

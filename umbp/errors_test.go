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

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// checkKeyErr waits for job and checks that key i's outcome reaches the
// caller matching want through KeyErr, Err and Wait alike.
func checkKeyErr(t *testing.T, w *umbp.WorkerHandle, job *umbp.TransferJob, i int, want error) {
	t.Helper()
	err := w.Wait(context.Background(), job)
	if !errors.Is(err, want) {
		t.Errorf("Wait = %v, want it to match %v", err, want)
	}
	if !errors.Is(job.Err(), want) {
		t.Errorf("Err = %v, want it to match %v", job.Err(), want)
	}
	if !errors.Is(job.KeyErr(i), want) {
		t.Errorf("KeyErr(%d) = %v, want it to match %v", i, job.KeyErr(i), want)
	}
}

func TestSentinelNotAttempted(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 2, 4, 256)
	bad := e.plans(t, "bad", 0)
	bad[0].Ranges[0].BaseAddress = 0x1000 // outside registered memory
	job := e.w.Store(bad)
	checkKeyErr(t, e.w, job, 0, umbp.ErrNotAttempted)
	checkKeyErr(t, e.w, job, 0, umbp.ErrInvalidPlan)
	wantReferenceText(t, job.KeyErr(0))
}

// wantReferenceText checks the text of a not-attempted key's error: it
// starts as vLLM's runtime prints it, for logs that engines parse.
func wantReferenceText(t *testing.T, err error) {
	t.Helper()
	if msg := fmt.Sprint(err); !strings.HasPrefix(msg, "transfer not attempted: ") {
		t.Errorf("%q does not start as vLLM's runtime prints it", msg)
	}
}

func TestSentinelNotInPool(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 2, 4, 256)
	job := e.w.Load(e.plans(t, "never-stored", 1))
	checkKeyErr(t, e.w, job, 0, umbp.ErrNotInPool)
	if errors.Is(job.KeyErr(0), umbp.ErrNotAttempted) {
		t.Errorf("a miss was attempted: %v", job.KeyErr(0))
	}
}

func TestSentinelRefused(t *testing.T) {
	srv := newServer(t, umbptest.Options{Capacity: 4096})
	defer umbp.SetStoreRetryBackoff(nil)()
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 1, 4, 8192) // a block larger than the pool
	job := e.w.Store(e.plans(t, "big", 0))
	checkKeyErr(t, e.w, job, 0, umbp.ErrRefused)
	if msg := job.KeyErr(0).Error(); !strings.Contains(msg, "8192 bytes") {
		t.Errorf("KeyErr(0) = %q, want it to give the object's size", msg)
	}
}

func TestSentinelUnavailable(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 2, 4, 256)
	srv.FailNext("BatchGetRanges", 1)
	job := e.w.Load(e.plans(t, "k", 0))
	checkKeyErr(t, e.w, job, 0, umbp.ErrUnavailable)
}

func TestSentinelClosed(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 2, 4, 256)
	if err := e.w.Close(); err != nil {
		t.Fatal(err)
	}
	job := e.w.Store(e.plans(t, "k", 0))
	checkKeyErr(t, e.w, job, 0, umbp.ErrClosed)
	checkKeyErr(t, e.w, job, 0, umbp.ErrNotAttempted)
	if err := e.w.RegisterBuffers(t.Context(), map[string]umbp.Buffer{"kv": e.buf.Buffer()}); !errors.Is(err, umbp.ErrClosed) {
		t.Errorf("RegisterBuffers after Close = %v, want ErrClosed", err)
	}
}

func TestSentinelCancelled(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.NumWorkers = 1
	rt := newRuntime(t, cfg)
	e := newEngine(t, rt, 2, 4, 256)
	srv.Stall("BatchPutRanges")
	defer srv.Resume()
	first := e.w.Store(e.plans(t, "first", 0))
	waitCalls(t, srv, "BatchPutRanges", 1) // the one goroutine is busy
	queued := e.w.Store(e.plans(t, "queued", 1))
	e.w.Cancel(queued)
	checkKeyErr(t, e.w, queued, 0, umbp.ErrCancelled)
	if queued.Status() != umbp.JobCancelled {
		t.Errorf("status %s, want CANCELLED", queued.Status())
	}
	srv.Resume()
	waitJob(t, e.w, first)
}

func TestSentinelBuffersInUse(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 200 * time.Millisecond
	rt := newRuntime(t, cfg)
	e := newEngine(t, rt, 2, 4, 256)
	srv.Stall("BatchPutRanges")
	defer srv.Resume()
	job := e.w.Store(e.plans(t, "k", 0))
	waitCalls(t, srv, "BatchPutRanges", 1) // running: Wait bounds it by its deadline
	if err := e.w.Wait(context.Background(), job); !errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("Wait = %v, want ErrBuffersInUse", err)
	}
	if job.Err() != nil || job.KeyErr(0) != nil || job.Status() != umbp.JobRunning {
		t.Fatalf("blocked job: %s, Err %v, KeyErr %v; want RUNNING without errors", job.Status(), job.Err(), job.KeyErr(0))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.w.Wait(ctx, job); !errors.Is(err, umbp.ErrBuffersInUse) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with an ended context = %v, want ErrBuffersInUse and context.Canceled", err)
	}
	if err := e.w.Publish(job); !errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("Publish of a running store = %v, want ErrBuffersInUse", err)
	}
	srv.Resume()
	awaitEnd(t, job) // past its deadline, Wait would answer at once
	if err := e.w.Publish(job); err != nil {
		t.Fatalf("Publish of a completed store = %v", err)
	}
}

func TestNilJob(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	w, err := rt.NewWorkerHandle(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Every method answers a nil job without panicking.
	var job *umbp.TransferJob
	if err := w.Wait(t.Context(), job); !errors.Is(err, umbp.ErrInvalidPlan) {
		t.Errorf("Wait(nil) = %v", err)
	}
	if !w.Poll(job) {
		t.Error("Poll(nil) = false")
	}
	w.Cancel(job)
	if err := w.Publish(job); err == nil {
		t.Error("Publish(nil) = nil")
	}
	if job.Status() != umbp.JobFailed || job.Err() == nil || job.KeyErr(0) == nil || job.Keys() != nil || job.Plans() != nil {
		t.Error("a nil job's accessors do not report a failed job")
	}
	awaitEnd(t, job)
}

// TestAbandonedBuffersComeBack: a store blocked in a stopped server process
// makes Close abandon the handle's buffer; once the process runs again and
// the store ends, the handle deregisters the buffer, Stats says nothing is
// abandoned, and the HostBuffer closes.
func TestAbandonedBuffersComeBack(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server process")
	}
	ep := "unix://" + filepath.Join(shortDir(t), "s.sock")
	p := startServerProcess(t, ep, "-prefault=false")
	cfg := testConfig(t, ep)
	cfg.Timeout = time.Second // a job still queued then would fail as not attempted
	rt := newRuntime(t, cfg)
	buf, err := umbp.NewHostBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	w := newBareEngine(t, rt, buf)
	p.signal(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			p.signal(syscall.SIGCONT)
		}
	}()
	job := w.Store([]umbp.BlockTransferPlan{plan("k", buf, 0)})
	if err := w.Wait(t.Context(), job); !errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("Wait on a stopped server = %v, want ErrBuffersInUse", err)
	}
	if err := w.Close(); !errors.Is(err, umbp.ErrBuffersAbandoned) {
		t.Fatalf("Close = %v, want ErrBuffersAbandoned", err)
	}
	if s := w.Stats(); s.Transfers.AbandonedBuffers != 1 || s.Transfers.AbandonedBytes != 1<<16 {
		t.Fatalf("Stats: %d buffers, %d bytes abandoned; want 1 and %d", s.Transfers.AbandonedBuffers, s.Transfers.AbandonedBytes, 1<<16)
	}
	if err := buf.Close(); !errors.Is(err, umbp.ErrBuffersAbandoned) {
		t.Fatalf("HostBuffer.Close while abandoned = %v, want ErrBuffersAbandoned", err)
	}
	p.signal(syscall.SIGCONT)
	stopped = false
	awaitEnd(t, job)
	waitFor(t, "the abandoned buffer to come back", func() bool { return w.Stats().Transfers.AbandonedBytes == 0 })
	if s := w.Stats(); s.Transfers.AbandonedBuffers != 0 {
		t.Fatalf("Stats: %d buffers still abandoned", s.Transfers.AbandonedBuffers)
	}
	if err := buf.Close(); err != nil {
		t.Fatalf("HostBuffer.Close after the store ended = %v", err)
	}
}

func TestRegistrationRefusals(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	buf, err := umbp.NewHostBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	w := newBareEngine(t, rt, buf) // registered as "kv"
	defer func() {
		if err := w.Close(); err != nil {
			t.Error(err)
		}
		if err := buf.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx := t.Context()
	whole := buf.Buffer()
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": whole}); err != nil {
		t.Errorf("the same name and memory again = %v, want nil", err)
	}
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"alias": whole}); !errors.Is(err, umbp.ErrInvalidBuffer) || !strings.Contains(err.Error(), `already registered as "kv"`) {
		t.Errorf("the same memory under another name = %v, want a refusal naming kv", err)
	}
	half := whole
	half.Size /= 2
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": half}); !errors.Is(err, umbp.ErrInvalidBuffer) || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("the name for other memory = %v, want a refusal", err)
	}
	other, err := umbp.NewHostBuffer(1 << 12)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	big := other.Buffer()
	big.Size = 1 << 20
	err = w.RegisterBuffers(ctx, map[string]umbp.Buffer{"big": big})
	if !errors.Is(err, umbp.ErrInvalidBuffer) || !strings.Contains(err.Error(), "run past the end of the HostBuffer") {
		t.Errorf("a buffer larger than its HostBuffer = %v, want it to say so", err)
	}
	if s := srv.Stats(); s.Regions != 1 {
		t.Errorf("the server holds %d regions, want 1: refusals reached it", s.Regions)
	}
}

func TestImpossibleHostBuffer(t *testing.T) {
	b, err := umbp.NewHostBuffer(1 << 46)
	if err == nil {
		b.Close()
		t.Fatal("NewHostBuffer(64 TiB) succeeded")
	}
	if !strings.Contains(err.Error(), "umbp: host buffer: 70368744177664 bytes are more than this host's memory") {
		t.Errorf("NewHostBuffer(64 TiB) = %v", err)
	}
}

func TestJobErrorText(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 2, 4, 256)
	job := e.w.Load(e.plans(t, "absent", 0))
	waitJob(t, e.w, job)
	at := " at " + srv.Endpoint() + ": "
	if msg := job.Err().Error(); !strings.HasPrefix(msg, "umbp: load"+at+"1 of 1 key failed: not in the pool") {
		t.Errorf("one missing key: %q", msg)
	}
	plans := append(e.plans(t, "absent", 0, 1), e.plans(t, "bad", 2)...)
	plans[2].Ranges[0].BaseAddress = 0x1000
	job = e.w.Load(plans)
	waitJob(t, e.w, job)
	msg := job.Err().Error()
	// The misses read as one group, the other error on its own.
	want := "umbp: load" + at + `3 of 3 keys failed: 2 keys: not in the pool: keys "absent-0", "absent-1" (or stored with other sizes); 1 key: transfer not attempted: invalid transfer plan: key "bad-2"`
	if !strings.HasPrefix(msg, want) {
		t.Errorf("a miss of two keys and a bad plan:\n got %q\nwant %q…", msg, want)
	}
	// Many misses: the first few keys are named, the rest counted; each
	// error is still matched and kept.
	job = e.w.Load(e.plans(t, "absent", 0, 1, 2, 3))
	waitJob(t, e.w, job)
	msg = job.Err().Error()
	want = `umbp: load` + at + `4 of 4 keys failed: not in the pool: keys "absent-0", "absent-1", "absent-2" and 1 more (or stored with other sizes)`
	if msg != want {
		t.Errorf("four missing keys:\n got %q\nwant %q", msg, want)
	}
	var oe *umbp.OpError
	if !errors.As(job.Err(), &oe) || oe.Op != "load" || oe.Addr != srv.Endpoint() {
		t.Errorf("the job's error %#v is not an OpError of the load at the server", job.Err())
	} else if n := len(oe.Err.(interface{ Unwrap() []error }).Unwrap()); n != 4 {
		t.Errorf("the job's error holds %d errors, want 4", n)
	}
	if !errors.Is(job.KeyErr(3), umbp.ErrNotInPool) || !strings.Contains(job.KeyErr(3).Error(), `"absent-3"`) {
		t.Errorf("KeyErr(3) = %v", job.KeyErr(3))
	}
	// Many distinct errors: the first few are spelled out, the rest
	// counted.
	plans = append(e.plans(t, "bad", 0, 1, 2), e.plans(t, "absent", 3)...)
	for i := range 3 {
		plans[i].Ranges[0].BaseAddress = 0x1000
	}
	job = e.w.Load(plans)
	waitJob(t, e.w, job)
	msg = job.Err().Error()
	want = `umbp: load` + at + `4 of 4 keys failed: 1 key: transfer not attempted: invalid transfer plan: key "bad-0"`
	if !strings.HasPrefix(msg, want) || !strings.HasSuffix(msg, "; and 1 more key (1 other error)") || strings.Contains(msg, `"absent-3"`) {
		t.Errorf("four distinct errors: %q", msg)
	}
	// One error for every key: said once, without a count.
	if err := e.w.Close(); err != nil {
		t.Fatal(err)
	}
	job = e.w.Store(e.plans(t, "late", 0, 1, 2))
	if msg := job.Err().Error(); msg != "umbp: store"+at+"3 of 3 keys failed: transfer not attempted: handle is closed" {
		t.Errorf("a store on a closed handle: %q", msg)
	}
}

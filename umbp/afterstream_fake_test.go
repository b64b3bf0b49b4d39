package umbp_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/umbp"
)

// TestAfterStreamNeverReached: a store whose engine stream never reaches its
// event fails as not attempted at the transfer's deadline, sends nothing to
// the server, and leaves the handle usable.
func TestAfterStreamNeverReached(t *testing.T) {
	rt := useFakeGPU(t)
	srv, _ := fakeGPUServer(t, rt)
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = 300 * time.Millisecond
	urt := newRuntime(t, cfg)
	a := gpuMalloc(t, rt, fakeDev, 64<<10)
	w := gpuWorker(t, urt)
	if err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{"kv": {Ptr: a, Size: 64 << 10}}); err != nil {
		t.Fatal(err)
	}
	stream, err := rt.StreamCreate(fakeDev)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.StreamDestroy(fakeDev, stream)
	plans := []umbp.BlockTransferPlan{gpuPlan("late", gpuSpan{a, 4096})}

	t.Setenv("UMBP_FAKE_EVENTS_PENDING", "1")
	start := time.Now()
	job := w.Store(plans, umbp.AfterStream(fakeDev, uintptr(stream)))
	waitJob(t, w, job)
	took := time.Since(start)
	if job.Status() != umbp.JobFailed || !errors.Is(job.Err(), umbp.ErrNotAttempted) ||
		!strings.Contains(job.Err().Error(), "did not reach") {
		t.Fatalf("store after a stream that never gets there: %s %v", job.Status(), job.Err())
	}
	if took < cfg.Timeout || took > 10*time.Second {
		t.Errorf("the store ended after %v; want at its deadline (%v)", took, cfg.Timeout)
	}
	if st := srv.Stats(); st.Objects != 0 {
		t.Fatalf("%d objects stored; the store must not reach the server", st.Objects)
	}
	if st := w.Stats(); st.Transfers.Blocked != 0 {
		t.Fatalf("%d transfers blocked after a late stream", st.Transfers.Blocked)
	}

	t.Setenv("UMBP_FAKE_EVENTS_PENDING", "")
	gpuWantCompleted(t, w, w.Store(plans, umbp.AfterStream(fakeDev, uintptr(stream))), "store once the stream gets there")
}

// afterStreamLoadEnv is a fake GPU worker (Timeout timeout) with one key
// stored in the pool, and a destination for it that holds other bytes: the
// ones kernels queued earlier on the engine's stream would still be reading.
type afterStreamLoadEnv struct {
	rt       *hip.Runtime
	w        *umbp.WorkerHandle
	calls    *methodCounter
	stream   hip.Stream
	dst      []umbp.BlockTransferPlan
	obj, old []byte
}

func newAfterStreamLoadEnv(t *testing.T, timeout time.Duration) *afterStreamLoadEnv {
	t.Helper()
	rt := useFakeGPU(t)
	srv, _ := fakeGPUServer(t, rt)
	cfg := testConfig(t, srv.Endpoint())
	cfg.Timeout = timeout
	calls := &methodCounter{calls: map[string]int{}}
	cfg.StatsHandler = calls
	a := gpuMalloc(t, rt, fakeDev, 64<<10)
	w := gpuWorker(t, newRuntime(t, cfg))
	if err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{"kv": {Ptr: a, Size: 64 << 10}}); err != nil {
		t.Fatal(err)
	}
	stream, err := rt.StreamCreate(fakeDev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.StreamDestroy(fakeDev, stream); err != nil {
			t.Errorf("StreamDestroy: %v", err)
		}
	})
	e := &afterStreamLoadEnv{rt: rt, w: w, calls: calls, stream: stream,
		obj: gpuPattern(8192, 0x3c), old: gpuPattern(8192, 0xc3)}
	// Two ranges each side, so that the load is one ranged request.
	src := gpuPlan("blk", gpuSpan{a, 4096}, gpuSpan{a + 16<<10, 4096})
	e.dst = []umbp.BlockTransferPlan{gpuPlan("blk", gpuSpan{a + 32<<10, 4096}, gpuSpan{a + 48<<10, 4096})}
	gpuWritePlan(t, rt, fakeDev, src, e.obj)
	gpuWantCompleted(t, w, w.Store([]umbp.BlockTransferPlan{src}), "store")
	gpuWritePlan(t, rt, fakeDev, e.dst[0], e.old)
	return e
}

// untouched fails t unless the destination still holds its old bytes and
// no load request has been sent.
func (e *afterStreamLoadEnv) untouched(t *testing.T, when string) {
	t.Helper()
	if got := gpuReadPlan(t, e.rt, fakeDev, e.dst[0]); !bytes.Equal(got, e.old) {
		t.Fatalf("%s: the destination was written", when)
	}
	if n := e.calls.count("BatchGet") + e.calls.count("BatchGetRanges"); n != 0 {
		t.Fatalf("%s: %d load requests sent", when, n)
	}
}

// TestAfterStreamLoadWaits: a load with AfterStream writes nothing into its
// destination while the engine's stream has not reached its event, and
// loads once it has.
func TestAfterStreamLoadWaits(t *testing.T) {
	e := newAfterStreamLoadEnv(t, time.Minute) // a deadline this test never meets
	pending := make(chan struct{}, 1)
	t.Cleanup(umbp.SetStreamPendingHook(func() {
		select {
		case pending <- struct{}{}:
		default:
		}
	}))

	t.Setenv("UMBP_FAKE_EVENTS_PENDING", "1")
	job := e.w.Load(e.dst, umbp.AfterStream(fakeDev, uintptr(e.stream)))
	select {
	case <-pending: // the load has found the stream short of its event
	case <-job.Done():
		t.Fatalf("the load ended (%s: %v) without waiting for the stream", job.Status(), job.Err())
	case <-time.After(10 * time.Second):
		t.Fatal("the load neither waited for the stream nor ended")
	}
	// It cannot leave its wait before the stream gets there.
	if job.Status() != umbp.JobRunning {
		t.Fatalf("load waiting for the stream: %s %v", job.Status(), job.Err())
	}
	e.untouched(t, "while the stream has not got there")

	// The stream gets there. (The fake reads the variable as it polls;
	// glibc replaces an existing variable's value without freeing the old.)
	t.Setenv("UMBP_FAKE_EVENTS_PENDING", "")
	gpuWantCompleted(t, e.w, job, "load once the stream gets there")
	if got := gpuReadPlan(t, e.rt, fakeDev, e.dst[0]); !bytes.Equal(got, e.obj) {
		t.Fatal("loaded bytes differ")
	}
}

// TestAfterStreamLoadNeverReached: a load whose engine stream never reaches
// its event fails as not attempted at the transfer's deadline, sends
// nothing to the server, leaves its destination untouched and the handle
// usable; LoadBlocks takes the option too.
func TestAfterStreamLoadNeverReached(t *testing.T) {
	const timeout = 300 * time.Millisecond
	e := newAfterStreamLoadEnv(t, timeout)

	t.Setenv("UMBP_FAKE_EVENTS_PENDING", "1")
	start := time.Now()
	job := e.w.Load(e.dst, umbp.AfterStream(fakeDev, uintptr(e.stream)))
	waitJob(t, e.w, job)
	took := time.Since(start)
	if job.Status() != umbp.JobFailed || !errors.Is(job.Err(), umbp.ErrNotAttempted) ||
		!strings.Contains(job.Err().Error(), "did not reach") {
		t.Fatalf("load after a stream that never gets there: %s %v", job.Status(), job.Err())
	}
	if took < timeout || took > 10*time.Second {
		t.Errorf("the load ended after %v; want at its deadline (%v)", took, timeout)
	}
	e.untouched(t, "after a late stream")
	if st := e.w.Stats(); st.Transfers.Blocked != 0 {
		t.Fatalf("%d transfers blocked after a late stream", st.Transfers.Blocked)
	}

	t.Setenv("UMBP_FAKE_EVENTS_PENDING", "")
	gpuWantCompleted(t, e.w, e.w.Load(e.dst, umbp.AfterStream(fakeDev, uintptr(e.stream))), "load once the stream gets there")
	if got := gpuReadPlan(t, e.rt, fakeDev, e.dst[0]); !bytes.Equal(got, e.obj) {
		t.Fatal("loaded bytes differ")
	}
}

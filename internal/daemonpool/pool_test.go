package daemonpool

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newPool(t *testing.T, workers int) *Pool {
	t.Helper()
	p, err := New(workers, t.Name())
	if err != nil {
		t.Fatalf("New(%d): %v", workers, err)
	}
	t.Cleanup(func() { p.Shutdown(true, true) })
	return p
}

func submit(t *testing.T, p *Pool, fn func() (any, error)) *Future {
	t.Helper()
	f, err := p.Submit(fn)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return f
}

func waitDone(t *testing.T, f *Future) (any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := f.Wait(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("future not done after 5s (state %v)", f.State())
	}
	return v, err
}

func TestNewRejectsNonPositiveWorkers(t *testing.T) {
	for _, n := range []int{0, -1} {
		p, err := New(n, "bad")
		if err == nil || p != nil {
			t.Fatalf("New(%d) = %v, %v; want error", n, p, err)
		}
		if !strings.Contains(err.Error(), "bad") || !strings.Contains(err.Error(), "workers") {
			t.Errorf("New(%d) error %q should name the pool and the field", n, err)
		}
	}
}

func TestResultsAndErrors(t *testing.T) {
	p := newPool(t, 2)
	boom := errors.New("boom")
	var futs []*Future
	for i := range 50 {
		futs = append(futs, submit(t, p, func() (any, error) {
			if i%5 == 0 {
				return i, boom
			}
			return i * i, nil
		}))
	}
	for i, f := range futs {
		v, err := waitDone(t, f)
		if i%5 == 0 {
			if !errors.Is(err, boom) || v != i {
				t.Errorf("future %d: got %v, %v; want %d, boom", i, v, err, i)
			}
		} else if err != nil || v != i*i {
			t.Errorf("future %d: got %v, %v; want %d, nil", i, v, err, i*i)
		}
		if f.State() != StateDone || !f.Started() || f.Running() || f.Cancelled() {
			t.Errorf("future %d: state %v after completion", i, f.State())
		}
		if v2, err2 := f.Result(); v2 != v || err2 != err {
			t.Errorf("future %d: Result() = %v, %v; Wait gave %v, %v", i, v2, err2, v, err)
		}
		if f.Cancel() {
			t.Errorf("future %d: Cancel after completion succeeded", i)
		}
	}
}

func TestResultBeforeDone(t *testing.T) {
	p := newPool(t, 1)
	gate := make(chan struct{})
	f := submit(t, p, func() (any, error) { <-gate; return "ok", nil })
	if _, err := f.Result(); !errors.Is(err, ErrNotDone) {
		t.Fatalf("Result before done: err %v, want ErrNotDone", err)
	}
	close(gate)
	if v, err := waitDone(t, f); v != "ok" || err != nil {
		t.Fatalf("got %v, %v", v, err)
	}
}

func TestPanicBecomesError(t *testing.T) {
	p := newPool(t, 1)
	f := submit(t, p, func() (any, error) { panic("kaboom") })
	_, err := waitDone(t, f)
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Value != "kaboom" {
		t.Fatalf("err = %v, want *PanicError with value kaboom", err)
	}
	if !strings.Contains(pe.Error(), "kaboom") || !strings.Contains(string(pe.Stack), "TestPanicBecomesError") {
		t.Errorf("panic error %q / stack lacks detail:\n%s", pe.Error(), pe.Stack)
	}

	// A panic with an error value unwraps to it.
	f = submit(t, p, func() (any, error) { panic(io.ErrUnexpectedEOF) })
	if _, err := waitDone(t, f); !errors.Is(err, io.ErrUnexpectedEOF) || !errors.As(err, &pe) {
		t.Fatalf("err = %v, want PanicError wrapping io.ErrUnexpectedEOF", err)
	}

	// panic(nil) is a panic too.
	f = submit(t, p, func() (any, error) { panic(nil) })
	if _, err := waitDone(t, f); !errors.As(err, &pe) {
		t.Fatalf("panic(nil): err = %v, want *PanicError", err)
	}

	// The single goroutine survived all of that.
	f = submit(t, p, func() (any, error) { return 7, nil })
	if v, err := waitDone(t, f); v != 7 || err != nil {
		t.Fatalf("after panics: got %v, %v", v, err)
	}
}

func TestGoexitBecomesErrorAndWorkerIsReplaced(t *testing.T) {
	p := newPool(t, 1)
	f := submit(t, p, func() (any, error) { runtime.Goexit(); return nil, nil })
	if _, err := waitDone(t, f); !errors.Is(err, ErrGoexit) {
		t.Fatalf("err = %v, want ErrGoexit", err)
	}
	f = submit(t, p, func() (any, error) { return "alive", nil })
	if v, err := waitDone(t, f); v != "alive" || err != nil {
		t.Fatalf("after Goexit: got %v, %v", v, err)
	}
	p.Shutdown(true, false)
	select {
	case <-p.Terminated():
	default:
		t.Fatal("Terminated not closed after Shutdown(wait=true)")
	}
}

// blockPool fills every goroutine of p with a call blocked on the returned
// gate, and waits until all of them are running.
func blockPool(t *testing.T, p *Pool) (gate chan struct{}, running []*Future) {
	t.Helper()
	gate = make(chan struct{})
	started := make(chan struct{}, p.Workers())
	for range p.Workers() {
		running = append(running, submit(t, p, func() (any, error) {
			started <- struct{}{}
			<-gate
			return "released", nil
		}))
	}
	for range p.Workers() {
		<-started
	}
	return gate, running
}

func TestCancelQueued(t *testing.T) {
	p := newPool(t, 1)
	gate, running := blockPool(t, p)
	var ran atomic.Bool
	queued := submit(t, p, func() (any, error) { ran.Store(true); return nil, nil })
	after := submit(t, p, func() (any, error) { return "after", nil })

	if queued.State() != StatePending || queued.Started() {
		t.Fatalf("queued future state %v", queued.State())
	}
	if running[0].Cancel() {
		t.Fatal("Cancel of a running future succeeded")
	}
	if !running[0].Running() || !running[0].Started() {
		t.Fatalf("running future state %v", running[0].State())
	}
	if !queued.Cancel() {
		t.Fatal("Cancel of a queued future failed")
	}
	if !queued.Cancel() {
		t.Fatal("second Cancel of a cancelled future should report true")
	}
	select {
	case <-queued.Done():
	default:
		t.Fatal("cancelled future not done")
	}
	if _, err := queued.Result(); !errors.Is(err, ErrCancelled) {
		t.Fatalf("cancelled Result err = %v", err)
	}
	if !queued.Cancelled() || queued.State() != StateCancelled || queued.Started() {
		t.Fatalf("cancelled future state %v", queued.State())
	}

	close(gate)
	if v, err := waitDone(t, after); v != "after" || err != nil {
		t.Fatalf("after: %v, %v", v, err)
	}
	if v, err := waitDone(t, running[0]); v != "released" || err != nil {
		t.Fatalf("running: %v, %v", v, err)
	}
	if ran.Load() {
		t.Fatal("cancelled call ran")
	}
}

func TestWaitContext(t *testing.T) {
	p := newPool(t, 1)
	gate, running := blockPool(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := running[0].Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait err = %v, want DeadlineExceeded", err)
	}
	if !running[0].Running() {
		t.Fatal("Wait timing out changed the call's state")
	}
	close(gate)
	waitDone(t, running[0])
	// A done future answers even with an ended context.
	if v, err := running[0].Wait(ctx); v != "released" || err != nil {
		t.Fatalf("Wait on done future with ended ctx: %v, %v", v, err)
	}
}

func TestShutdownCancelQueued(t *testing.T) {
	p := newPool(t, 2)
	gate, running := blockPool(t, p)
	var ran atomic.Int32
	var queued []*Future
	for range 10 {
		queued = append(queued, submit(t, p, func() (any, error) { ran.Add(1); return nil, nil }))
	}
	if got := p.Queued(); got != 10 {
		t.Fatalf("Queued() = %d, want 10", got)
	}
	p.Shutdown(false, true)
	for i, f := range queued {
		select {
		case <-f.Done():
		default:
			t.Fatalf("queued future %d not done after Shutdown(cancelQueued)", i)
		}
		if _, err := f.Result(); !errors.Is(err, ErrCancelled) {
			t.Fatalf("queued future %d err = %v", i, err)
		}
	}
	if p.Queued() != 0 {
		t.Fatalf("Queued() = %d after cancel", p.Queued())
	}
	// Running calls are not cancelled; they finish normally.
	close(gate)
	for _, f := range running {
		if v, err := waitDone(t, f); v != "released" || err != nil {
			t.Fatalf("running call: %v, %v", v, err)
		}
	}
	p.Shutdown(true, false)
	if ran.Load() != 0 {
		t.Fatalf("%d cancelled calls ran", ran.Load())
	}
}

func TestShutdownDrainsQueueWithoutCancel(t *testing.T) {
	p := newPool(t, 1)
	gate, _ := blockPool(t, p)
	var ran atomic.Int32
	var queued []*Future
	for range 5 {
		queued = append(queued, submit(t, p, func() (any, error) { ran.Add(1); return nil, nil }))
	}
	p.Shutdown(false, false)
	close(gate)
	p.Shutdown(true, false)
	if ran.Load() != 5 {
		t.Fatalf("ran %d of 5 queued calls", ran.Load())
	}
	for _, f := range queued {
		if f.State() != StateDone {
			t.Fatalf("queued call state %v after drain", f.State())
		}
	}
}

func TestShutdownNoWaitWithStuckCall(t *testing.T) {
	p, err := New(2, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	gate, running := blockPool(t, p)
	queued := submit(t, p, func() (any, error) { return nil, nil })

	returned := make(chan struct{})
	go func() {
		p.Shutdown(false, true)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(2 * time.Second):
		t.Fatal("Shutdown(wait=false) blocked on a stuck call")
	}
	if _, err := queued.Result(); !errors.Is(err, ErrCancelled) {
		t.Fatalf("queued err = %v", err)
	}
	select {
	case <-p.Terminated():
		t.Fatal("Terminated closed while calls are still stuck")
	default:
	}
	if _, err := p.Submit(func() (any, error) { return nil, nil }); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Submit after Shutdown: err = %v", err)
	}

	// Unblock: the stuck goroutines finish their calls and exit.
	close(gate)
	select {
	case <-p.Terminated():
	case <-time.After(5 * time.Second):
		t.Fatal("goroutines did not exit after their stuck calls returned")
	}
	for _, f := range running {
		if v, err := f.Result(); v != "released" || err != nil {
			t.Fatalf("stuck call result: %v, %v", v, err)
		}
	}
}

func TestSubmitAfterShutdown(t *testing.T) {
	p := newPool(t, 1)
	p.Shutdown(true, false)
	p.Shutdown(true, true) // idempotent
	f, err := p.Submit(func() (any, error) { t.Error("ran after shutdown"); return nil, nil })
	if f != nil || !errors.Is(err, ErrShutdown) {
		t.Fatalf("Submit after Shutdown = %v, %v; want nil, ErrShutdown", f, err)
	}
	if !strings.Contains(err.Error(), t.Name()) {
		t.Errorf("error %q should name the pool", err)
	}
}

func TestSubmitNil(t *testing.T) {
	p := newPool(t, 1)
	if _, err := p.Submit(nil); err == nil {
		t.Fatal("Submit(nil) succeeded")
	}
}

func TestConcurrencyLimitedToWorkers(t *testing.T) {
	const workers = 3
	p := newPool(t, workers)
	var cur, peak atomic.Int32
	gate := make(chan struct{})
	started := make(chan struct{}, 20)
	var futs []*Future
	for range 20 {
		futs = append(futs, submit(t, p, func() (any, error) {
			n := cur.Add(1)
			for {
				old := peak.Load()
				if n <= old || peak.CompareAndSwap(old, n) {
					break
				}
			}
			started <- struct{}{}
			<-gate
			cur.Add(-1)
			return nil, nil
		}))
	}
	for range workers {
		<-started
	}
	// Give the scheduler a chance to (wrongly) start more.
	time.Sleep(20 * time.Millisecond)
	if got := cur.Load(); got != workers {
		t.Fatalf("%d calls running, want %d", got, workers)
	}
	pending := 0
	for _, f := range futs {
		if f.State() == StatePending {
			pending++
		}
	}
	if pending != 20-workers {
		t.Fatalf("%d pending, want %d", pending, 20-workers)
	}
	close(gate)
	for _, f := range futs {
		waitDone(t, f)
	}
	if got := peak.Load(); got != workers {
		t.Fatalf("peak concurrency %d, want %d", got, workers)
	}
}

func TestConcurrentSubmitShutdownCancel(t *testing.T) {
	// Races Submit, Cancel and Shutdown against each other; every future must
	// end up done exactly once and Submit must fail only with ErrShutdown.
	p, err := New(4, "race")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var futs []*Future
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				f, err := p.Submit(func() (any, error) { return i, nil })
				if err != nil {
					if !errors.Is(err, ErrShutdown) {
						t.Errorf("Submit: %v", err)
					}
					return
				}
				if (i+g)%3 == 0 {
					f.Cancel()
				}
				mu.Lock()
				futs = append(futs, f)
				mu.Unlock()
			}
		})
	}
	time.Sleep(time.Millisecond)
	p.Shutdown(false, true)
	wg.Wait()
	p.Shutdown(true, false)
	for _, f := range futs {
		select {
		case <-f.Done():
		default:
			t.Fatalf("future left in state %v after shutdown", f.State())
		}
		switch _, err := f.Result(); {
		case f.State() == StateCancelled && !errors.Is(err, ErrCancelled):
			t.Fatalf("cancelled future err %v", err)
		case f.State() == StateDone && err != nil:
			t.Fatalf("done future err %v", err)
		}
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{
		StatePending: "pending", StateRunning: "running", StateDone: "done",
		StateCancelled: "cancelled", State(9): "State(9)",
	} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", s, got, want)
		}
	}
}

func BenchmarkSubmitWait(b *testing.B) {
	p, err := New(4, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer p.Shutdown(true, true)
	ctx := context.Background()
	fn := func() (any, error) { return nil, nil }
	b.ReportAllocs()
	for b.Loop() {
		f, err := p.Submit(fn)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSubmitBatchWait(b *testing.B) {
	p, err := New(4, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer p.Shutdown(true, true)
	ctx := context.Background()
	fn := func() (any, error) { return nil, nil }
	futs := make([]*Future, 64)
	b.ReportAllocs()
	for b.Loop() {
		for i := range futs {
			futs[i], _ = p.Submit(fn)
		}
		for _, f := range futs {
			if _, err := f.Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
}

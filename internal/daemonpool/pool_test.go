package daemonpool

import (
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

// newPool starts a pool that the test's cleanup shuts down and waits for.
func newPool(t *testing.T, workers int, onPanic func(error)) *Pool {
	t.Helper()
	p, err := New(workers, t.Name(), onPanic)
	if err != nil {
		t.Fatalf("New(%d): %v", workers, err)
	}
	t.Cleanup(func() {
		p.Shutdown()
		<-p.Terminated()
	})
	return p
}

func submit[T any](t *testing.T, p *Pool, fn func() (T, error)) *Future[T] {
	t.Helper()
	f, err := Submit(p, fn)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return f
}

// waitDone waits (bounded) for f and returns its result.
func waitDone[T any](t *testing.T, f *Future[T]) (T, error) {
	t.Helper()
	select {
	case <-f.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("future not done after 10s")
	}
	return f.Result()
}

func TestNewRejectsNonPositiveWorkers(t *testing.T) {
	for _, n := range []int{0, -1} {
		p, err := New(n, "bad", nil)
		if err == nil || p != nil {
			t.Fatalf("New(%d) = %v, %v; want error", n, p, err)
		}
		if !strings.Contains(err.Error(), "bad") || !strings.Contains(err.Error(), "workers") {
			t.Errorf("New(%d) error %q should name the pool and the field", n, err)
		}
	}
}

func TestResultsAndErrors(t *testing.T) {
	p := newPool(t, 2, nil)
	boom := errors.New("boom")
	var futs []*Future[int]
	for i := range 50 {
		futs = append(futs, submit(t, p, func() (int, error) {
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
		if f.Cancel() {
			t.Errorf("future %d: Cancel after completion succeeded", i)
		}
	}
}

func TestResultBeforeDone(t *testing.T) {
	p := newPool(t, 1, nil)
	gate := make(chan struct{})
	f := submit(t, p, func() (string, error) { <-gate; return "ok", nil })
	if v, err := f.Result(); !errors.Is(err, ErrNotDone) || v != "" {
		t.Fatalf("Result before done = %q, %v; want zero, ErrNotDone", v, err)
	}
	close(gate)
	if v, err := waitDone(t, f); v != "ok" || err != nil {
		t.Fatalf("got %v, %v", v, err)
	}
}

func TestPanicBecomesError(t *testing.T) {
	p := newPool(t, 1, nil)
	f := submit(t, p, func() (int, error) { panic("kaboom") })
	_, err := waitDone(t, f)
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Value != "kaboom" {
		t.Fatalf("err = %v, want *PanicError with value kaboom", err)
	}
	if !strings.Contains(pe.Error(), "kaboom") || !strings.Contains(string(pe.Stack), "TestPanicBecomesError") {
		t.Errorf("panic error %q / stack lacks detail:\n%s", pe.Error(), pe.Stack)
	}

	// A panic with an error value unwraps to it.
	f = submit(t, p, func() (int, error) { panic(io.ErrUnexpectedEOF) })
	if _, err := waitDone(t, f); !errors.Is(err, io.ErrUnexpectedEOF) || !errors.As(err, &pe) {
		t.Fatalf("err = %v, want PanicError wrapping io.ErrUnexpectedEOF", err)
	}

	// panic(nil) is a panic too.
	f = submit(t, p, func() (int, error) { panic(nil) })
	if _, err := waitDone(t, f); !errors.As(err, &pe) {
		t.Fatalf("panic(nil): err = %v, want *PanicError", err)
	}

	// The single goroutine survived all of that.
	f = submit(t, p, func() (int, error) { return 7, nil })
	if v, err := waitDone(t, f); v != 7 || err != nil {
		t.Fatalf("after panics: got %v, %v", v, err)
	}
}

func TestGoPanicGoesToHandler(t *testing.T) {
	got := make(chan error, 2)
	p := newPool(t, 1, func(err error) { got <- err })
	if err := p.Go(func() { panic("kaboom") }); err != nil {
		t.Fatal(err)
	}
	var pe *PanicError
	if err := <-got; !errors.As(err, &pe) || pe.Value != "kaboom" {
		t.Fatalf("handler got %v, want *PanicError kaboom", err)
	}
	if err := p.Go(func() { runtime.Goexit() }); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, ErrGoexit) {
		t.Fatalf("handler got %v, want ErrGoexit", err)
	}
	ran := make(chan struct{})
	if err := p.Go(func() { close(ran) }); err != nil {
		t.Fatal(err)
	}
	<-ran // the goroutine survived both
}

// A pool without a panic handler still recovers a panicking Go call, and
// keeps its goroutine.
func TestGoPanicWithoutHandler(t *testing.T) {
	p, err := New(1, "nohandler", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown()
	if err := p.Go(func() { panic("boom") }); err != nil {
		t.Fatal(err)
	}
	f, err := Submit(p, func() (int, error) { return 7, nil })
	if err != nil {
		t.Fatal(err)
	}
	<-f.Done()
	if v, err := f.Result(); v != 7 || err != nil {
		t.Fatalf("after the panic: %d, %v", v, err)
	}
}

func TestGoexitBecomesErrorAndWorkerIsReplaced(t *testing.T) {
	p := newPool(t, 1, nil)
	f := submit(t, p, func() (int, error) { runtime.Goexit(); return 0, nil })
	if _, err := waitDone(t, f); !errors.Is(err, ErrGoexit) {
		t.Fatalf("err = %v, want ErrGoexit", err)
	}
	g := submit(t, p, func() (string, error) { return "alive", nil })
	if v, err := waitDone(t, g); v != "alive" || err != nil {
		t.Fatalf("after Goexit: got %v, %v", v, err)
	}
	p.Shutdown()
	select {
	case <-p.Terminated():
	case <-time.After(10 * time.Second):
		t.Fatal("Terminated not closed after Shutdown of an idle pool")
	}
}

// blockPool fills every one of p's workers goroutines with a call blocked on
// the returned gate, and waits until all of them are running.
func blockPool(t *testing.T, p *Pool, workers int) (gate chan struct{}, running []*Future[string]) {
	t.Helper()
	gate = make(chan struct{})
	started := make(chan struct{}, workers)
	for range workers {
		running = append(running, submit(t, p, func() (string, error) {
			started <- struct{}{}
			<-gate
			return "released", nil
		}))
	}
	for range workers {
		<-started
	}
	return gate, running
}

func TestCancelQueued(t *testing.T) {
	p := newPool(t, 1, nil)
	gate, running := blockPool(t, p, 1)
	var ran atomic.Bool
	queued := submit(t, p, func() (int, error) { ran.Store(true); return 0, nil })
	after := submit(t, p, func() (string, error) { return "after", nil })

	if running[0].Cancel() {
		t.Fatal("Cancel of a running future succeeded")
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

func TestShutdownCancelsQueued(t *testing.T) {
	p := newPool(t, 2, nil)
	gate, running := blockPool(t, p, 2)
	var ran atomic.Int32
	var queued []*Future[int]
	for range 10 {
		queued = append(queued, submit(t, p, func() (int, error) { ran.Add(1); return 0, nil }))
	}
	for range 5 {
		if err := p.Go(func() { ran.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	p.Shutdown()
	for i, f := range queued {
		select {
		case <-f.Done():
		default:
			t.Fatalf("queued future %d not done after Shutdown", i)
		}
		if _, err := f.Result(); !errors.Is(err, ErrCancelled) {
			t.Fatalf("queued future %d err = %v", i, err)
		}
	}
	// Running calls are not cancelled; they finish normally.
	close(gate)
	for _, f := range running {
		if v, err := waitDone(t, f); v != "released" || err != nil {
			t.Fatalf("running call: %v, %v", v, err)
		}
	}
	<-p.Terminated()
	if ran.Load() != 0 {
		t.Fatalf("%d cancelled calls ran", ran.Load())
	}
}

func TestShutdownNeverWaitsForStuckCall(t *testing.T) {
	p, err := New(2, "stuck", nil)
	if err != nil {
		t.Fatal(err)
	}
	gate, running := blockPool(t, p, 2)
	queued := submit(t, p, func() (int, error) { return 0, nil })

	returned := make(chan struct{})
	go func() {
		p.Shutdown()
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown blocked on a stuck call")
	}
	if _, err := queued.Result(); !errors.Is(err, ErrCancelled) {
		t.Fatalf("queued err = %v", err)
	}
	select {
	case <-p.Terminated():
		t.Fatal("Terminated closed while calls are still stuck")
	default:
	}
	if _, err := Submit(p, func() (int, error) { return 0, nil }); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Submit after Shutdown: err = %v", err)
	}
	if err := p.Go(func() {}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Go after Shutdown: err = %v", err)
	}

	// Unblock: the stuck goroutines finish their calls and exit.
	close(gate)
	select {
	case <-p.Terminated():
	case <-time.After(10 * time.Second):
		t.Fatal("goroutines did not exit after their stuck calls returned")
	}
	for _, f := range running {
		if v, err := f.Result(); v != "released" || err != nil {
			t.Fatalf("stuck call result: %v, %v", v, err)
		}
	}
}

func TestSubmitAfterShutdown(t *testing.T) {
	p := newPool(t, 1, nil)
	p.Shutdown()
	p.Shutdown() // idempotent
	f, err := Submit(p, func() (int, error) { t.Error("ran after shutdown"); return 0, nil })
	if f != nil || !errors.Is(err, ErrShutdown) {
		t.Fatalf("Submit after Shutdown = %v, %v; want nil, ErrShutdown", f, err)
	}
	if !strings.Contains(err.Error(), t.Name()) {
		t.Errorf("error %q should name the pool", err)
	}
}

func TestSubmitNil(t *testing.T) {
	p := newPool(t, 1, nil)
	if _, err := Submit[int](p, nil); err == nil {
		t.Fatal("Submit(nil) succeeded")
	}
	if err := p.Go(nil); err == nil {
		t.Fatal("Go(nil) succeeded")
	}
}

func TestConcurrencyLimitedToWorkers(t *testing.T) {
	const workers, calls = 3, 20
	p := newPool(t, workers, nil)
	gate, running := blockPool(t, p, workers)
	var more []*Future[int]
	for range calls - workers {
		more = append(more, submit(t, p, func() (int, error) { return 1, nil }))
	}
	// With every goroutine held, none of the rest may have started: each
	// cancels, which only a call that never started does.
	for i, f := range more {
		if !f.Cancel() {
			t.Fatalf("call %d started while %d goroutines were all busy", i, workers)
		}
	}
	close(gate)
	for _, f := range running {
		waitDone(t, f)
	}
}

func TestConcurrentSubmitShutdownCancel(t *testing.T) {
	// Races Submit, Cancel and Shutdown against each other: every future
	// ends up done, and Submit fails only with ErrShutdown.
	p, err := New(4, "race", nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var futs []*Future[int]
	submitted := make(chan struct{}, 4)
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				f, err := Submit(p, func() (int, error) { return i, nil })
				if err != nil {
					if !errors.Is(err, ErrShutdown) {
						t.Errorf("Submit: %v", err)
					}
					return
				}
				if i == 10 {
					submitted <- struct{}{}
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
	<-submitted // at least one goroutine is under way
	p.Shutdown()
	wg.Wait()
	<-p.Terminated()
	for _, f := range futs {
		select {
		case <-f.Done():
		default:
			t.Fatal("future left unfinished after shutdown")
		}
		if _, err := f.Result(); err != nil && !errors.Is(err, ErrCancelled) {
			t.Fatalf("future err %v", err)
		}
	}
}

func BenchmarkSubmitWait(b *testing.B) {
	p, err := New(4, "bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Shutdown()
	fn := func() (int, error) { return 0, nil }
	b.ReportAllocs()
	for b.Loop() {
		f, err := Submit(p, fn)
		if err != nil {
			b.Fatal(err)
		}
		<-f.Done()
	}
}

func BenchmarkGo(b *testing.B) {
	p, err := New(4, "bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Shutdown()
	done := make(chan struct{}, 1)
	fn := func() { done <- struct{}{} }
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Go(fn); err != nil {
			b.Fatal(err)
		}
		<-done
	}
}

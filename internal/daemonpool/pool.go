// Package daemonpool runs submitted calls on a fixed set of goroutines.
//
// The pool is built for calls that may block for a long time in a service
// that has stopped answering: nothing in the pool ever waits on a running
// call, shutting down returns at once, and a goroutine stuck in a call exits
// as soon as that call returns. Submitting never blocks (the queue is
// unbounded), so it is safe from a hot loop.
//
// [Submit] returns a [Future] for a call whose result the caller wants;
// [Pool.Go] runs a call whose outcome the call itself records. A panic in a
// call is recovered: it becomes a Future's error (a [*PanicError]), or is
// passed to the pool's panic handler for [Pool.Go]. It neither crashes the
// process nor costs the pool a goroutine.
package daemonpool

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
)

var (
	// ErrShutdown is returned by [Submit] and [Pool.Go] once
	// [Pool.Shutdown] has been called.
	ErrShutdown = errors.New("daemonpool: pool is shut down")

	// ErrCancelled is the error of a future that was cancelled before it
	// started, by [Future.Cancel] or by [Pool.Shutdown].
	ErrCancelled = errors.New("daemonpool: call cancelled before it started")

	// ErrNotDone is returned by [Future.Result] while the future has not
	// finished.
	ErrNotDone = errors.New("daemonpool: call has not finished")

	// ErrGoexit is the error of a call that ended its goroutine with
	// runtime.Goexit (for example through testing.T.FailNow) instead of
	// returning.
	ErrGoexit = errors.New("daemonpool: call exited its goroutine with runtime.Goexit")
)

// PanicError is the error of a call that panicked.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the panicking goroutine's stack trace, as [debug.Stack]
	// formats it.
	Stack []byte
}

// Error reports the panic value. The stack is not included; read Stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("daemonpool: call panicked: %v", e.Value)
}

// Unwrap returns the panic value when it is an error, so that errors.Is and
// errors.As see through a panic(err).
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// A future moves from pending to either cancelled, or running and then
// done; it never moves back.
const (
	statePending int32 = iota
	stateRunning
	stateDone
	stateCancelled
)

// task is what the queue holds: a call to run, or to drop unrun.
type task interface {
	run(onPanic func(error))
	cancel() bool
}

// Future is the outcome of one call given to [Submit]. Its methods are safe
// for concurrent use.
type Future[T any] struct {
	state atomic.Int32
	done  chan struct{}

	// fn is set by Submit and read, then cleared, only by the one pool
	// goroutine that dequeues the future.
	fn func() (T, error)

	// result and err are written before done is closed and read only after.
	result T
	err    error
}

// Done returns a channel that is closed when the future has finished: its
// call returned or panicked, or it was cancelled.
func (f *Future[T]) Done() <-chan struct{} { return f.done }

// Cancel cancels the call if it has not started yet: the future becomes done
// at once with ErrCancelled and the call never runs. It reports whether the
// future is cancelled: true for a future already cancelled, false for one
// that has started or finished.
func (f *Future[T]) Cancel() bool {
	if f.state.CompareAndSwap(statePending, stateCancelled) {
		f.err = ErrCancelled
		close(f.done)
		return true
	}
	return f.state.Load() == stateCancelled
}

func (f *Future[T]) cancel() bool { return f.Cancel() }

// Result returns the call's result and error. It does not block: before the
// future is done it returns ErrNotDone. A cancelled future's error is
// ErrCancelled; a panicked call's is a [*PanicError].
func (f *Future[T]) Result() (T, error) {
	select {
	case <-f.done:
		return f.result, f.err
	default:
		var zero T
		return zero, ErrNotDone
	}
}

// run executes the call on the current goroutine unless the future was
// cancelled first, and completes the future. If the call ends the goroutine
// with runtime.Goexit, run completes the future with ErrGoexit on the way
// out and does not return to its caller.
func (f *Future[T]) run(onPanic func(error)) {
	fn := f.fn
	f.fn = nil
	if !f.state.CompareAndSwap(statePending, stateRunning) {
		return // cancelled while queued
	}
	returned := false
	defer func() {
		if returned {
			return
		}
		var zero T
		f.result, f.err = zero, recovered(recover())
		if onPanic != nil {
			onPanic(f.err)
		}
		f.finish()
	}()
	res, err := fn()
	returned = true
	f.result, f.err = res, err
	f.finish()
}

func (f *Future[T]) finish() {
	f.state.Store(stateDone)
	close(f.done)
}

// recovered turns what recover returned into the call's error: recover() is
// nil only for runtime.Goexit, since a panic(nil) recovers as
// *runtime.PanicNilError.
func recovered(v any) error {
	if v == nil {
		return ErrGoexit
	}
	return &PanicError{Value: v, Stack: debug.Stack()}
}

// goTask is a call given to [Pool.Go].
type goTask struct{ fn func() }

func (t goTask) run(onPanic func(error)) {
	returned := false
	defer func() {
		if returned {
			return
		}
		err := recovered(recover()) // recovered even with no handler
		if onPanic != nil {
			onPanic(err)
		}
	}()
	t.fn()
	returned = true
}

func (goTask) cancel() bool { return true }

// Pool is a fixed set of goroutines running submitted calls in submission
// order. Create one with [New]; its methods are safe for concurrent use.
type Pool struct {
	name    string
	onPanic func(error)
	size    int

	mu       sync.Mutex
	cond     sync.Cond // signalled when the queue grows or the pool shuts down
	queue    []task    // queue[head:] are waiting; see pop
	head     int
	shutdown bool
	live     int // worker goroutines that have not exited

	terminated chan struct{} // closed when live drops to zero after shutdown
}

// New starts a pool of workers goroutines. name identifies the pool in error
// messages and in goroutine profiles (each goroutine carries the pprof labels
// daemonpool=name and worker=index). onPanic, when not nil, receives the
// error of every call that panicked or called runtime.Goexit (a
// [Future]'s error also carries it); without one such a call is still
// recovered. workers must be positive.
func New(workers int, name string, onPanic func(error)) (*Pool, error) {
	if workers <= 0 {
		return nil, fmt.Errorf("daemonpool: pool %q: workers must be positive, got %d", name, workers)
	}
	p := &Pool{name: name, onPanic: onPanic, size: workers, live: workers, terminated: make(chan struct{})}
	p.cond.L = &p.mu
	for i := range workers {
		go p.worker(i)
	}
	return p, nil
}

// Size is the number of goroutines the pool was started with.
func (p *Pool) Size() int { return p.size }

// Submit queues fn to run on one of p's goroutines and returns its future.
// It never blocks. After [Pool.Shutdown] it returns an error matching
// ErrShutdown and fn never runs.
func Submit[T any](p *Pool, fn func() (T, error)) (*Future[T], error) {
	if fn == nil {
		return nil, fmt.Errorf("daemonpool: pool %q: nil function submitted", p.name)
	}
	f := &Future[T]{done: make(chan struct{}), fn: fn}
	if err := p.push(f); err != nil {
		return nil, err
	}
	return f, nil
}

// Go queues fn to run on one of the pool's goroutines. It never blocks.
// After [Pool.Shutdown] it returns an error matching ErrShutdown and fn
// never runs; a call still queued at Shutdown never runs either.
func (p *Pool) Go(fn func()) error {
	if fn == nil {
		return fmt.Errorf("daemonpool: pool %q: nil function submitted", p.name)
	}
	return p.push(goTask{fn})
}

func (p *Pool) push(t task) error {
	p.mu.Lock()
	if p.shutdown {
		p.mu.Unlock()
		return fmt.Errorf("daemonpool: pool %q: %w", p.name, ErrShutdown)
	}
	p.queue = append(p.queue, t)
	p.mu.Unlock()
	p.cond.Signal()
	return nil
}

// Shutdown stops the pool from accepting calls and cancels every call still
// queued (a future becomes done with ErrCancelled). It returns at once and
// never waits on a call: each goroutine exits once its current call, if
// any, has returned. [Pool.Terminated] tells when all have exited. Shutdown
// may be called any number of times, from any goroutine.
func (p *Pool) Shutdown() {
	p.mu.Lock()
	p.shutdown = true
	cancelled := p.queue[p.head:]
	p.queue, p.head = nil, 0
	p.mu.Unlock()
	p.cond.Broadcast()
	for _, t := range cancelled {
		t.cancel()
	}
}

// Terminated returns a channel that is closed once [Pool.Shutdown] has been
// called and every goroutine of the pool has exited.
func (p *Pool) Terminated() <-chan struct{} { return p.terminated }

// pop blocks until a task is queued, and returns it; it returns nil once
// the pool is shut down.
func (p *Pool) pop() task {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.head == len(p.queue) {
		if p.shutdown {
			return nil
		}
		p.cond.Wait()
	}
	t := p.queue[p.head]
	p.queue[p.head] = nil
	p.head++
	switch {
	case p.head == len(p.queue):
		// Empty: reuse the backing array from the start.
		p.queue, p.head = p.queue[:0], 0
	case p.head >= 1024 && p.head*2 >= len(p.queue):
		// Mostly consumed: compact so the array does not grow without bound
		// under a queue that never quite empties.
		n := copy(p.queue, p.queue[p.head:])
		clear(p.queue[n:])
		p.queue, p.head = p.queue[:n], 0
	}
	return t
}

func (p *Pool) worker(index int) {
	exited := true // stays true only if a call ends this goroutine with Goexit
	defer func() {
		if exited {
			// A call ran runtime.Goexit: its outcome is recorded already
			// (see Future.run and goTask.run). Keep the pool at full strength.
			go p.worker(index)
			return
		}
		p.mu.Lock()
		p.live--
		last := p.live == 0
		p.mu.Unlock()
		if last {
			close(p.terminated)
		}
	}()
	labels := pprof.Labels("daemonpool", p.name, "worker", strconv.Itoa(index))
	pprof.Do(context.Background(), labels, func(context.Context) {
		for {
			t := p.pop()
			if t == nil {
				break
			}
			t.run(p.onPanic)
		}
	})
	exited = false
}

// Package daemonpool runs submitted calls on a fixed set of goroutines and
// reports each call's outcome through a [Future].
//
// The pool is built for calls that may block for a long time in a service
// that has stopped answering: nothing in the pool ever waits on a running
// call unless asked to, shutting down without waiting returns at once, and a
// goroutine stuck in a call exits as soon as that call returns. Submit never
// blocks (the queue is unbounded), so it is safe to call from a hot loop.
//
// A panic in a submitted call is recovered and becomes that future's error
// (a [*PanicError]); it neither crashes the process nor costs the pool a
// goroutine.
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
	// ErrShutdown is returned by [Pool.Submit] once [Pool.Shutdown] has been
	// called.
	ErrShutdown = errors.New("daemonpool: pool is shut down")

	// ErrCancelled is the error of a future that was cancelled before it
	// started, by [Future.Cancel] or by [Pool.Shutdown] with cancelQueued.
	ErrCancelled = errors.New("daemonpool: call cancelled before it started")

	// ErrNotDone is returned by [Future.Result] while the future has not
	// finished.
	ErrNotDone = errors.New("daemonpool: call has not finished")

	// ErrGoexit is the error of a future whose call ended the goroutine with
	// runtime.Goexit (for example through testing.T.FailNow) instead of
	// returning.
	ErrGoexit = errors.New("daemonpool: call exited its goroutine with runtime.Goexit")
)

// PanicError is the error of a future whose call panicked.
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

// State is the stage a [Future] is in. A future moves from StatePending to
// either StateCancelled, or StateRunning and then StateDone; it never moves
// back.
type State int32

const (
	// StatePending: queued, not yet picked up by a pool goroutine.
	StatePending State = iota
	// StateRunning: a pool goroutine is executing the call.
	StateRunning
	// StateDone: the call returned (or panicked); its result is available.
	StateDone
	// StateCancelled: the call was cancelled before it started and will never
	// run; its result error is ErrCancelled.
	StateCancelled
)

// String returns the state's name in lower case ("pending", "running",
// "done", "cancelled").
func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateRunning:
		return "running"
	case StateDone:
		return "done"
	case StateCancelled:
		return "cancelled"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Future is the outcome of one submitted call. All its methods are safe for
// concurrent use.
type Future struct {
	state atomic.Int32
	done  chan struct{}

	// fn is set by Submit and read, then cleared, only by the one pool
	// goroutine that dequeues the future.
	fn func() (any, error)

	// result and err are written before done is closed and read only after.
	result any
	err    error
}

func newFuture(fn func() (any, error)) *Future {
	return &Future{done: make(chan struct{}), fn: fn}
}

// Done returns a channel that is closed when the future has finished: its
// call returned or panicked, or it was cancelled.
func (f *Future) Done() <-chan struct{} { return f.done }

// State reports the future's current stage.
func (f *Future) State() State { return State(f.state.Load()) }

// Running reports whether a pool goroutine is executing the call right now.
func (f *Future) Running() bool { return f.State() == StateRunning }

// Started reports whether the call has begun, whether or not it has finished.
// A cancelled future never starts.
func (f *Future) Started() bool {
	s := f.State()
	return s == StateRunning || s == StateDone
}

// Cancelled reports whether the future was cancelled before it started.
func (f *Future) Cancelled() bool { return f.State() == StateCancelled }

// Cancel cancels the call if it has not started yet: the future becomes done
// at once with ErrCancelled and the call never runs. It reports whether the
// future is cancelled, so it returns true for a future already cancelled and
// false for one that has started or finished.
func (f *Future) Cancel() bool {
	if f.state.CompareAndSwap(int32(StatePending), int32(StateCancelled)) {
		f.err = ErrCancelled
		close(f.done)
		return true
	}
	return f.State() == StateCancelled
}

// Result returns the call's result and error. It does not block: before the
// future is done it returns (nil, ErrNotDone). A cancelled future's error is
// ErrCancelled; a panicked call's is a [*PanicError].
func (f *Future) Result() (any, error) {
	select {
	case <-f.done:
		return f.result, f.err
	default:
		return nil, ErrNotDone
	}
}

// Wait blocks until the future is done or ctx ends, whichever comes first,
// and returns the call's result. When ctx ends first it returns ctx.Err() and
// leaves the call alone: it keeps running (or stays queued) and the future
// still completes later. A future that is already done returns its result
// even if ctx has ended.
func (f *Future) Wait(ctx context.Context) (any, error) {
	select {
	case <-f.done:
		return f.result, f.err
	default:
	}
	select {
	case <-f.done:
		return f.result, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run executes the call on the current goroutine unless the future was
// cancelled first, and completes the future. If the call ends the goroutine
// with runtime.Goexit, run completes the future with ErrGoexit on the way out
// and does not return to its caller.
func (f *Future) run() {
	fn := f.fn
	f.fn = nil
	if !f.state.CompareAndSwap(int32(StatePending), int32(StateRunning)) {
		return // cancelled while queued
	}
	returned := false
	defer func() {
		if returned {
			return
		}
		if v := recover(); v != nil {
			f.result, f.err = nil, &PanicError{Value: v, Stack: debug.Stack()}
		} else {
			// recover() is nil only for runtime.Goexit: since Go 1.21 a
			// panic(nil) recovers as *runtime.PanicNilError.
			f.result, f.err = nil, ErrGoexit
		}
		f.finish()
	}()
	res, err := fn()
	returned = true
	f.result, f.err = res, err
	f.finish()
}

func (f *Future) finish() {
	f.state.Store(int32(StateDone))
	close(f.done)
}

// Pool is a fixed set of goroutines running submitted calls in submission
// order. Create one with [New]; all its methods are safe for concurrent use.
type Pool struct {
	name    string
	workers int

	mu       sync.Mutex
	cond     sync.Cond // signalled when the queue grows or the pool shuts down
	queue    []*Future // queue[head:] are waiting; see push/pop
	head     int
	shutdown bool
	live     int // worker goroutines that have not exited

	terminated chan struct{} // closed when live drops to zero after shutdown
}

// New starts a pool of workers goroutines. name identifies the pool in error
// messages and in goroutine profiles (each goroutine carries the pprof labels
// daemonpool=name and worker=index). workers must be positive.
func New(workers int, name string) (*Pool, error) {
	if workers <= 0 {
		return nil, fmt.Errorf("daemonpool: pool %q: workers must be positive, got %d", name, workers)
	}
	p := &Pool{name: name, workers: workers, live: workers, terminated: make(chan struct{})}
	p.cond.L = &p.mu
	for i := range workers {
		go p.worker(i)
	}
	return p, nil
}

// Name returns the name given to [New].
func (p *Pool) Name() string { return p.name }

// Workers returns the number of goroutines the pool was created with.
func (p *Pool) Workers() int { return p.workers }

// Queued returns the number of submitted calls no goroutine has picked up
// yet, cancelled ones included until a goroutine discards them.
func (p *Pool) Queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) - p.head
}

// Submit queues fn to run on one of the pool's goroutines and returns its
// future. It never blocks. After [Pool.Shutdown] it returns an error matching
// ErrShutdown and fn never runs.
func (p *Pool) Submit(fn func() (any, error)) (*Future, error) {
	if fn == nil {
		return nil, fmt.Errorf("daemonpool: pool %q: nil function submitted", p.name)
	}
	f := newFuture(fn)
	p.mu.Lock()
	if p.shutdown {
		p.mu.Unlock()
		return nil, fmt.Errorf("daemonpool: pool %q: %w", p.name, ErrShutdown)
	}
	p.queue = append(p.queue, f)
	p.mu.Unlock()
	p.cond.Signal()
	return f, nil
}

// Shutdown stops the pool from accepting calls. Calls already queued still
// run unless cancelQueued is true, in which case every queued future is
// cancelled (done, with ErrCancelled). Each goroutine exits once the queue is
// empty and its current call, if any, has returned.
//
// With wait true, Shutdown returns after every goroutine has exited, which
// takes as long as the slowest running call. With wait false it returns at
// once and never waits on a call: a goroutine blocked in a stuck call exits
// when that call returns. [Pool.Terminated] tells when all have exited.
//
// Shutdown may be called any number of times, from any goroutine; each call
// with cancelQueued cancels whatever is still queued and each call with wait
// waits. A submitted call must not call Shutdown with wait true on its own
// pool: it would wait for itself.
func (p *Pool) Shutdown(wait bool, cancelQueued bool) {
	p.mu.Lock()
	p.shutdown = true
	var cancelled []*Future
	if cancelQueued {
		cancelled = p.queue[p.head:]
		p.queue, p.head = nil, 0
	}
	p.mu.Unlock()
	p.cond.Broadcast()
	for _, f := range cancelled {
		f.Cancel()
	}
	if wait {
		<-p.terminated
	}
}

// Terminated returns a channel that is closed once [Pool.Shutdown] has been
// called and every goroutine of the pool has exited.
func (p *Pool) Terminated() <-chan struct{} { return p.terminated }

// pop blocks until a future is queued, and returns it; it returns nil once
// the pool is shut down and the queue is empty.
func (p *Pool) pop() *Future {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.head == len(p.queue) {
		if p.shutdown {
			return nil
		}
		p.cond.Wait()
	}
	f := p.queue[p.head]
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
	return f
}

func (p *Pool) worker(index int) {
	exited := true // stays true only if a call ends this goroutine with Goexit
	defer func() {
		if exited {
			// A call ran runtime.Goexit: its future is already complete
			// (see Future.run). Keep the pool at full strength.
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
			f := p.pop()
			if f == nil {
				break
			}
			f.run()
		}
	})
	exited = false
}

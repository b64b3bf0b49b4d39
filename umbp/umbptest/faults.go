package umbptest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// faults are a test server's injected faults and its call counts: stalls of
// chosen methods ("" stalls every one), failures due, a suspension of the
// whole process, and how many calls of each method arrived. Server and
// Master share them. Its methods are safe for concurrent use.
type faults struct {
	who   string       // "server" or "master", for the errors it injects
	calls *callCounter // this process's calls
	also  *callCounter // when not nil, counts them too (a replicated master's)

	mu        sync.Mutex
	stalls    map[string]chan struct{}
	fail      map[string][]failRun // per method, the failures due, first first
	suspended chan struct{}        // closed on resume; nil while running
	off       bool                 // closed: no new stalls
	latency   time.Duration        // added before every call is answered
}

func (f *faults) setLatency(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latency = d
}

func newFaults(who string, also *callCounter) *faults {
	return &faults{
		who:    who,
		calls:  newCallCounter(),
		also:   also,
		stalls: make(map[string]chan struct{}),
		fail:   make(map[string][]failRun),
	}
}

// enter runs before every handler of a generation that ends with done: it
// counts the call, waits while the method is stalled, and injects a failure
// when one is due.
func (f *faults) enter(ctx context.Context, done <-chan struct{}, method string) error {
	f.mu.Lock()
	// Counted and its stalls taken at once: a call counted is held.
	f.calls.add(method)
	if f.also != nil {
		f.also.add(method)
	}
	stalled := []chan struct{}{f.stalls[method], f.stalls[""]}
	latency := f.latency
	f.mu.Unlock()
	for _, ch := range stalled {
		if ch == nil {
			continue
		}
		select {
		case <-ch:
		case <-done:
			return status.Errorf(codes.Unavailable, "umbptest: %s stopped while the call was stalled", f.who)
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-done:
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		}
		t.Stop()
	}
	select {
	case <-done:
		return status.Errorf(codes.Unavailable, "umbptest: %s stopped", f.who)
	default:
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	due := f.fail[method]
	if len(due) == 0 {
		return nil
	}
	err := due[0].err
	if due[0].n--; due[0].n == 0 {
		if len(due) == 1 {
			delete(f.fail, method)
		} else {
			f.fail[method] = due[1:]
		}
	}
	if err == nil {
		err = status.Errorf(codes.Unavailable, "umbptest: injected failure of %s", method)
	}
	return err
}

// stall makes the named methods (every one, with none named) wait from now
// on until resumed.
func (f *faults) stall(methods []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return
	}
	if len(methods) == 0 {
		methods = []string{""}
	}
	for _, m := range methods {
		if f.stalls[m] == nil {
			f.stalls[m] = make(chan struct{})
		}
	}
}

// resume releases the named methods' stalls, or with none named every
// stall and a suspension.
func (f *faults) resume(methods []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(methods) == 0 {
		for m, ch := range f.stalls {
			close(ch)
			delete(f.stalls, m)
		}
		f.unsuspendLocked()
		return
	}
	for _, m := range methods {
		if ch := f.stalls[m]; ch != nil {
			close(ch)
			delete(f.stalls, m)
		}
	}
}

// suspend stops the process's transport until resume (see Master.Suspend).
func (f *faults) suspend() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.off && f.suspended == nil {
		f.suspended = make(chan struct{})
	}
}

// unsuspend ends a suspension (the process was killed).
func (f *faults) unsuspend() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unsuspendLocked()
}

func (f *faults) unsuspendLocked() {
	if f.suspended != nil {
		close(f.suspended)
		f.suspended = nil
	}
}

// suspension is the channel that closes when a suspension ends, or nil
// while the process runs.
func (f *faults) suspension() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.suspended == nil {
		return nil
	}
	return f.suspended
}

// failNext makes the next n calls of method fail with err (nil: the
// default failure); n <= 0 clears them.
func (f *faults) failNext(method string, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n <= 0 {
		delete(f.fail, method)
		return
	}
	f.fail[method] = append(f.fail[method], failRun{err: err, n: n})
}

// failRun is n failures with err (nil: the default failure).
type failRun struct {
	err error
	n   int
}

// count is how many calls of method arrived.
func (f *faults) count(method string) int { return f.calls.count(method) }

// waitCalls waits until n calls of method have arrived, or ctx ends.
func (f *faults) waitCalls(ctx context.Context, method string, n int) error {
	return f.calls.wait(ctx, method, n)
}

// close stops new stalls and suspensions: the server is closing.
func (f *faults) close() {
	f.mu.Lock()
	f.off = true
	f.mu.Unlock()
}

// callCounter counts calls by method and wakes whoever waits for a count.
type callCounter struct {
	mu     sync.Mutex
	calls  map[string]int
	called chan struct{} // closed and replaced at every call
}

func newCallCounter() *callCounter {
	return &callCounter{calls: make(map[string]int), called: make(chan struct{})}
}

func (c *callCounter) add(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[method]++
	close(c.called)
	c.called = make(chan struct{})
}

func (c *callCounter) count(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[method]
}

// wait waits until n calls of method have arrived, or ctx ends.
func (c *callCounter) wait(ctx context.Context, method string, n int) error {
	for {
		c.mu.Lock()
		got, ch := c.calls[method], c.called
		c.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("umbptest: %d calls of %s, waiting for %d: %w", got, method, n, ctx.Err())
		}
	}
}

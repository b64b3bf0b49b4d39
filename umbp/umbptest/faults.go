package umbptest

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// faults are a test server's injected faults and its call counts: stalls of
// chosen methods ("" stalls every one), failures due, and how many calls of
// each method arrived. Server and Master share them. Its methods are safe
// for concurrent use.
type faults struct {
	who string // "server" or "master", for the errors it injects

	mu     sync.Mutex
	stalls map[string]chan struct{}
	fail   map[string]int
	calls  map[string]int
	called chan struct{} // closed and replaced at every call
	off    bool          // closed: no new stalls
}

func newFaults(who string) *faults {
	return &faults{
		who:    who,
		stalls: make(map[string]chan struct{}),
		fail:   make(map[string]int),
		calls:  make(map[string]int),
		called: make(chan struct{}),
	}
}

// enter runs before every handler of a generation that ends with done: it
// counts the call, waits while the method is stalled, and injects a failure
// when one is due.
func (f *faults) enter(ctx context.Context, done <-chan struct{}, method string) error {
	f.mu.Lock()
	f.calls[method]++
	close(f.called)
	f.called = make(chan struct{})
	stalled := []chan struct{}{f.stalls[method], f.stalls[""]}
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
	select {
	case <-done:
		return status.Errorf(codes.Unavailable, "umbptest: %s stopped", f.who)
	default:
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.fail[method]; n > 0 {
		if n == 1 {
			delete(f.fail, method)
		} else {
			f.fail[method] = n - 1
		}
		return status.Errorf(codes.Unavailable, "umbptest: injected failure of %s", method)
	}
	return nil
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
// stall.
func (f *faults) resume(methods []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(methods) == 0 {
		for m, ch := range f.stalls {
			close(ch)
			delete(f.stalls, m)
		}
		return
	}
	for _, m := range methods {
		if ch := f.stalls[m]; ch != nil {
			close(ch)
			delete(f.stalls, m)
		}
	}
}

// failNext makes the next n calls of method fail; n <= 0 clears them.
func (f *faults) failNext(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n <= 0 {
		delete(f.fail, method)
		return
	}
	f.fail[method] += n
}

// count is how many calls of method arrived.
func (f *faults) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// waitCalls waits until n calls of method have arrived, or ctx ends.
func (f *faults) waitCalls(ctx context.Context, method string, n int) error {
	for {
		f.mu.Lock()
		got, ch := f.calls[method], f.called
		f.mu.Unlock()
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

// close stops new stalls: the server is closing.
func (f *faults) close() {
	f.mu.Lock()
	f.off = true
	f.mu.Unlock()
}

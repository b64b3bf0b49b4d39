package umbp

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// HandleState is a handle's relation to its server.
type HandleState int32

const (
	// StateConnected: calls go to the server.
	StateConnected HandleState = iota
	// StateReconnecting: the server went away (or was replaced); lookups
	// answer misses and transfers are refused as not attempted, at once,
	// until the handle has attached to the server again and re-registered
	// its memory.
	StateReconnecting
	// StateClosed: the handle was closed.
	StateClosed
)

// String returns "connected", "reconnecting" or "closed".
func (s HandleState) String() string {
	switch s {
	case StateConnected:
		return "connected"
	case StateReconnecting:
		return "reconnecting"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("HandleState(%d)", int32(s))
}

// ServerCapabilities are what the server said of itself when the handle
// last attached.
type ServerCapabilities struct {
	// Ready: the server said it was ready to serve.
	Ready bool
	// RangedIO: the server takes scatter/gather batches (a v2 server with
	// its SSD tier off).
	RangedIO bool
	// Mode is the server's deployment mode, e.g. "STANDALONE_BACKEND_LOCAL".
	Mode string
}

// connState is a handle's state and the one way it changes: a
// connection (a standalone server's link, the master's channel) moves it,
// every change wakes the waiters of waitForChange, and closed is final.
type connState struct {
	st         atomic.Int32 // HandleState
	reconnects atomic.Uint64

	mu sync.Mutex
	ch chan struct{} // closed at the next change; nil until asked for
}

// get returns the state.
func (s *connState) get() HandleState { return HandleState(s.st.Load()) }

// move changes the state from from to to, and reports whether it did (it
// was from, and is not closed). Back to connected from reconnecting counts
// a reconnect.
func (s *connState) move(from, to HandleState) bool {
	if from == StateClosed || !s.st.CompareAndSwap(int32(from), int32(to)) {
		return false
	}
	if from == StateReconnecting && to == StateConnected {
		s.reconnects.Add(1)
	}
	s.notify()
	return true
}

// close moves the state to closed, for good; it reports whether it did.
func (s *connState) close() bool {
	if HandleState(s.st.Swap(int32(StateClosed))) == StateClosed {
		return false
	}
	s.notify()
	return true
}

func (s *connState) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// waitForChange waits until the state differs from from (true) or ctx ends
// first (false).
func (s *connState) waitForChange(ctx context.Context, from HandleState) bool {
	for {
		// The channel is taken before the state is read: a change after
		// the read closes it.
		s.mu.Lock()
		if s.ch == nil {
			s.ch = make(chan struct{})
		}
		ch := s.ch
		s.mu.Unlock()
		if s.get() != from {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

func capabilitiesOf(caps conn.Capabilities) ServerCapabilities {
	return ServerCapabilities{Ready: caps.Ready, RangedIO: caps.RangedIO, Mode: caps.Mode.String()}
}

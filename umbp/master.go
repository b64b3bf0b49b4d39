package umbp

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
)

// masterBackend is a scheduler handle's channel to MORI's master. gRPC
// redials the master (at masterRedial's pace, and at once when the channel
// goes idle); the handle's state follows the channel's: READY is
// connected, anything else reconnecting.
type masterBackend struct {
	c          *masterconn.Conn
	addr       string
	rpcTimeout time.Duration
	log        *slog.Logger

	st   connState
	stop context.CancelFunc
	done chan struct{}
}

// newMasterBackend follows c, which has just answered, until close.
func newMasterBackend(c *masterconn.Conn, cfg ClusterConfig) *masterBackend {
	ctx, stop := context.WithCancel(context.Background())
	b := &masterBackend{c: c, addr: cfg.Master, rpcTimeout: cfg.Timeout, log: cfg.Logger, stop: stop, done: make(chan struct{})}
	// It answered just now: connected, the zero state.
	go b.watch(ctx)
	return b
}

// watch follows the channel's state until close.
func (b *masterBackend) watch(ctx context.Context) {
	defer close(b.done)
	// The channel's state can lag behind the call that proved it working
	// (gRPC installs the picker before it reports READY): a CONNECTING
	// before the first READY is that lag, not a lost master.
	settled := false
	for s := b.c.State(); ; s = b.c.State() {
		next := StateReconnecting
		switch s {
		case connectivity.Ready:
			next, settled = StateConnected, true
		case connectivity.Connecting:
			if !settled {
				next = StateConnected
			}
		case connectivity.Idle:
			b.c.Connect() // a lost connection: redial now
		case connectivity.Shutdown:
			return
		}
		if s != connectivity.Connecting {
			settled = true
		}
		if prev := b.st.get(); prev != next && b.st.move(prev, next) {
			if next == StateConnected {
				b.log.Info("UMBP master is back; lookups go to it again", "master", b.addr)
			} else {
				b.log.Warn("UMBP master connection lost; lookups answer misses until it is back", "master", b.addr, "grpc_state", s.String())
			}
		}
		if !b.c.WaitForStateChange(ctx, s) {
			return
		}
	}
}

func (b *masterBackend) session() (lookupSource, error) {
	switch b.st.get() {
	case StateClosed:
		return nil, ErrClosed
	case StateReconnecting:
		return nil, errReconnecting
	}
	return b, nil
}

func (b *masterBackend) states() *connState { return &b.st }

func (b *masterBackend) capabilities() ServerCapabilities {
	return ServerCapabilities{Ready: b.st.get() == StateConnected, Mode: MasterMode}
}

func (b *masterBackend) encode(keys []string) (encoded.Keys, error) {
	return masterconn.EncodeKeys(keys)
}

// close: closing a gRPC channel cancels the calls on it, a stuck one
// included.
func (b *masterBackend) close(_ <-chan struct{}, timeout time.Duration) error {
	b.st.close()
	b.stop()
	<-b.done
	done := make(chan error, 1)
	go func() { done <- b.c.Close() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return errLeftOpen(fmt.Sprintf("closing it did not return in %v", timeout))
	}
}

// bound gives a call to the master its deadline, Timeout: over TCP the
// timer costs little beside the round trip, and a stalled master's call
// ends by itself, freeing the handle's calls after it.
func (b *masterBackend) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.rpcTimeout)
}

func (b *masterBackend) exists(ctx context.Context, keys encoded.Keys) ([]bool, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.c.BatchLookupEncoded(ctx, keys)
}

// prefix is the master's BatchLookup, counted up to the first miss: it has
// no consecutive-exists call.
func (b *masterBackend) prefix(ctx context.Context, keys encoded.Keys) (int, error) {
	found, err := b.exists(ctx, keys)
	if err != nil {
		return 0, err
	}
	for i, f := range found {
		if !f {
			return i, nil
		}
	}
	return len(found), nil
}

func (b *masterBackend) match(ctx context.Context, hashes []string) ([]masterconn.NodeMatch, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.c.MatchExternalKv(ctx, hashes)
}

// clear is refused: a distributed pool is cleared by its nodes, as in vLLM.
func (b *masterBackend) clear(context.Context) (bool, error) {
	return false, fmt.Errorf("%w: a distributed pool is cleared by its nodes, not through the master", ErrNotSupported)
}

func (b *masterBackend) ping(ctx context.Context) (ServerCapabilities, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	if err := b.c.Probe(ctx, false); err != nil {
		return ServerCapabilities{}, err
	}
	return ServerCapabilities{Ready: true, Mode: MasterMode}, nil
}

package umbp

import (
	"context"
	"fmt"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/rpc"
)

// standaloneBackend is a scheduler handle's link to a standalone server.
type standaloneBackend struct{ l *link }

func (b standaloneBackend) session() (lookupSource, error) {
	c, err := b.l.current()
	if err != nil {
		return nil, err
	}
	return standaloneSource{c: c, l: b.l}, nil
}

func (b standaloneBackend) encode(keys []string) (encoded.Keys, error) {
	return conn.EncodeAskable(keys)
}
func (b standaloneBackend) states() *connState               { return &b.l.st }
func (b standaloneBackend) capabilities() ServerCapabilities { return b.l.capabilities() }
func (b standaloneBackend) replicaStats() []ReplicaStats     { return nil }

// close: a lookup names no client memory, but closing a gRPC connection
// waits for its calls, so a connection with a call stuck in the server is
// closed once that call returns.
func (b standaloneBackend) close(stuck <-chan struct{}, timeout time.Duration) error {
	b.l.shutdown()
	c := b.l.conn()
	if stuck != nil {
		go func() {
			<-stuck
			_ = c.Close()
		}()
		return errLeftOpen("a call to the server never returned")
	}
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return errLeftOpen(fmt.Sprintf("closing it did not return in %v", timeout))
	}
}

// errLeftOpen is the error of a Close that left the connection open.
func errLeftOpen(reason string) error {
	return fmt.Errorf("the connection was left open: %s", reason)
}

// standaloneSource asks one connection to a standalone server; a transport
// failure makes the link look at its server at once.
type standaloneSource struct {
	c *conn.Conn
	l *link
}

func (s standaloneSource) exists(ctx context.Context, keys encoded.Keys) ([]bool, error) {
	hits, errs := s.c.BatchExistsEncoded(ctx, keys)
	return hits, s.failed(conn.Joined(errs))
}

func (s standaloneSource) prefix(ctx context.Context, keys encoded.Keys) (int, error) {
	n, err := s.c.BatchExistsConsecutiveEncoded(ctx, keys)
	return n, s.failed(err)
}

func (s standaloneSource) match(ctx context.Context, hashes []string) ([]masterconn.NodeMatch, error) {
	matches, err := s.c.MatchExternalKvOnce(ctx, hashes)
	if err != nil {
		return nil, s.failed(err)
	}
	return masterconn.CheckMatch(hashes, matches, rpc.MaxNodes)
}

func (s standaloneSource) clear(ctx context.Context) (bool, error) {
	ok, err := s.c.Clear(ctx)
	return ok, s.failed(err)
}

func (s standaloneSource) ping(ctx context.Context) (ServerCapabilities, error) {
	caps, err := s.c.Ping(ctx)
	return capabilitiesOf(caps), s.failed(err)
}

// can: lookups are lock-step but with Config.GRPCLookups; one server.
func (s standaloneSource) can() sourceCaps { return sourceCaps{lockStep: s.c.LockStepLookups()} }

func (s standaloneSource) probe(ctx context.Context, prefix bool) error {
	return s.failed(s.c.ProbeLookup(ctx, prefix))
}

func (s standaloneSource) failed(err error) error {
	s.l.failed(err)
	return err
}

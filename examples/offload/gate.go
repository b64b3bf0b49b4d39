package main

import (
	"context"
	"sync"

	"google.golang.org/grpc"
)

// stallGate holds every server handler while the server is "stalled", the
// way a SIGSTOPped or wedged server would hold its clients.
type stallGate struct {
	mu      sync.Mutex
	release chan struct{} // nil while running; closed on resume
}

func newStallGate() *stallGate { return &stallGate{} }

func (g *stallGate) stall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release == nil {
		g.release = make(chan struct{})
	}
}

func (g *stallGate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release != nil {
		close(g.release)
		g.release = nil
	}
}

// wait blocks while the gate is stalled, or until ctx ends.
func (g *stallGate) wait(ctx context.Context) error {
	g.mu.Lock()
	ch := g.release
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *stallGate) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.wait(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Package umbptest runs an in-process umbp standalone server on real Unix
// sockets, like net/http/httptest: a Go implementation of the server
// protocol with a DRAM pool, plus fault injection (stalls of chosen
// methods, failures, restarts, cut connections) and call counting. Tests
// use NewServer; programs and Examples use Start and Close.
//
//	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 64 << 20})
//	cfg := umbp.Config{Endpoint: srv.Endpoint()}
//
// For a distributed pool it runs a test double of MORI's UMBP master on
// loopback TCP (Master), or several replicas of one over a shared store, as
// MORI runs them over Redis (ReplicatedMaster), with faults of their own
// (stalls, suspension, failures, kill and restart, outages of the store);
// and it places nodes in a master over the master's own wire (Node), which
// hold keys, report external KV and heartbeat until closed.
//
//	m := umbptest.NewMaster(t, umbptest.MasterOptions{})
//	umbptest.NewNode(t, m.Addr(), umbptest.NodeOptions{ID: "node-a", Keys: keys})
//	cfg := umbp.ClusterConfig{Masters: []string{m.Addr()}}
package umbptest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/server"
)

// FDHandoff is the method name that Calls and FailNext use for the
// fd-handoff plane (one call per connection).
const FDHandoff = "FDHandoff"

// Options configure a test server. The zero value is a v2 server with a
// 1 GiB pool (reserved address space; pages are touched only when used).
type Options struct {
	// Capacity is the DRAM pool size in bytes; 0 means 1 GiB.
	Capacity uint64
	// Prefault maps the whole pool at start, so that no store pays for the
	// kernel's first touch of a page (as a long-running server's pool is):
	// for demos and benchmarks. It commits Capacity bytes of memory at once.
	Prefault bool
	// Version is 2 (the default when 0) or 1: a v1 server answers
	// BatchPutRanges and BatchGetRanges with codes.Unimplemented.
	Version int
	// DisableRangedIO makes a v2 server report supports_ranged_io=false
	// and refuse GPU IPC registration, as MORI's does with its SSD tier on.
	DisableRangedIO bool
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
}

// Server is a running test server. Its methods are safe for concurrent use.
type Server struct {
	opts     Options
	dir      string
	endpoint string

	mu     sync.Mutex
	srv    *server.Server
	gen    *generation
	faults *faults
	closed bool
}

// generation is one start of the server; done closes when it stops, which
// releases every handler of it that is stalled.
type generation struct {
	done chan struct{}

	mu    sync.Mutex
	conns map[*genConn]struct{} // its open gRPC connections
}

// genConn is a gRPC connection a generation accepted; it leaves the
// generation's set when gRPC closes it.
type genConn struct {
	net.Conn
	gen *generation
}

func (c *genConn) Close() error {
	c.gen.mu.Lock()
	delete(c.gen.conns, c)
	c.gen.mu.Unlock()
	return c.Conn.Close()
}

func (g *generation) track(c net.Conn) net.Conn {
	t := &genConn{Conn: c, gen: g}
	g.mu.Lock()
	g.conns[t] = struct{}{}
	g.mu.Unlock()
	return t
}

// NewServer starts a server as Start does and registers Close with
// tb.Cleanup. It fails tb if the server cannot start.
func NewServer(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := Start(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// Start starts a server on fresh sockets in a new short temporary
// directory. The caller must Close it.
func Start(opts Options) (*Server, error) {
	dir, err := shortTempDir()
	if err != nil {
		return nil, fmt.Errorf("umbptest: %w", err)
	}
	s := &Server{
		opts:     opts,
		dir:      dir,
		endpoint: "unix://" + filepath.Join(dir, "umbp.grpc.sock"),
		faults:   newFaults("server", nil),
	}
	if err := s.start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("umbptest: %w", err)
	}
	return s, nil
}

// shortTempDir makes a directory whose socket paths fit sun_path: $TMPDIR
// when it is short enough, else /tmp.
func shortTempDir() (string, error) {
	const longest = "/umbp.grpc.sock"
	dir, err := os.MkdirTemp("", "umbp")
	if err != nil {
		return "", fmt.Errorf("create a temporary directory: %w", err)
	}
	if len(dir)+len(longest) <= fdpass.MaxSocketPath {
		return dir, nil
	}
	_ = os.RemoveAll(dir)
	dir, err = os.MkdirTemp("/tmp", "umbp")
	if err != nil {
		return "", fmt.Errorf("create a temporary directory: %w", err)
	}
	return dir, nil
}

// start runs a new generation at the server's path. s.mu must not be held.
func (s *Server) start() error {
	gen := &generation{done: make(chan struct{}), conns: map[*genConn]struct{}{}}
	logger := s.opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	srv, err := server.New(server.Options{
		Endpoint:        s.endpoint,
		Capacity:        s.opts.Capacity,
		Prefault:        s.opts.Prefault,
		Version:         s.opts.Version,
		DisableRangedIO: s.opts.DisableRangedIO,
		Logger:          logger,
		UnaryInterceptor: func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := s.faults.enter(ctx, gen.done, path.Base(info.FullMethod)); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		},
		FDGate:   func(ctx context.Context) error { return s.faults.enter(ctx, gen.done, FDHandoff) },
		WrapConn: gen.track,
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed { // closed while starting
		s.mu.Unlock()
		close(gen.done)
		_ = srv.Close()
		return errors.New("umbptest: closed while restarting")
	}
	s.srv, s.gen = srv, gen
	s.mu.Unlock()
	return nil
}

// Endpoint is the gRPC address, "unix:///abs/path". It stays the same
// across Restart.
func (s *Server) Endpoint() string { return s.endpoint }

// FDSocketPath is the fd-handoff socket's path.
func (s *Server) FDSocketPath() string {
	_, p, _ := fdpass.SocketPaths(s.endpoint)
	return p
}

// Stall makes the handlers of the named methods (short gRPC names such as
// "BatchPutRanges", or FDHandoff) that start from now on wait until they
// are resumed, or until Restart or Close; with no names it stalls every
// method and the fd handoff. Calls of other methods run as usual, so a
// test can stall one method before a client starts and count on the
// client's first call of it being held. A stalled call whose client gives
// up ends with its context. Calls already running are not affected.
func (s *Server) Stall(methods ...string) {
	s.faults.stall(methods)
}

// Resume releases the stalled handlers of the named methods (those stalled
// by name; a Stall of every method stays), or with no names every stalled
// handler; they then run normally.
func (s *Server) Resume(methods ...string) {
	s.faults.resume(methods)
}

// FailNext makes the next n calls of method fail: gRPC methods (short names,
// e.g. "BatchPut") with codes.Unavailable, FDHandoff with status -1. It adds
// to failures already pending for method; n <= 0 clears them.
func (s *Server) FailNext(method string, n int) {
	s.faults.failNext(method, n, nil)
}

// Calls is how many calls of method (short name, or FDHandoff) reached the
// server, stalled and failed ones included, across restarts.
func (s *Server) Calls(method string) int {
	return s.faults.count(method)
}

// WaitCalls waits until n calls of method (short name, or FDHandoff) have
// reached the server (a stalled one counts once it is held), or ctx ends.
func (s *Server) WaitCalls(ctx context.Context, method string, n int) error {
	return s.faults.waitCalls(ctx, method, n)
}

// Restart stops the server and starts a new one at the same path with empty
// state: a new pool, no registrations. Stalled handlers of the old one are
// released with an error; a Stall in effect stays in effect.
func (s *Server) Restart() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("umbptest: Restart after Close")
	}
	srv, gen := s.srv, s.gen
	s.srv, s.gen = nil, nil
	s.mu.Unlock()
	if srv == nil {
		return errors.New("umbptest: Restart while another Restart runs")
	}
	close(gen.done)
	errClose := srv.Close()
	if err := s.start(); err != nil {
		return fmt.Errorf("umbptest: restart: %w", errors.Join(err, errClose))
	}
	if errClose != nil {
		return fmt.Errorf("umbptest: close before restart: %w", errClose)
	}
	return nil
}

// DropConnections cuts every client's gRPC connection while the server
// lives on with its pool and registrations: what a client sees of a
// transport that failed under a server that did not. Connections made
// after it are served as usual.
func (s *Server) DropConnections() {
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	if gen == nil {
		return
	}
	gen.mu.Lock()
	conns := make([]*genConn, 0, len(gen.conns))
	for c := range gen.conns {
		conns = append(conns, c)
	}
	gen.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Close stops the server: stalled handlers are released with an error,
// calls in flight finish, the sockets and the temporary directory are
// removed. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.faults.close()
	srv, gen := s.srv, s.gen
	s.srv, s.gen = nil, nil
	s.mu.Unlock()
	if gen != nil {
		close(gen.done)
	}
	var err error
	if srv != nil {
		if err = srv.Close(); err != nil {
			err = fmt.Errorf("umbptest: close: %w", err)
		}
	}
	_ = os.RemoveAll(s.dir)
	return err
}

// Stats is a snapshot of the server's state.
type Stats struct {
	// Objects and BytesUsed describe the stored objects.
	Objects   int
	BytesUsed uint64
	// Capacity is the pool size; Evictions counts LRU evictions since the
	// last (re)start.
	Capacity  uint64
	Evictions uint64
	// Regions and Clients count registered memory.
	Regions int
	Clients int
}

// Stats returns the current server's state (zero after Close).
func (s *Server) Stats() Stats {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return Stats{}
	}
	st := srv.Stats()
	return Stats{
		Objects: st.Objects, BytesUsed: st.BytesUsed, Capacity: st.Capacity,
		Evictions: st.Evictions, Regions: st.Regions, Clients: st.Clients,
	}
}

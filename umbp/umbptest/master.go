package umbptest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/internal/masterdouble"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// MasterOptions configure a test master. The zero value has MORI's
// defaults: a 10 s heartbeat TTL, 3 missed heartbeats to expiry, a reaper
// pass every 5 s, on the real clock.
type MasterOptions struct {
	// Addr is the TCP address to listen on; "" is 127.0.0.1:0.
	Addr string
	// HeartbeatTTL × MaxMissedHeartbeats is how long after its last
	// heartbeat a node is expired by the next reaper pass.
	HeartbeatTTL        time.Duration
	MaxMissedHeartbeats int
	// ReaperInterval is how often the reaper runs on its own; 0 is 5 s,
	// negative never (the test calls Reap).
	ReaperInterval time.Duration
	// HitQueryMaxBatch bounds GetExternalKvHitCounts (0 is 4096).
	HitQueryMaxBatch int
	// Now is the master's clock; nil is time.Now. With a clock of its own a
	// test moves time and calls Reap, and nothing waits on real time.
	Now func() time.Time
}

// Master is an in-process test double of MORI's UMBP master (gRPC service
// umbp.UMBPMaster) on loopback TCP: membership, sequence-numbered
// heartbeat bundles, expiry, BatchLookup and the external KV index, with
// the answers MORI's master gives (MORI's master is the engine; where they
// differ, the double is wrong). Fault injection: stalls of chosen methods,
// failures, Kill and Restart on the same address. Its methods are safe for
// concurrent use.
//
// The master's semantics it implements:
//
//   - RegisterClient adds a node (any id, "" included), or replaces the
//     record of an expired or stale one (no heartbeat for TTL × missed);
//     an alive node gets codes.AlreadyExists. The answer is
//     heartbeat_interval_ms = TTL/2 and ack_seq 0: the first delta bundle
//     is seq 1.
//   - Heartbeat (see masterdouble.Service.Heartbeat): a gap or a resend
//     asks for a full sync; an expired node that heartbeats again is alive
//     with an empty index and is not asked to resync; an unknown node is
//     answered status UNKNOWN.
//   - UnregisterClient drops a node's keys and external KV at once;
//     unknown nodes are no error.
//   - BatchLookup: found[i] when any node holds keys[i] on any tier; no
//     side effects, no limit on the number of keys.
//   - ReportExternalKvBlocks / Revoke*: an index apart from the
//     heartbeat one; a report from a node not alive is silently dropped.
//   - MatchExternalKv: per node, the request's hashes it holds by tier
//     (each hash independently, not a prefix; repeats kept); nodes sorted
//     by id (MORI's order is unspecified). count_as_hit counts each
//     distinct matched hash once; GetExternalKvHitCounts answers the
//     distinct hashes that have hits, and refuses more than 4096.
//   - RouteGet, RoutePut, BatchRouteGet, BatchRoutePut: codes.Unimplemented
//     (they lease and count; the double does no routing).
type Master struct {
	opts MasterOptions
	addr string

	mu     sync.Mutex
	svc    *masterdouble.Service
	srv    *grpc.Server
	gen    *generation
	faults *faults
	closed bool
	reaper chan struct{} // closed to stop the reaper
	wg     sync.WaitGroup
}

// NewMaster starts a master as StartMaster does and registers Close with
// tb.Cleanup. It fails tb if the master cannot start.
func NewMaster(tb testing.TB, opts MasterOptions) *Master {
	tb.Helper()
	m, err := StartMaster(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Close(); err != nil {
			tb.Error(err)
		}
	})
	return m
}

// StartMaster starts a master. The caller must Close it.
func StartMaster(opts MasterOptions) (*Master, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	m := &Master{
		opts:   opts,
		faults: newFaults("master"),
		reaper: make(chan struct{}),
	}
	if err := m.start(opts.Addr); err != nil {
		return nil, fmt.Errorf("umbptest: master: %w", err)
	}
	if opts.ReaperInterval >= 0 {
		every := opts.ReaperInterval
		if every == 0 {
			every = 5 * time.Second
		}
		m.wg.Go(func() { m.reap(every) })
	}
	return m, nil
}

func (m *Master) reap(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.reaper:
			return
		case <-t.C:
			m.Reap()
		}
	}
}

// start serves a new, empty master on addr. m.mu must not be held.
func (m *Master) start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	svc := masterdouble.New(masterdouble.Options{
		HeartbeatTTL:        m.opts.HeartbeatTTL,
		MaxMissedHeartbeats: m.opts.MaxMissedHeartbeats,
		HitQueryMaxBatch:    m.opts.HitQueryMaxBatch,
		Now:                 m.opts.Now,
	})
	gen := &generation{done: make(chan struct{})}
	srv := grpc.NewServer(
		grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := m.faults.enter(ctx, gen.done, path.Base(info.FullMethod)); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}))
	umbppb.RegisterUMBPMasterServer(srv, svc)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		_ = ln.Close()
		return errors.New("closed while restarting")
	}
	m.svc, m.srv, m.gen = svc, srv, gen
	if m.addr == "" {
		m.addr = ln.Addr().String()
	}
	m.mu.Unlock()
	m.wg.Go(func() { _ = srv.Serve(ln) })
	return nil
}

// Addr is the master's host:port (a gRPC target as it is). It stays the
// same across Kill and Restart.
func (m *Master) Addr() string { return m.addr }

// Stall makes the handlers of the named methods (short names such as
// "BatchLookup") that start from now on wait until Resume, Kill, Restart
// or Close; with no names it stalls every method, as a stopped process
// (SIGSTOP) does: connections stay up and calls hang until their deadline.
// Calls already running are not affected.
func (m *Master) Stall(methods ...string) {
	m.faults.stall(methods)
}

// Resume releases the stalled handlers of the named methods (those stalled
// by name), or with no names every stalled handler.
func (m *Master) Resume(methods ...string) {
	m.faults.resume(methods)
}

// FailNext makes the next n calls of method fail with codes.Unavailable
// before they reach the master; n <= 0 clears pending failures.
func (m *Master) FailNext(method string, n int) {
	m.faults.failNext(method, n)
}

// Calls is how many calls of method (short name) reached the master,
// stalled and failed ones included, across restarts.
func (m *Master) Calls(method string) int {
	return m.faults.count(method)
}

// WaitCalls waits until n calls of method have reached the master (a
// stalled one counts once it is held), or ctx ends.
func (m *Master) WaitCalls(ctx context.Context, method string, n int) error {
	return m.faults.waitCalls(ctx, method, n)
}

// Reap runs one reaper pass now (see masterdouble.Service.Reap) and
// returns the nodes it expired. It does nothing while the master is down.
func (m *Master) Reap() []string {
	if svc := m.service(); svc != nil {
		return svc.Reap()
	}
	return nil
}

// WaitExpired waits until a reaper pass has expired node (or it has no
// record), or ctx ends.
func (m *Master) WaitExpired(ctx context.Context, node string) error {
	svc := m.service()
	if svc == nil {
		return errors.New("umbptest: master is down")
	}
	return svc.WaitExpired(ctx, node)
}

// MasterNode is a snapshot of a node's record in the master.
type MasterNode = masterdouble.Node

// The statuses of a MasterNode.
const (
	MasterNodeAlive   = masterdouble.Alive
	MasterNodeExpired = masterdouble.Expired
)

// Node returns the master's record of a node.
func (m *Master) Node(id string) (MasterNode, bool) {
	if svc := m.service(); svc != nil {
		return svc.Node(id)
	}
	return MasterNode{}, false
}

func (m *Master) service() *masterdouble.Service {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.svc
}

// stop ends the running generation as a killed process does: connections
// close at once, calls in flight and stalled ones fail.
func (m *Master) stop() {
	m.mu.Lock()
	srv, gen := m.srv, m.gen
	m.srv, m.gen, m.svc = nil, nil, nil
	m.mu.Unlock()
	if gen != nil {
		close(gen.done)
	}
	if srv != nil {
		srv.Stop()
	}
}

// Kill stops the master as SIGKILL does: connections are closed at once,
// calls fail, and the address refuses connections until Restart.
func (m *Master) Kill() {
	m.stop()
}

// Restart kills the master if it runs and starts an empty one (no nodes,
// no keys) on the same address, as a restarted process is. A Stall in
// effect stays in effect.
func (m *Master) Restart() error {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return errors.New("umbptest: master: Restart after Close")
	}
	m.stop()
	if err := m.start(m.addr); err != nil {
		return fmt.Errorf("umbptest: master: restart: %w", err)
	}
	return nil
}

// Close stops the master and its reaper. It is idempotent.
func (m *Master) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	m.faults.close()
	m.stop()
	close(m.reaper)
	m.wg.Wait()
	return nil
}

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
	// Addr is the TCP address to listen on; "" is 127.0.0.1:0. The
	// replicas of a ReplicatedMaster listen on its host, each on a port
	// of its own: its port must then be 0.
	Addr string
	// HeartbeatTTL × MaxMissedHeartbeats is how long after its last
	// heartbeat a node is expired by the next reaper pass.
	HeartbeatTTL        time.Duration
	MaxMissedHeartbeats int
	// ReaperInterval is how often the reaper runs on its own; 0 is 5 s,
	// negative never (the test calls Reap). It runs while the master, or
	// any replica, runs (not killed, not suspended) and its store is up.
	ReaperInterval time.Duration
	// HitQueryMaxBatch bounds GetExternalKvHitCounts (0 is 4096).
	HitQueryMaxBatch int
	// Now is the master's clock; nil is time.Now. With a clock of its own a
	// test moves time and calls Reap, and nothing waits on real time.
	Now func() time.Time
	// StoreTimeout is how long a replica waits for a stopped store
	// (StoreStopped) before it answers codes.Unavailable; 0 is 1 s, MORI's
	// (the socket timeout of its store client). It is real time, whatever
	// Now is. A lone master has no store to lose and ignores it.
	StoreTimeout time.Duration
}

// Master is an in-process test double of MORI's UMBP master (gRPC service
// umbp.UMBPMaster) on loopback TCP: membership, sequence-numbered
// heartbeat bundles, expiry, BatchLookup and the external KV index, with
// the answers MORI's master gives (MORI's master is the engine; where they
// differ, the double is wrong). Fault injection: stalls of chosen methods,
// failures, a suspension of the whole process, Kill and Restart on the
// same address. Its methods are safe for concurrent use.
//
// A Master is one master process. Started alone (NewMaster, StartMaster)
// it keeps its state in its memory, as MORI's master does by default:
// Kill loses it, Restart starts empty. As a replica of a ReplicatedMaster
// its state is in the store the replicas share: Restart serves all of it
// at once, and Reap, WaitExpired and Node see the shared state.
//
// The master's semantics it implements:
//
//   - RegisterClient adds a node (any id, "" included), or replaces the
//     record of an expired or stale one (no heartbeat for TTL × missed);
//     an alive node gets codes.AlreadyExists. The answer is
//     heartbeat_interval_ms = TTL/2 and ack_seq 0: the first delta bundle
//     is seq 1.
//   - Heartbeat: a full sync replaces the node's keys with its ADD events
//     and takes delta_seq_baseline as applied; bundles apply in order while
//     each seq is one past the last applied, and a gap or a resend asks
//     for a full sync; no bundles is a keepalive. An expired node that
//     heartbeats again is alive with an empty index and is not asked to
//     resync; an unknown node is answered status UNKNOWN.
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
	state  *masterState
	faults *faults

	mu     sync.Mutex
	addr   string // the address listened on; fixed by the first start
	srv    *grpc.Server
	gen    *generation
	closed bool
	wg     sync.WaitGroup // Serve
}

// masterState is what a master's processes share: the store (a lone
// master's own memory, or the replicas' RESP store), its reaper and the
// count of every replica's calls.
type masterState struct {
	opts  MasterOptions
	lone  bool // the state dies with the one master that holds it
	calls *callCounter

	mu       sync.Mutex
	svc      *masterdouble.Service // nil while a lone master is down
	replicas []*Master
	closed   bool

	stopReaper chan struct{}
	wg         sync.WaitGroup // the reaper
}

func newMasterState(opts MasterOptions, lone bool) *masterState {
	st := &masterState{opts: opts, lone: lone, calls: newCallCounter(), stopReaper: make(chan struct{})}
	if !lone {
		st.svc = st.newService()
	}
	return st
}

func (st *masterState) newService() *masterdouble.Service {
	return masterdouble.New(masterdouble.Options{
		HeartbeatTTL:        st.opts.HeartbeatTTL,
		MaxMissedHeartbeats: st.opts.MaxMissedHeartbeats,
		HitQueryMaxBatch:    st.opts.HitQueryMaxBatch,
		Now:                 st.opts.Now,
		StoreTimeout:        st.opts.StoreTimeout,
	})
}

// service is the state, or nil while a lone master is down.
func (st *masterState) service() *masterdouble.Service {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.svc
}

// startReaper runs the reaper unless the options turn it off.
func (st *masterState) startReaper() {
	if st.opts.ReaperInterval < 0 {
		return
	}
	every := st.opts.ReaperInterval
	if every == 0 {
		every = 5 * time.Second
	}
	st.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-st.stopReaper:
				return
			case <-t.C:
				if svc := st.service(); svc != nil && st.anyRunning() {
					svc.Reap()
				}
			}
		}
	})
}

// anyRunning reports whether a master process runs: neither killed nor
// suspended. MORI runs a reaper in every replica.
func (st *masterState) anyRunning() bool {
	st.mu.Lock()
	rs := st.replicas
	st.mu.Unlock()
	for _, m := range rs {
		if m.running() {
			return true
		}
	}
	return false
}

// close closes every replica and the reaper. It is idempotent.
func (st *masterState) close() {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return
	}
	st.closed = true
	rs := st.replicas
	st.mu.Unlock()
	for _, m := range rs {
		m.closeProcess()
	}
	close(st.stopReaper)
	st.wg.Wait()
}

// newReplica starts a master process of st on addr.
func (st *masterState) newReplica(addr string) (*Master, error) {
	m := &Master{state: st, faults: newFaults("master", st.calls), addr: addr}
	if err := m.start(); err != nil {
		return nil, err
	}
	st.mu.Lock()
	st.replicas = append(st.replicas, m)
	st.mu.Unlock()
	return m, nil
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

// StartMaster starts a lone master, which keeps its state in its memory.
// The caller must Close it.
func StartMaster(opts MasterOptions) (*Master, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	st := newMasterState(opts, true)
	m, err := st.newReplica(opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("umbptest: master: %w", err)
	}
	st.startReaper()
	return m, nil
}

// start serves the master on its address. m.mu must not be held.
func (m *Master) start() error {
	m.mu.Lock()
	addr := m.addr
	m.mu.Unlock()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	m.state.mu.Lock()
	if m.state.svc == nil { // a lone master starts empty
		m.state.svc = m.state.newService()
	}
	svc := m.state.svc
	m.state.mu.Unlock()
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
	m.srv, m.gen = srv, gen
	m.addr = ln.Addr().String()
	m.mu.Unlock()
	gl := &suspendableListener{Listener: ln, faults: m.faults, done: gen.done}
	m.wg.Go(func() { _ = srv.Serve(gl) })
	return nil
}

// running reports whether the process serves: started, not killed, not
// suspended.
func (m *Master) running() bool {
	m.mu.Lock()
	up := m.srv != nil
	m.mu.Unlock()
	return up && m.faults.suspension() == nil
}

// Addr is the master's host:port (a gRPC target as it is). It stays the
// same across Kill and Restart.
func (m *Master) Addr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addr
}

// Stall makes the handlers of the named methods (short names such as
// "BatchLookup") that start from now on wait until Resume, Kill, Restart
// or Close; with no names it stalls every method: connections stay up and
// calls hang until their deadline. The transport still answers (new
// connections, HTTP/2 pings), and a stalled call counts in Calls; for a
// process that answers nothing at all, see Suspend. Calls already running
// are not affected.
func (m *Master) Stall(methods ...string) {
	m.faults.stall(methods)
}

// Suspend stops the master as SIGSTOP stops a process: connections are
// still accepted (by the kernel, as a stopped process's are), but nothing
// more is read or written on any connection, so new connections never
// finish their handshake, HTTP/2 pings go unanswered and calls hang until
// their deadline; they reach the master (and count in Calls) only after
// Resume, with what arrived meanwhile. Resume with no names ends it; Kill,
// Restart and Close end it too.
func (m *Master) Suspend() {
	m.faults.suspend()
}

// Resume releases the stalled handlers of the named methods (those stalled
// by name), or with no names every stalled handler and a suspension.
func (m *Master) Resume(methods ...string) {
	m.faults.resume(methods)
}

// SetLatency makes every call to the master from now on wait d before it
// is answered (a replica slow in itself, whatever its store does: its
// lookups of no key too); 0 ends it.
func (m *Master) SetLatency(d time.Duration) {
	m.faults.setLatency(d)
}

// FailNext makes the next n calls of method fail with codes.Unavailable
// before they reach the master; n <= 0 clears pending failures.
func (m *Master) FailNext(method string, n int) {
	m.faults.failNext(method, n, nil)
}

// FailNextWith makes the next n calls of method fail with err before they
// reach the master: a gRPC status error (status.Error) reaches the client
// as it is, any other error as codes.Unknown. It adds to the failures
// already pending for method (they come first); n <= 0 clears them.
func (m *Master) FailNextWith(method string, n int, err error) {
	if err == nil {
		err = errors.New("umbptest: FailNextWith without an error")
	}
	m.faults.failNext(method, n, err)
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

// Reap runs one reaper pass now and returns the nodes it expired: every
// alive node whose last heartbeat is older than TTL × missed heartbeats
// loses its keys and external KV (its record stays, expired, so that it
// may heartbeat again); hit counts older than 2 h are dropped. It does
// nothing while a lone master is down, nor while the store is out.
func (m *Master) Reap() []string {
	if svc := m.state.service(); svc != nil {
		return svc.Reap()
	}
	return nil
}

// WaitExpired waits until a reaper pass has expired node (or it has no
// record), or ctx ends.
func (m *Master) WaitExpired(ctx context.Context, node string) error {
	svc := m.state.service()
	if svc == nil {
		return errors.New("umbptest: master is down")
	}
	return svc.WaitExpired(ctx, node)
}

// Node returns the master's record of a node.
func (m *Master) Node(id string) (MasterNode, bool) {
	return nodeOf(m.state.service(), id)
}

// stop ends the running generation as a killed process does: connections
// close at once, calls in flight and stalled ones fail, a suspension ends.
// A lone master's state is lost.
func (m *Master) stop() {
	m.mu.Lock()
	srv, gen := m.srv, m.gen
	m.srv, m.gen = nil, nil
	m.mu.Unlock()
	if gen != nil {
		close(gen.done)
	}
	m.faults.unsuspend()
	if srv != nil {
		srv.Stop()
	}
	if m.state.lone {
		m.state.mu.Lock()
		m.state.svc = nil
		m.state.mu.Unlock()
	}
}

// Kill stops the master as SIGKILL does: connections are closed at once,
// calls fail, and the address refuses connections until Restart. A lone
// master's state is lost.
func (m *Master) Kill() {
	m.stop()
}

// Restart kills the master if it runs and starts it again on the same
// address: a lone master empty (no nodes, no keys), as a restarted process
// is; a replica serving the shared state at once, as MORI's replicas over
// Redis do. A Stall in effect stays in effect; a suspension does not.
func (m *Master) Restart() error {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return errors.New("umbptest: master: Restart after Close")
	}
	m.stop()
	if err := m.start(); err != nil {
		return fmt.Errorf("umbptest: master: restart: %w", err)
	}
	return nil
}

// Close stops the master for good: a lone master and its reaper; a
// replica alone (the others and the store live on). It is idempotent.
func (m *Master) Close() error {
	if m.state.lone {
		m.state.close()
		return nil
	}
	m.closeProcess()
	return nil
}

// closeProcess stops this process for good.
func (m *Master) closeProcess() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.mu.Unlock()
	m.faults.close()
	m.stop()
	m.wg.Wait()
}

// MasterNode is a snapshot of a node's record in the master.
type MasterNode struct {
	ID          string
	PeerAddress string
	Status      MasterNodeStatus
	// LastHeartbeat is on the master's clock.
	LastHeartbeat time.Time
	// AppliedSeq is the last heartbeat bundle seq applied.
	AppliedSeq uint64
	// Keys is how many keys of the heartbeat index the node holds (a key
	// held on two tiers counts once).
	Keys int
	// Capacities are the tier capacities last applied.
	Capacities map[Tier]TierCapacity
}

// TierCapacity is one tier's capacity as a node reports it.
type TierCapacity struct{ Total, Available uint64 }

// MasterNodeStatus is what the master knows of a node. A node that
// unregistered has no record.
type MasterNodeStatus int

// The statuses of a MasterNode.
const (
	MasterNodeAlive MasterNodeStatus = iota + 1
	MasterNodeExpired
)

// String returns "alive" or "expired".
func (s MasterNodeStatus) String() string {
	switch s {
	case MasterNodeAlive:
		return "alive"
	case MasterNodeExpired:
		return "expired"
	}
	return fmt.Sprintf("MasterNodeStatus(%d)", int(s))
}

func nodeOf(svc *masterdouble.Service, id string) (MasterNode, bool) {
	if svc == nil {
		return MasterNode{}, false
	}
	n, ok := svc.Node(id)
	if !ok {
		return MasterNode{}, false
	}
	out := MasterNode{
		ID: n.ID, PeerAddress: n.PeerAddress, LastHeartbeat: n.LastHeartbeat,
		AppliedSeq: n.AppliedSeq, Keys: n.Keys,
		Capacities: make(map[Tier]TierCapacity, len(n.Capacities)),
	}
	switch n.Status {
	case masterdouble.Alive:
		out.Status = MasterNodeAlive
	case masterdouble.Expired:
		out.Status = MasterNodeExpired
	}
	for t, c := range n.Capacities {
		out.Capacities[Tier(t)] = TierCapacity{Total: c.Total, Available: c.Available}
	}
	return out, true
}

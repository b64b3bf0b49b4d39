package umbptest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/masterdouble"
)

// ReplicatedMaster is MORI's master as it runs over a RESP store (Redis):
// any number of stateless replicas, each a Master on a loopback port of its
// own, serving one shared state. A node may register and heartbeat through
// any replica and is seen through all of them; one reaper expires nodes
// for all of them. Each replica has its own faults (Stall, Suspend,
// FailNext, Kill, Restart) and call counts; the store's outages (FailStore)
// are seen by every replica at once. Its methods are safe for concurrent
// use.
//
// What MORI's replicas answer, and the double with them:
//
//   - A replica killed refuses connections; one restarted serves the whole
//     shared state at once (MORI's, about 65 ms after it starts).
//   - A replica stopped (SIGSTOP: Suspend) takes connections and answers
//     nothing until resumed.
//   - The store stopped: every replica answers codes.Unavailable
//     "<Method>: metadata store unavailable: …" after the store's timeout
//     (MasterOptions.StoreTimeout; MORI's is 1 s). The store killed: the
//     same, at once. A Redis Cluster whose state failed: lookups answer OK
//     with nothing found and matches name no node, so an outage there looks
//     like misses, not errors.
type ReplicatedMaster struct {
	state *masterState
}

// NewReplicatedMaster starts n replicas as StartReplicatedMaster does and
// registers Close with tb.Cleanup. It fails tb if they cannot start.
func NewReplicatedMaster(tb testing.TB, n int, opts MasterOptions) *ReplicatedMaster {
	tb.Helper()
	r, err := StartReplicatedMaster(n, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := r.Close(); err != nil {
			tb.Error(err)
		}
	})
	return r
}

// StartReplicatedMaster starts n replicas (n >= 1) of one master over one
// shared, empty store, each on a port of its own of opts.Addr's host. The
// caller must Close it.
func StartReplicatedMaster(n int, opts MasterOptions) (*ReplicatedMaster, error) {
	if n < 1 {
		return nil, fmt.Errorf("umbptest: replicated master: %d replicas, want at least 1", n)
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if _, port, err := net.SplitHostPort(opts.Addr); err != nil {
		return nil, fmt.Errorf("umbptest: replicated master: %w", err)
	} else if port != "0" && n > 1 {
		return nil, fmt.Errorf("umbptest: replicated master: Addr %q: %d replicas cannot share one port: give port 0", opts.Addr, n)
	}
	r := &ReplicatedMaster{state: newMasterState(opts, false)}
	for range n {
		if _, err := r.state.newReplica(opts.Addr); err != nil {
			r.state.close()
			return nil, fmt.Errorf("umbptest: replicated master: %w", err)
		}
	}
	r.state.startReaper()
	return r, nil
}

// Replica returns replica i (0 <= i < Len). It panics if i is out of range.
func (r *ReplicatedMaster) Replica(i int) *Master {
	r.state.mu.Lock()
	defer r.state.mu.Unlock()
	return r.state.replicas[i]
}

// Len is the number of replicas.
func (r *ReplicatedMaster) Len() int {
	r.state.mu.Lock()
	defer r.state.mu.Unlock()
	return len(r.state.replicas)
}

// Addrs are the replicas' addresses, in replica order; each stays the same
// across Kill and Restart.
func (r *ReplicatedMaster) Addrs() []string {
	r.state.mu.Lock()
	rs := r.state.replicas
	r.state.mu.Unlock()
	out := make([]string, len(rs))
	for i, m := range rs {
		out[i] = m.Addr()
	}
	return out
}

// Calls is how many calls of method (short name) reached any replica.
func (r *ReplicatedMaster) Calls(method string) int {
	return r.state.calls.count(method)
}

// WaitCalls waits until n calls of method have reached the replicas
// together, or ctx ends.
func (r *ReplicatedMaster) WaitCalls(ctx context.Context, method string, n int) error {
	return r.state.calls.wait(ctx, method, n)
}

// StoreFault is an outage of the store under the replicas.
type StoreFault int

// The store's outages, as every replica answers them.
const (
	// StoreStopped is a store that takes connections and answers nothing
	// (Redis stopped with SIGSTOP): every call that needs it waits up to
	// MasterOptions.StoreTimeout and fails with codes.Unavailable
	// "<Method>: metadata store unavailable: …"; a call still waiting when
	// RestoreStore is called goes on as usual. A write that failed is not
	// applied (MORI's may have been).
	StoreStopped StoreFault = iota + 1
	// StoreDown is a store that refuses connections (Redis killed): every
	// call that needs it fails at once, as StoreStopped's do.
	StoreDown
	// StoreClusterDown is a Redis Cluster whose state failed: BatchLookup,
	// MatchExternalKv and GetExternalKvHitCounts answer OK with nothing
	// found (and count no hit); every other call fails at once, as
	// StoreStopped's do.
	StoreClusterDown
)

// String names the fault.
func (f StoreFault) String() string {
	switch f {
	case StoreStopped:
		return "store stopped"
	case StoreDown:
		return "store down"
	case StoreClusterDown:
		return "store cluster down"
	}
	return fmt.Sprintf("StoreFault(%d)", int(f))
}

// StoreUnavailable is the phrase in the message of every call that a
// replica fails because of its store, as in MORI's: "<Method>: metadata
// store unavailable: <cause>".
const StoreUnavailable = "metadata store unavailable"

// FailStore makes the store fail as f says until RestoreStore. Arguments
// are checked first: a call with a bad one is answered as usual. Nothing
// is lost. The reaper does nothing meanwhile (MORI's cannot reach the
// store). ReportMetrics needs no store and answers as usual.
func (r *ReplicatedMaster) FailStore(f StoreFault) {
	var o masterdouble.Outage
	switch f {
	case StoreStopped:
		o = masterdouble.StoreStopped
	case StoreDown:
		o = masterdouble.StoreDown
	case StoreClusterDown:
		o = masterdouble.StoreClusterDown
	default:
		panic(fmt.Sprintf("umbptest: FailStore(%v)", f))
	}
	r.state.svc.SetOutage(o)
}

// RestoreStore ends an outage of the store, with all it held: a store that
// resumes, or restarts from its append-only file before any node expired.
func (r *ReplicatedMaster) RestoreStore() {
	r.state.svc.SetOutage(masterdouble.StoreUp)
}

// SlowStore makes every trip of every replica to the store take what
// latency returns, while the store is up (a store slow for all of them);
// nil ends it. A lookup of no key never reads the store, as MORI's never
// does, and is not slowed.
func (r *ReplicatedMaster) SlowStore(latency func() time.Duration) {
	r.state.svc.SetStoreLatency(latency)
}

// WipeStore empties the store, as a store restarted without persistence
// is: every node, key, external KV block and hit count is forgotten.
// Nodes are answered UNKNOWN at their next heartbeat; MORI's nodes then
// register again and send their keys in a full sync, but their external KV
// is lost until reported again.
func (r *ReplicatedMaster) WipeStore() {
	r.state.svc.Wipe()
}

// Reap runs one reaper pass now on the shared state and returns the nodes
// it expired (none while the store is out).
func (r *ReplicatedMaster) Reap() []string {
	return r.state.svc.Reap()
}

// WaitExpired waits until a reaper pass has expired node (or it has no
// record), or ctx ends.
func (r *ReplicatedMaster) WaitExpired(ctx context.Context, node string) error {
	return r.state.svc.WaitExpired(ctx, node)
}

// Node returns the shared state's record of a node.
func (r *ReplicatedMaster) Node(id string) (MasterNode, bool) {
	return nodeOf(r.state.svc, id)
}

// Close stops every replica and the reaper. It is idempotent.
func (r *ReplicatedMaster) Close() error {
	r.state.close()
	return nil
}

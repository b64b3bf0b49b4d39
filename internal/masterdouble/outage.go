package masterdouble

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Outage is a failure of the metadata store under MORI's master: its RESP
// store (Redis), which every replica over it sees the same. A call meets
// the outage after its arguments are checked (a bad argument is answered
// as usual) and before it reads or writes anything. ReportMetrics does not
// touch the store and is answered as usual.
type Outage int

// The outages of the store, as MORI's replicas answer them (MORI main
// 624002c8: master_server.cpp turns an error of the store into
// codes.Unavailable "<Method>: metadata store unavailable: <cause>").
const (
	// StoreUp is no outage.
	StoreUp Outage = iota
	// StoreStopped is a store that takes connections and answers nothing
	// (Redis stopped with SIGSTOP): a call waits for it up to
	// Options.StoreTimeout and then fails with codes.Unavailable. If the
	// outage ends meanwhile the call goes on and is answered as usual. A
	// write that failed this way is not applied here (MORI's may have
	// been: its script may still run when the store resumes).
	StoreStopped
	// StoreDown is a store that refuses connections (Redis killed): every
	// call fails at once with codes.Unavailable.
	StoreDown
	// StoreClusterDown is a Redis Cluster whose state failed (a shard
	// down): the reads (BatchLookup, MatchExternalKv,
	// GetExternalKvHitCounts) answer OK with nothing found, and count no
	// hit; every other call fails at once with codes.Unavailable.
	StoreClusterDown
)

// String names the outage.
func (o Outage) String() string {
	switch o {
	case StoreUp:
		return "up"
	case StoreStopped:
		return "stopped"
	case StoreDown:
		return "down"
	case StoreClusterDown:
		return "cluster down"
	}
	return "Outage(" + strconv.Itoa(int(o)) + ")"
}

// StoreUnavailable is the phrase MORI's master puts in the message of
// every call that failed on its store: "<Method>: metadata store
// unavailable: <cause>".
const StoreUnavailable = "metadata store unavailable"

// SetOutage makes the store fail as o says from now on; StoreUp ends the
// outage, with everything the store held (a store that resumes, or restarts
// from its append-only file). Calls waiting on a stopped store are
// answered according to the new state.
func (s *Service) SetOutage(o Outage) {
	s.omu.Lock()
	defer s.omu.Unlock()
	if o == s.outage {
		return
	}
	s.outage = o
	close(s.changed)
	s.changed = make(chan struct{})
}

// SetStoreLatency makes every trip to the store, while it is up, take
// what latency returns (a store slow for every replica over it); nil ends
// it. A lookup of no key never goes to the store, and is not slowed.
func (s *Service) SetStoreLatency(latency func() time.Duration) {
	s.omu.Lock()
	defer s.omu.Unlock()
	s.latency = latency
}

// Outage is the store's outage now.
func (s *Service) Outage() Outage {
	s.omu.Lock()
	defer s.omu.Unlock()
	return s.outage
}

// Wipe forgets everything the store holds: nodes, both indexes and hit
// counts, as a store restarted empty has. Nodes that heartbeat are then
// answered UNKNOWN and must register again. Whoever waits in WaitExpired
// for a node is woken: it has no record any more.
func (s *Service) Wipe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.clients)
	clear(s.blocks)
	clear(s.nodeKeys)
	clear(s.ext)
	clear(s.hits)
	close(s.expired)
	s.expired = make(chan struct{})
}

// store is a call's trip to the store. It answers nil when the store is
// up, nothing when the call is a read that a failed cluster answers as
// "nothing found", or the error the call fails with.
func (s *Service) store(ctx context.Context, method string, read bool) (nothing bool, err error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s.omu.Lock()
		o, changed, latency := s.outage, s.changed, s.latency
		s.omu.Unlock()
		switch o {
		case StoreUp:
			if latency != nil {
				return false, slow(ctx, latency())
			}
			return false, nil
		case StoreDown:
			return false, unavailable(method, "connection refused")
		case StoreClusterDown:
			if read {
				return true, nil
			}
			return false, unavailable(method, "CLUSTERDOWN the cluster is down")
		}
		if timer == nil {
			timer = time.NewTimer(s.opts.StoreTimeout)
			if s.onWait != nil {
				s.onWait("store")
			}
		}
		select {
		case <-changed:
		case <-timer.C:
			return false, unavailable(method, "timed out after "+s.opts.StoreTimeout.String())
		case <-ctx.Done():
			return false, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// slow waits d, as a slow store's answer; ctx ending first fails the call
// as a cancelled one.
func slow(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func unavailable(method, cause string) error {
	return status.Error(codes.Unavailable, method+": "+StoreUnavailable+": "+cause)
}

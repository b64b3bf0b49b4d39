package umbp

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a handle's health: its state, what the server
// offers, and its counters since the handle was created. Both kinds of
// handle return it; each fills only its own group of counters (Lookups on a
// scheduler handle, Transfers on a worker handle) and leaves the other zero.
type Stats struct {
	State        HandleState
	Capabilities ServerCapabilities
	Reconnects   uint64 // attachments to a new server after the first

	Lookups   LookupStats   // a scheduler handle's; zero on a worker handle
	Transfers TransferStats // a worker handle's; zero on a scheduler handle
	// Replicas are a scheduler handle's master replicas, in the order of
	// ClusterConfig.Masters; nil on a standalone server.
	Replicas []ReplicaStats
}

// ReplicaStats are the counters of one of the master's replicas, as one
// handle sees it.
type ReplicaStats struct {
	Addr string
	// State is StateConnected while calls go to it: its channel is up and
	// it is not set aside.
	State HandleState
	// SetAside: it was overtaken by another replica's answer or failed,
	// and is probed until it answers again.
	SetAside bool
	Calls    uint64 // calls sent to it, hedges included
	Hedges   uint64 // calls sent to it because another had not answered in time
	Answers  uint64 // its answers that were used
	// SetAsides counts the times it was set aside.
	SetAsides uint64
	// Latency is a moving average of its answers' time.
	Latency time.Duration
	// Beats counts the liveness checks (lookups of no key, which never
	// read the master's store) sent to it while calls were in flight: one
	// silent while another replica answers is set aside at once.
	Beats uint64
}

// LookupStats are a scheduler handle's counters. A call is counted in
// Calls, and, if it did not get an answer for every key, in exactly one of
// Timeouts, Failures, Unasked and Cancelled.
type LookupStats struct {
	Calls uint64 // Lookup and LookupPrefix calls with keys, Score calls with blocks to ask about
	Hits  uint64 // keys answered present
	// Misses counts keys answered absent, and the keys of calls that
	// failed, timed out or went unasked; not the keys a call's caller
	// left unanswered (Cancelled), which say nothing of the pool.
	Misses uint64
	// Timeouts counts calls that got no reply within LookupTimeout for
	// some of their keys: a stalled server, or a batch too large to ask
	// within the bound.
	Timeouts uint64
	Failures uint64 // calls the server (or the transport) failed or refused
	// Unasked counts calls answered misses at once without asking any
	// server: while an earlier call it has not answered holds calls off,
	// while the handle reconnects or is closed, or while the master's
	// store is said to be out.
	Unasked uint64
	// Cancelled counts calls whose caller's context ended (cancelled, or
	// its deadline passed) before they were answered: the caller's doing,
	// which says nothing of the server and holds nothing off.
	Cancelled uint64
}

// TransferStats are a worker handle's counters, and its blocked and
// abandoned gauges.
type TransferStats struct {
	Submitted uint64 // jobs handed to the transfer goroutines
	Completed uint64 // jobs that ended COMPLETED
	Failed    uint64 // jobs that ended FAILED or CANCELLED after submission
	Refused   uint64 // jobs failed as not attempted before submission
	Blocked   int    // transfers past their deadline on the current server: new ones are refused meanwhile
	// BytesStored counts the object bytes of keys the server answered
	// stored, a key the pool held already included: the server answers
	// such a store as stored and keeps the first value, and the answer
	// does not tell the two apart.
	BytesStored uint64
	BytesLoaded uint64 // object bytes of keys loaded
	// AbandonedBuffers and AbandonedBytes are the buffers (and the bytes of
	// their registered regions) that Close left registered because
	// transfers still held them; they fall back to zero once those
	// transfers have ended and the buffers were deregistered.
	AbandonedBuffers int
	AbandonedBytes   uint64
}

// lookupCounters are a scheduler handle's live counters.
type lookupCounters struct {
	lookups, hits, misses, timeouts, failures, unasked, cancelled atomic.Uint64
}

func (c *lookupCounters) snapshot() LookupStats {
	return LookupStats{
		Calls:     c.lookups.Load(),
		Hits:      c.hits.Load(),
		Misses:    c.misses.Load(),
		Timeouts:  c.timeouts.Load(),
		Failures:  c.failures.Load(),
		Unasked:   c.unasked.Load(),
		Cancelled: c.cancelled.Load(),
	}
}

// transferCounters are a worker handle's live counters (the blocked count
// is its jobSet's).
type transferCounters struct {
	submitted, completed, failed, refused atomic.Uint64
	bytesStored, bytesLoaded              atomic.Uint64
	abandoned, abandonedBytes             atomic.Int64
}

func (c *transferCounters) snapshot() TransferStats {
	return TransferStats{
		Submitted:        c.submitted.Load(),
		Completed:        c.completed.Load(),
		Failed:           c.failed.Load(),
		Refused:          c.refused.Load(),
		BytesStored:      c.bytesStored.Load(),
		BytesLoaded:      c.bytesLoaded.Load(),
		AbandonedBuffers: int(c.abandoned.Load()),
		AbandonedBytes:   uint64(c.abandonedBytes.Load()),
	}
}

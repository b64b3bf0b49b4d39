package umbp

import "sync/atomic"

// Stats is a snapshot of a handle's health: its state, what the server
// offers, and counters since the handle was created. Counters that do not
// apply to a handle's kind stay zero.
type Stats struct {
	State        HandleState
	Capabilities ServerCapabilities
	// Reconnects counts attachments to a new server after the first.
	Reconnects uint64

	// Scheduler handles.
	Lookups  uint64 // Lookup and LookupPrefix calls that asked about keys
	Hits     uint64 // keys answered present
	Misses   uint64 // keys answered absent, including failed calls' keys
	Timeouts uint64 // calls that got no reply within LookupTimeout
	Failures uint64 // calls that failed or were refused (not timeouts)

	// Worker handles.
	TransfersSubmitted uint64 // jobs handed to the transfer goroutines
	TransfersCompleted uint64 // jobs that ended COMPLETED
	TransfersFailed    uint64 // jobs that ended FAILED or CANCELLED after submission
	TransfersRefused   uint64 // jobs failed as not attempted before submission
	TransfersBlocked   int    // transfers past their deadline on the current server: new ones are refused meanwhile
	BytesStored        uint64 // object bytes of keys stored
	BytesLoaded        uint64 // object bytes of keys loaded
	// AbandonedBuffers and AbandonedBytes are the buffers (and the bytes of
	// their registered regions) that Close left registered because
	// transfers still held them; they fall back to zero once those
	// transfers have ended and the buffers were deregistered.
	AbandonedBuffers int
	AbandonedBytes   uint64
}

// counters are a handle's live counters.
type counters struct {
	lookups, hits, misses, timeouts, failures atomic.Uint64
	submitted, completed, failed, refused     atomic.Uint64
	bytesStored, bytesLoaded                  atomic.Uint64
	abandoned, abandonedBytes                 atomic.Int64
}

func (c *counters) fill(s *Stats) {
	s.Lookups = c.lookups.Load()
	s.Hits = c.hits.Load()
	s.Misses = c.misses.Load()
	s.Timeouts = c.timeouts.Load()
	s.Failures = c.failures.Load()
	s.TransfersSubmitted = c.submitted.Load()
	s.TransfersCompleted = c.completed.Load()
	s.TransfersFailed = c.failed.Load()
	s.TransfersRefused = c.refused.Load()
	s.BytesStored = c.bytesStored.Load()
	s.BytesLoaded = c.bytesLoaded.Load()
	s.AbandonedBuffers = int(c.abandoned.Load())
	s.AbandonedBytes = uint64(c.abandonedBytes.Load())
}

package umbp

import (
	"time"

	"github.com/umbp-go/umbp-go/internal/backoff"
)

// The handle's policy: every retry, back-off, part size and pacing figure
// the transfer and reconnect paths use, in one place.

// Stores: a key the server could not place is retried on its own after a
// Flush and each of these pauses (the server may be evicting to make room),
// as long as the pause still fits before the job's deadline.
var storeRetryBackoff = []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}

// How a job's batches are cut into requests (by the message limit, and a
// ranged job into parts) is the connection's: internal/conn/policy.go.

// On a server without ranged I/O, multi-range plans are staged through
// registered host buffers of at least stagingMin bytes, stagingChunk bytes
// a request (unless one object is larger).
const (
	stagingMin   = 4 << 20
	stagingChunk = 64 << 20
)

// A job's ranges and items come from slabs reused once its transfer no
// longer reads them; slabs of up to maxSlabRanges ranges (2 MiB) and
// maxSlabItems items (4 MiB) are kept.
const (
	maxSlabRanges = 1 << 16
	maxSlabItems  = 1 << 16
)

// The object of zeros that warmStaging stores once and loads across a new
// staging buffer. Every client stores the same bytes under its name.
const (
	warmUpSize = 64 << 10
	warmUpKey  = "umbp-go/staging-warm-up/65536"
)

// AfterStream: the event is polled with pauses paced by streamPolling.
// streamWaitGrace bounds how long Wait, at a transfer's deadline, waits for
// one still waiting for the engine's stream: it gives up at that same
// deadline, within one poll.
var streamPolling = backoff.Policy{Base: 5 * time.Microsecond, Max: 200 * time.Microsecond}

const streamWaitGrace = time.Second

// Attaching (the link): every dial is one attempt (conn.Dial) bounded by
// attachAttempt, and attempts are paced by attachPacing, from a handle's
// first attach, which waits for a server at most StartupTimeout, to every
// reattach after a server went away. A restarted server is found within
// about linkCheckInterval plus one pause. A first attach that has waited
// attachWarnAfter says so once at Warn (before that, at Debug). Dropping a
// connection whose attach failed gets discardTimeout.
var (
	linkCheckInterval = 100 * time.Millisecond
	attachPacing      = backoff.Policy{Base: 25 * time.Millisecond, Max: 500 * time.Millisecond, Jitter: 0.2}
)

const (
	attachAttempt   = time.Second
	attachWarnAfter = 5 * time.Second
	discardTimeout  = time.Second
)

// The master's replicas: their pacing, hedging and health figures are
// internal/replicaset's (its policy.go).

// A probe after a lock-step lookup overran (lookupcall.go) that failed
// rather than waited (a connection refused, a dial that timed out) is made
// again after pauses paced by backoff.Redial, as a failed dial is.

// A scheduler handle's calls run on at most lookupWorkers detached
// goroutines a connection (calls in flight at once, from callers of their
// own; a call that overran holds the later ones off).
const lookupWorkers = 16

// quarantineMax bounds the keys a handle keeps in quarantine; past it,
// new keys are not quarantined until old ones expire.
const quarantineMax = 1 << 20

// Score's bounds: a request for more is refused before anything is sent.
const (
	maxScoreBlocks     = 1 << 16
	maxScoreCandidates = 4096
)

// failureLogInterval is how often a handle repeats a failure warning.
const failureLogInterval = 30 * time.Second

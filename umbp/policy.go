package umbp

import "time"

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

// A job's ranges come from slabs reused once its transfer no longer reads
// them; slabs of up to maxSlabRanges ranges (2 MiB) are kept.
const maxSlabRanges = 1 << 16

// The object of zeros that warmStaging stores once and loads across a new
// staging buffer. Every client stores the same bytes under its name.
const (
	warmUpSize = 64 << 10
	warmUpKey  = "umbp-go/staging-warm-up/65536"
)

// AfterStream: the event is polled with a pause that backs off from
// streamPollMin to streamPollMax. streamWaitGrace bounds how long Wait, at
// a transfer's deadline, waits for one still waiting for the engine's
// stream: it gives up at that same deadline, within one poll.
const (
	streamPollMin   = 5 * time.Microsecond
	streamPollMax   = 200 * time.Microsecond
	streamWaitGrace = time.Second
)

// Attaching: the connection bounds its wait for the server by
// StartupTimeout and says so; dialGrace later, the handle's own bound only
// backs that up.
const dialGrace = time.Second

// Reconnecting: a handle looks at its server's socket every
// linkCheckInterval; a failed re-attach is retried after a pause that
// doubles from linkCheckInterval up to reconnectBackoffMax. Each dial of a
// re-attach gets reconnectDialTimeout; dropping a connection whose attach
// failed gets discardTimeout.
var linkCheckInterval = 100 * time.Millisecond

// reconnectPause is the pause after a failed re-attach that followed one
// of last.
func reconnectPause(last time.Duration) time.Duration {
	return min(max(2*last, linkCheckInterval), reconnectBackoffMax)
}

const (
	reconnectBackoffMax  = time.Second
	reconnectDialTimeout = time.Second
	discardTimeout       = time.Second
)

// failureLogInterval is how often a handle repeats a failure warning.
const failureLogInterval = 30 * time.Second

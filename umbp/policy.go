package umbp

import "time"

// The handle's policy: every retry, back-off, part size and pacing figure
// the transfer and reconnect paths use, in one place.

// Stores: a key the server could not place is retried on its own after a
// Flush and each of these pauses (the server may be evicting to make room),
// as long as the pause still fits before the job's deadline.
var storeRetryBackoff = []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}

// A job's ranged transfer goes to the server in parts of about partRanges
// ranges or partBytes bytes, up to partsInFlight at a time, so that the
// server copies one part while the next is encoded, sent and prepared. On an
// H200 a job of 64 blocks of 128 layers of 32 KiB (256 MiB, cut by bytes)
// moved at about 23 GB/s in one request and 41 to 43 GB/s in parts. Small
// ranges are cut by count, and not finer: MORI's server copies one request
// at a time under one lock (its copies within a request in parallel), so
// parts of a few MiB only add requests (256 blocks of 32 ranges of 2 KiB
// stored at 0.68–0.72 of MORI's own client in one request of 8192 ranges,
// against 0.53–0.60 in parts of 1024; measured on one host, medians).
const (
	partRanges    = 8192
	partBytes     = 32 << 20
	partsInFlight = 4
)

// On a server without ranged I/O, multi-range plans are staged through
// registered host buffers of at least stagingMin bytes, stagingChunk bytes
// a request (unless one object is larger).
const (
	stagingMin   = 4 << 20
	stagingChunk = 64 << 20
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

const (
	reconnectBackoffMax  = time.Second
	reconnectDialTimeout = time.Second
	discardTimeout       = time.Second
)

// failureLogInterval is how often a handle repeats a failure warning.
const failureLogInterval = 30 * time.Second

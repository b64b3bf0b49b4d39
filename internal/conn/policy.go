package conn

import (
	"github.com/umbp-go/umbp-go/internal/rpc"
)

// The connection's policy: every timing and size it uses, in one place.

// maxRequestBytes is the largest request a batch sends, the protocol's
// message limit (rpc.MaxMessageSize); batches are cut to fit. A variable so
// that tests can lower it.
var maxRequestBytes = rpc.MaxMessageSize

// A ranged batch goes to the server in parts of about partRanges ranges or
// partBytes bytes, up to partsInFlight at a time, so that the server copies
// one part while the next is encoded, sent and prepared. On an H200 a job
// of 64 blocks of 128 layers of 32 KiB (256 MiB, cut by bytes) moved at
// about 23 GB/s in one request and 41 to 43 GB/s in parts. Small ranges are
// cut by count, and not finer: MORI's server copies one request at a time
// under one lock (its copies within a request in parallel), so parts of a
// few MiB only add requests (256 blocks of 32 ranges of 2 KiB stored at
// 0.68–0.72 of MORI's own client in one request of 8192 ranges, against
// 0.53–0.60 in parts of 1024; measured on one host, medians).
const (
	partRanges    = 8192
	partBytes     = 32 << 20
	partsInFlight = 4
)

// A lookup connection that could not be dialled is dialled again after
// pauses paced by backoff.Redial (meanwhile lookups fail at once).

// maxRecycledRanges bounds the ranged requests kept for reuse: 64 Ki
// ranges, about 2.5 MiB of arrays.
const maxRecycledRanges = 1 << 16

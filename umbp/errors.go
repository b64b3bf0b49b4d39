package umbp

import (
	"errors"
	"fmt"

	"github.com/umbp-go/umbp-go/internal/errdefs"
)

// OpError is the error of the package's functions and methods: the
// operation, the server it asked, and what happened, in the manner of
// *net.OpError. Its text reads "umbp: <op> at <server>: <what happened>"
// ("umbp: <what happened>" for input refused before any server was
// involved), so the package's name and the server are said once. Get it
// with errors.As; match what happened with errors.Is against the
// sentinels below, which it wraps.
//
// The errors of single keys ([TransferJob.KeyErr]) are parts of their job's
// error and carry neither the prefix nor the server.
type OpError struct {
	// Op is the operation, in words: "attach", "register buffers",
	// "store", "load", "close", "clear", "ping", "report external KV",
	// "match external KV"; empty for input refused before any server
	// was asked (a bad configuration, key, plan, layout or topology).
	Op string
	// Addr is the server asked: a standalone server's endpoint
	// ("unix:///run/umbp/node0.grpc.sock") or the master's address
	// (host:port); empty when no server was involved.
	Addr string
	// Err is what happened.
	Err error
}

// Error reads "umbp: <op> at <server>: <err>".
func (e *OpError) Error() string {
	switch {
	case e.Op == "" && e.Addr == "":
		return "umbp: " + e.Err.Error()
	case e.Addr == "":
		return "umbp: " + e.Op + ": " + e.Err.Error()
	}
	return "umbp: " + e.Op + " at " + e.Addr + ": " + e.Err.Error()
}

// Unwrap returns what happened.
func (e *OpError) Unwrap() error { return e.Err }

// opError is the one place an error leaves the package: err as the failure
// of op at addr; nil stays nil, and an *OpError stays as it is (it says its
// operation already).
func opError(op, addr string, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpError
	if errors.As(err, &oe) {
		return err
	}
	return &OpError{Op: op, Addr: addr, Err: err}
}

// invalid is the error of input refused before any server was asked.
func invalid(err error) error { return opError("", "", err) }

// The error values below are what an engine acts on; the package doc's
// table says when each appears and what to do. Every error the package
// returns wraps at most a few of them, and keeps the server's words and the
// connection's classification in its chain: match with errors.Is. None of
// them says "umbp:": the *OpError that carries them does, once.
var (
	// ErrNotAttempted means a key's transfer never touched the server or
	// the key's memory: the engine may reuse the blocks at once and
	// recompute them. Its text is "transfer not attempted", as vLLM's
	// runtime prints it; the reason follows.
	ErrNotAttempted = errors.New("transfer not attempted")
	// ErrNotInPool means a load found no object under the key (or one of
	// another size): a cache miss. The destination was not written.
	ErrNotInPool = errors.New("not in the pool")
	// ErrRefused means the server answered but would not do what was asked:
	// a store the pool could not take (full, or the object larger than the
	// pool), or a registration it rejected. The server's reason, when it
	// gave one, is in the text.
	ErrRefused = errdefs.ErrRefused
	// ErrUnavailable means the server could not be reached, or went away
	// under a call: the transport failed, the connection was refused, or
	// the handle is re-attaching to a restarted server. A key whose request
	// got a reply the handle cannot use (an unexpected gRPC error, results
	// of the wrong length) fails with it too: it was sent.
	ErrUnavailable = errdefs.ErrUnavailable
	// ErrCancelled means a job was withdrawn before it started
	// ([WorkerHandle.Cancel], or Close): its buffers were never used.
	ErrCancelled = errors.New("transfer cancelled before it started")
	// ErrBuffersInUse means the server may still read or write the memory a
	// job or buffer names: a transfer is running past its deadline, or a
	// buffer is still registered. The engine must not reuse or free it yet.
	ErrBuffersInUse = errors.New("buffers still in use by the server")
	// ErrBuffersAbandoned means a handle was closed while a transfer was
	// still in flight (or deregistration did not return): its registered
	// memory stays registered and must not be freed until the transfers
	// that held it have ended and the handle has deregistered it;
	// Stats().Transfers.AbandonedBytes counts what is still held.
	ErrBuffersAbandoned = errors.New("buffers abandoned to a server that may still use them")
	// ErrNotSupported means the operation needs something this host or
	// server lacks: a GPU runtime, or a server with ranged I/O.
	ErrNotSupported = errdefs.ErrNotSupported
	// ErrUntrustedServer means the server's sockets or process failed the
	// identity check made before any memory is shared with it: a socket file
	// that is not a socket, is writable by others or is owned by another
	// user, or a server process running as another user. Only this
	// process's user, root and the uids in Config.TrustedUIDs are trusted.
	// The error says what was wrong.
	ErrUntrustedServer = errdefs.ErrUntrustedServer
	// ErrClosed is returned by calls on a closed handle, and fails the keys
	// of transfers submitted to one.
	ErrClosed = errdefs.ErrClosed
	// ErrNoReply means a scheduler call got no answer from the server
	// within LookupTimeout, or was held off because an earlier call has
	// had none yet: the server's lateness, told apart from the caller's
	// own context ending (context.Canceled or DeadlineExceeded without
	// ErrNoReply). A call that ran out the bound also matches
	// context.DeadlineExceeded.
	ErrNoReply = errdefs.ErrNoReply
	// ErrBatchTooLarge means a scheduler call's LookupTimeout, counted
	// from the call, passed while the server was answering its batch part
	// by part (or before a part could be asked at all): the keys asked
	// before are answered, the rest are misses. It is the batch's size
	// against LookupTimeout, not the server's lateness, and holds nothing
	// off; ask fewer keys at once, or give a longer LookupTimeout. It
	// also matches context.DeadlineExceeded.
	ErrBatchTooLarge = errors.New("batch too large to ask within LookupTimeout")
)

// Errors of input refused before anything reaches a server. Each matches
// what it names; the error says what is wrong.
var (
	// ErrInvalidConfig: a [Config] or [ClusterConfig] field.
	ErrInvalidConfig = errors.New("invalid configuration")
	// ErrInvalidKey: a key or key component: a bad namespace given to
	// [NewKeyCodec], a bad hash given to [KeyCodec.KeyHex], a string
	// [ParseKey] does not accept, a bad Score request.
	ErrInvalidKey = errors.New("invalid key")
	// ErrInvalidPlan: a malformed [BlockTransferPlan] or [Block], and a
	// block a [LayoutPlanner] cannot plan.
	ErrInvalidPlan = errors.New("invalid transfer plan")
	// ErrInvalidLayout: a [KVLayoutDescriptor] or [KVRegion], and the
	// block-wise calls of a worker handle made without a layout.
	ErrInvalidLayout = errors.New("invalid KV layout")
	// ErrInvalidTopology: a [RankTopology].
	ErrInvalidTopology = errors.New("invalid rank topology")
	// ErrInvalidTokenKeyConfig: a [TokenKeyConfig]; errors about its
	// namespace or topology match [ErrInvalidKey] or [ErrInvalidTopology]
	// too.
	ErrInvalidTokenKeyConfig = errors.New("invalid token key config")
	// ErrInvalidBuffer: a buffer RegisterBuffers refused before asking the
	// server: it is empty, wraps the address space, is host memory outside
	// a [HostBuffer] (or runs past the end of one), is GPU memory outside
	// its allocation or on another device than it names, or its name or
	// memory is already registered otherwise.
	ErrInvalidBuffer = errors.New("invalid buffer")
)

// isKeySentinel reports whether err matches one of the sentinels a key's
// error is promised to match (the package doc's table).
func isKeySentinel(err error) bool {
	for _, s := range [...]error{ErrNotAttempted, ErrNotInPool, ErrRefused, ErrUnavailable, ErrCancelled,
		ErrBuffersInUse, ErrNotSupported, ErrUntrustedServer, ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// notAttempted is the error of a key whose transfer never started: it
// matches ErrNotAttempted and cause.
func notAttempted(cause error) error {
	return fmt.Errorf("%w: %w", ErrNotAttempted, cause)
}

// Reasons a transfer is refused before it starts.
var (
	errBlocked      = errors.New("an earlier transfer is still blocked in the server")
	errQueuedBehind = errors.New("queued behind a blocked transfer")
	errReconnecting = fmt.Errorf("%w: re-attaching to the server", ErrUnavailable)
	errStreamLate   = errors.New("the stream did not reach the transfer's event before its deadline")
)

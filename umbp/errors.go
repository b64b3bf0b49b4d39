package umbp

import (
	"errors"
	"fmt"

	"github.com/umbp-go/umbp-go/internal/errdefs"
)

// The error values below are what an engine acts on; the package doc's
// table says when each appears and what to do. Every error the package
// returns wraps at most a few of them, and keeps the server's words and the
// connection's classification in its chain: match with errors.Is.
//
// An error a function or method of the package returns reads "umbp:" once,
// at its start, and names the server's endpoint once where a server was
// asked; the values below, and the errors of single keys (KeyErr), carry
// neither, since they are parts of such an error.
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
	errStreamLate   = errors.New("the stream did not reach the store's event before the transfer's deadline")
	errNilJob       = fmt.Errorf("umbp: %w: nil *TransferJob (was the error of StoreBlocks or LoadBlocks ignored?)", ErrInvalidPlan)
)

// public gives an error the package's prefix, as a function of the package
// returns it; nil stays nil.
func public(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("umbp: %w", err)
}

package umbp

import (
	"errors"

	"github.com/umbp-go/umbp-go/internal/conn"
)

var (
	// ErrBuffersInUse means the server may still read or write the memory a
	// job or buffer names: a transfer is running past its deadline, or a
	// buffer is still registered. The engine must not reuse or free it yet.
	ErrBuffersInUse = errors.New("umbp: buffers still in use by the server")
	// ErrBuffersAbandoned means a handle was closed while a transfer was
	// still in flight (or deregistration did not return): its registered
	// memory was kept alive and never deregistered, and must not be freed
	// for the life of the process.
	ErrBuffersAbandoned = errors.New("umbp: buffers abandoned to a server that may still use them")
	// ErrNotSupported means the operation needs something this host or
	// server lacks (a GPU runtime, a v2 server).
	ErrNotSupported = errors.New("umbp: not supported")
	// ErrUntrustedServer means the server's sockets or process failed the
	// identity check made before any memory is shared with it: a socket file
	// that is not a socket, is writable by others or is owned by another
	// user, or a server process running as another user. Only this
	// process's user, root and the uids in Config.TrustedUIDs are trusted.
	// The error says what was wrong.
	ErrUntrustedServer = conn.ErrUntrustedServer
	// ErrClosed is returned by calls on a closed handle.
	ErrClosed = errors.New("umbp: handle is closed")
)

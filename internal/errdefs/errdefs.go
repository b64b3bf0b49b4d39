// Package errdefs holds the error values that several of the module's
// packages return, so that one value matches with errors.Is wherever an
// error was made. Package umbp exports them as its own; their texts carry no
// "umbp:" prefix, since the public package adds that once, at its boundary.
package errdefs

import "errors"

var (
	// ErrNotSupported means an operation needs something this host or
	// server lacks: a GPU runtime, a batched-copy entry point, a server with
	// ranged I/O. Errors wrap it with the reason ("hip: GPU runtime not
	// supported: …").
	ErrNotSupported = errors.New("not supported")
	// ErrUnavailable means the server could not be reached, or went away
	// under a call.
	ErrUnavailable = errors.New("server unavailable")
	// ErrRefused means the server answered but would not do what was asked.
	ErrRefused = errors.New("refused by the server")
	// ErrUntrustedServer means the server's sockets or process failed the
	// identity check made before any memory is shared with it.
	ErrUntrustedServer = errors.New("untrusted server")
	// ErrClosed means the handle (or its connection, or a lock-step
	// client) was closed.
	ErrClosed = errors.New("handle is closed")
	// ErrNotSent means a request never reached a server that could process
	// it: refused before it was sent, no connection to be had, or refused
	// unprocessed. The server never saw it, nor used the memory it names;
	// it may be made another way. internal/h2call and internal/rpc return
	// it, by this one value.
	ErrNotSent = errors.New("request not sent")
	// ErrNoReply is the cause a call is ended with when it got no reply
	// within its bound (a scheduler call's LookupTimeout), as told apart
	// from its caller's own context ending.
	ErrNoReply = errors.New("no reply")
)

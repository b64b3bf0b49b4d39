package conn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/rpc"
)

// Every error a Conn returns wraps at most one of the sentinels of
// internal/errdefs (ErrUnavailable, ErrRefused, ErrClosed,
// ErrUntrustedServer) and internal/rpc (ErrUnimplemented, ErrBadReply,
// ErrInvalidArgument, ErrNotSent), each by its one name there, plus, for
// RPC failures, the gRPC status, reachable with status.FromError, and the
// caller's context error when the context ended. Errors name the operation
// and what happened, never the endpoint nor the package: the caller, which
// knows which server it asked, says that once.
//
// A Conn closed matches ErrClosed, and a call made after Close ErrNotSent
// too; one cut off by Close matches ErrUnavailable: its request may have
// reached the server. A gRPC connection refused by the trust check after
// Dial makes the server look unavailable (ErrUnavailable); the refusal is
// logged.

// ErrPeerUnknown means a server process behind the connection could not be
// pinned (another pid namespace on a kernel without SO_PEERPIDFD), so its
// exit cannot be observed.
var ErrPeerUnknown = errors.New("server process cannot be identified")

// RefusedError is the server's ok=false answer with its reason. It matches
// ErrRefused with errors.Is.
type RefusedError struct {
	// Op is the method that was refused, such as "RegisterMemory".
	Op string
	// Reason is the server's error text, verbatim; empty for an fd-handoff
	// rejection, whose status carries no text.
	Reason string
	// Err is the underlying cause when there is one (the fd-handoff
	// rejection), else nil.
	Err error
}

// Error implements error.
func (e *RefusedError) Error() string {
	switch {
	case e.Reason != "":
		return fmt.Sprintf("%s refused by the server: %s", e.Op, e.Reason)
	case e.Err != nil:
		return fmt.Sprintf("%s refused by the server: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("%s refused by the server", e.Op)
}

// Is reports whether target is ErrRefused.
func (e *RefusedError) Is(target error) bool { return target == errdefs.ErrRefused }

// Unwrap returns the underlying cause, if any.
func (e *RefusedError) Unwrap() error { return e.Err }

// refused returns a *RefusedError for op and reason.
func refused(op, reason string) error { return &RefusedError{Op: op, Reason: reason} }

// rpcError classifies the error of an RPC made with ctx (rpc.Error): a call
// the Conn's Close cut off may have reached the server.
func (c *Conn) rpcError(ctx context.Context, op string, err error) error {
	return rpc.Error(ctx, op, err, c.closed.Load())
}

// handoffError classifies an fd-handoff failure.
func (c *Conn) handoffError(ctx context.Context, err error) error {
	const op = "fd handoff"
	switch {
	case c.closed.Load(): // cut off: the server may have the descriptor
		return fmt.Errorf("%s: %w (%w): %w", op, errdefs.ErrClosed, errdefs.ErrUnavailable, err)
	case errors.Is(err, errdefs.ErrUntrustedServer):
		return fmt.Errorf("%s: %w", op, err)
	case errors.Is(err, fdpass.ErrRejected):
		return &RefusedError{Op: op, Err: err}
	case errors.Is(err, fdpass.ErrInvalidMessage):
		return fmt.Errorf("%s: %w (%w): %w", op, rpc.ErrInvalidArgument, rpc.ErrNotSent, err)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", op, err) // fdpass already names the context error
	case errors.Is(err, fdpass.ErrBadReply):
		return fmt.Errorf("%s: %w: %w", op, rpc.ErrBadReply, err)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOENT),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%s: %w: %w", op, errdefs.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

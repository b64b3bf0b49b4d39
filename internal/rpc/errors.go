package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/errdefs"
)

// Every error of a call wraps at most a few of these (and, for a failed RPC,
// the gRPC status, reachable with status.FromError, and the caller's context
// error when the context ended).
var (
	// ErrBadReply means the server's answer does not fit the request: the
	// wrong number of results, a count past the keys asked, a reply over the
	// size limit.
	ErrBadReply = errors.New("bad reply from the server")
	// ErrInvalidArgument means the request was refused locally, before
	// anything was sent; such an error also matches ErrNotSent.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotSent means the request was refused before it was sent: the
	// server never saw it, nor used the memory it names (errdefs').
	ErrNotSent = errdefs.ErrNotSent
	// ErrUnimplemented means the server does not know the method: a v1
	// server answering a v2-only call such as a ranged batch.
	ErrUnimplemented = errors.New("method not implemented by the server")
)

// Invalid returns the error of op's request refused before it was sent: it
// matches ErrInvalidArgument and ErrNotSent.
func Invalid(op, format string, args ...any) error {
	return fmt.Errorf("%s: %w (%w): %s", op, ErrInvalidArgument, ErrNotSent, fmt.Sprintf(format, args...))
}

// BadReply returns the error of op's answer that does not fit its request.
func BadReply(op, format string, args ...any) error {
	return fmt.Errorf("%s: %w: %s", op, ErrBadReply, fmt.Sprintf(format, args...))
}

// Error says what the failure err of the call op, made with ctx, means;
// closed reports that the caller closed the channel under it (the request
// may have reached the server). The gRPC status stays reachable through the
// chain, and each thing is said once: a call cut off by its context reads
// "op: context deadline exceeded", not that and gRPC's copy of it.
//
//   - closed, or gRPC's "the client connection is closing": errdefs.ErrClosed
//     and errdefs.ErrUnavailable;
//   - the context ended: its error;
//   - DeadlineExceeded with a deadline on ctx: context.DeadlineExceeded (no
//     call sets a deadline of its own, so one that passed is the caller's,
//     even when gRPC's timer fired a moment before the context's);
//   - Unavailable: errdefs.ErrUnavailable;
//   - Unimplemented: ErrUnimplemented;
//   - ResourceExhausted that is gRPC's own refusal of an answer over the
//     size limit ("grpc: received message larger than max"): ErrBadReply
//     (a server's own ResourceExhausted is its answer, wrapped as it is).
//
// Any other code is wrapped as it is.
func Error(ctx context.Context, op string, err error, closed bool) error {
	code := status.Code(err)
	if closed || code == codes.Canceled && status.Convert(err).Message() == closingMessage {
		return fmt.Errorf("%s: %w (%w): %w", op, errdefs.ErrClosed, errdefs.ErrUnavailable, err)
	}
	if cerr := ctx.Err(); cerr != nil {
		return cut(op, cerr, err)
	}
	switch code {
	case codes.DeadlineExceeded:
		if _, ok := ctx.Deadline(); ok {
			return cut(op, context.DeadlineExceeded, err)
		}
	case codes.Unavailable:
		return fmt.Errorf("%s: %w: %w", op, errdefs.ErrUnavailable, err)
	case codes.Unimplemented:
		return fmt.Errorf("%s: %w: %w", op, ErrUnimplemented, err)
	case codes.ResourceExhausted:
		if strings.HasPrefix(status.Convert(err).Message(), TooLargeMessage) {
			return fmt.Errorf("%s: %w: %w", op, ErrBadReply, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// TooLargeMessage starts gRPC's refusal of an answer over the size limit.
const TooLargeMessage = "grpc: received message larger than max"

// closingMessage is what gRPC answers a call on a channel being closed.
const closingMessage = "grpc: the client connection is closing"

// cut is the error of a call its context (or the deadline it carried) cut
// off: "op: <cause>", and gRPC's own words only where they add something
// (a status whose message is the context's error says it twice).
func cut(op string, cause, err error) error {
	if s, ok := status.FromError(err); ok && s.Message() == cause.Error() {
		return &quiet{text: op + ": " + cause.Error(), errs: []error{cause, err}}
	}
	return fmt.Errorf("%s: %w: %w", op, cause, err)
}

// quiet is an error whose text says less than its chain holds: the causes
// stay reachable with errors.Is, errors.As and status.FromError.
type quiet struct {
	text string
	errs []error
}

func (e *quiet) Error() string   { return e.text }
func (e *quiet) Unwrap() []error { return e.errs }

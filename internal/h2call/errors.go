package h2call

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/errdefs"
)

// ErrClosed is the cause of a call refused, or cut short, because the
// client was closed. Such a call's status is codes.Canceled, as grpc-go's
// for a closing ClientConn. It is the module's one closed error
// (errdefs.ErrClosed).
var ErrClosed = errdefs.ErrClosed

// ErrNotSent matches the failure of a call none of whose request reached
// a server that could process it: no connection could be had, or every
// attempt was refused unprocessed (REFUSED_STREAM, a GOAWAY below its
// stream) or cut off before its request was all written. Such a call was
// never made; a caller may make it another way. It is the module's one
// not-sent error (errdefs.ErrNotSent, which internal/rpc returns too).
var ErrNotSent = errdefs.ErrNotSent

// notSentError is a failure that matches ErrNotSent, with the status of
// the failure it wraps.
type notSentError struct{ err error }

func (e *notSentError) Error() string              { return e.err.Error() }
func (e *notSentError) Unwrap() error              { return e.err }
func (e *notSentError) Is(target error) bool       { return target == ErrNotSent }
func (e *notSentError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// callError is a failure that is not the server's answer: a transport
// failure, a protocol violation, the context, the client's closing. It is
// the status a grpc-go client would report for the same event, and it wraps
// what caused it (a dial error, io.EOF, the context's error, ErrClosed), so
// that status.Code and errors.Is both work.
type callError struct {
	st    *status.Status
	cause error
}

func (e *callError) Error() string {
	return fmt.Sprintf("rpc error: code = %s desc = %s", e.st.Code(), e.st.Message())
}

// GRPCStatus is the failure's status (status.FromError, status.Code).
func (e *callError) GRPCStatus() *status.Status { return e.st }

// Unwrap returns what caused the failure; nil when the status says all.
func (e *callError) Unwrap() error { return e.cause }

// failure returns a callError of code whose message is msg, caused by
// cause (which may be nil).
func failure(code codes.Code, cause error, msg string) error {
	return &callError{st: status.New(code, msg), cause: cause}
}

func failuref(code codes.Code, cause error, format string, args ...any) error {
	return failure(code, cause, fmt.Sprintf(format, args...))
}

// ctxFailure is the failure of a call whose context ended: codes.Canceled
// or codes.DeadlineExceeded with the context's message, as grpc-go's, and
// wrapping err.
func ctxFailure(err error) error {
	return &callError{st: status.FromContextError(err), cause: err}
}

// closedFailure is the failure of a call on a closed client, with grpc-go's
// text for a closing ClientConn.
func closedFailure() error {
	return failure(codes.Canceled, ErrClosed, "grpc: the client connection is closing")
}

// transportFailure is a broken connection: codes.Unavailable.
func transportFailure(cause error, what string) error {
	if cause == nil {
		return failure(codes.Unavailable, nil, what)
	}
	return failuref(codes.Unavailable, cause, "%s: %v", what, cause)
}

// errGoAwayRefused is the status of a call the server refused to process
// because it is draining the connection (grpc-go's statusGoAway).
var goAwayRefused = status.New(codes.Unavailable, "the stream is rejected because server is draining the connection")

// rstCodes maps an RST_STREAM error code to a status code, as grpc-go.
var rstCodes = map[http2.ErrCode]codes.Code{
	http2.ErrCodeNo:                 codes.Internal,
	http2.ErrCodeProtocol:           codes.Internal,
	http2.ErrCodeInternal:           codes.Internal,
	http2.ErrCodeFlowControl:        codes.ResourceExhausted,
	http2.ErrCodeSettingsTimeout:    codes.Internal,
	http2.ErrCodeStreamClosed:       codes.Internal,
	http2.ErrCodeFrameSize:          codes.Internal,
	http2.ErrCodeRefusedStream:      codes.Unavailable,
	http2.ErrCodeCancel:             codes.Canceled,
	http2.ErrCodeCompression:        codes.Internal,
	http2.ErrCodeConnect:            codes.Internal,
	http2.ErrCodeEnhanceYourCalm:    codes.ResourceExhausted,
	http2.ErrCodeInadequateSecurity: codes.PermissionDenied,
	http2.ErrCodeHTTP11Required:     codes.Internal,
}

// httpCodes maps the HTTP status of an answer that is not gRPC to a status
// code, as grpc-go; another HTTP status is codes.Unknown.
var httpCodes = map[int]codes.Code{
	http.StatusBadRequest:         codes.Internal,
	http.StatusUnauthorized:       codes.Unauthenticated,
	http.StatusForbidden:          codes.PermissionDenied,
	http.StatusNotFound:           codes.Unimplemented,
	http.StatusTooManyRequests:    codes.Unavailable,
	http.StatusBadGateway:         codes.Unavailable,
	http.StatusServiceUnavailable: codes.Unavailable,
	http.StatusGatewayTimeout:     codes.Unavailable,
}

// deadlinePassed reports whether ctx has a deadline that has passed.
func deadlinePassed(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !d.After(time.Now())
}

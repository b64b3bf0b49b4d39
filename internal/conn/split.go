package conn

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// span is the half-open range [start, end) of a batch's entries that one
// request carries.
type span struct{ start, end int }

func (s span) len() int { return s.end - s.start }

// Encoded sizes, computed per entry so that a batch is split without
// marshalling it. Every field numbered below 16 has a one-byte tag.

// bytesField is the size of a string or bytes field holding n bytes.
func bytesField(n int) int { return 1 + protowire.SizeBytes(n) }

// varint is the size of one element of a packed repeated varint field.
func varint(v uint64) int { return protowire.SizeVarint(v) }

// fixedCost is an upper bound of what a request spends outside its
// entries: the client id field (clientID bytes; 0 when the message has
// none) and, for each of its packed fields, the tag and length prefix.
func fixedCost(clientID, packedFields int) int {
	n := 0
	if clientID > 0 {
		n += bytesField(clientID)
	}
	return n + packedFields*(1+protowire.SizeVarint(uint64(maxRequestBytes)))
}

// split cuts n entries into consecutive spans whose requests fit
// maxRequestBytes: fixed is the request's own cost, cost(i) that of entry i.
// An entry that cannot fit even alone is an ErrInvalidArgument.
func split(op string, n, fixed int, cost func(i int) int) ([]span, error) {
	limit := maxRequestBytes
	var spans []span
	start, used := 0, fixed
	for i := range n {
		ci := cost(i)
		if fixed+ci > limit {
			return nil, invalid(op, "entry %d needs %d bytes of request, more than the %d-byte message limit", i, fixed+ci, limit)
		}
		if used+ci > limit {
			spans = append(spans, span{start, i})
			start, used = i, fixed
		}
		used += ci
	}
	if n > start {
		spans = append(spans, span{start, n})
	}
	return spans, nil
}

// runSpans sends one request per span with call, and returns n results:
// each span's replies in place, false for every entry of a span whose call
// failed or whose reply had the wrong length. The errors of every failed
// span are joined. Spans after a failure still run, unless ctx ended or the
// Conn was closed.
func (c *Conn) runSpans(ctx context.Context, op string, n int, spans []span,
	call func(context.Context, span) ([]bool, error)) ([]bool, error) {
	out := make([]bool, n)
	var failed []SpanError
	for i, s := range spans {
		got, err := call(ctx, s)
		if err != nil {
			failed = append(failed, SpanError{Start: s.start, End: s.end, Err: err})
			if ctx.Err() != nil || c.closed.Load() {
				// The rest were never sent.
				for _, r := range spans[i+1:] {
					failed = append(failed, SpanError{Start: r.start, End: r.end, Err: err})
				}
				break
			}
			continue
		}
		if len(got) != s.len() {
			failed = append(failed, SpanError{Start: s.start, End: s.end, Err: badReply(op, "%d results for %d keys", len(got), s.len())})
			continue
		}
		copy(out[s.start:], got)
	}
	switch {
	case len(failed) == 0:
		return out, nil
	case len(spans) == 1:
		return out, failed[0].Err
	}
	return out, &BatchError{Spans: failed}
}

// SpanError is the failure of the entries [Start, End) of a split batch.
type SpanError struct {
	Start, End int
	Err        error
}

// BatchError reports a split batch whose requests failed in part: each
// failed span with its error. The entries of the spans not listed were
// answered. errors.Is and errors.As see every span's error.
type BatchError struct {
	Spans []SpanError
}

func (e *BatchError) Error() string {
	parts := make([]string, len(e.Spans))
	for i, s := range e.Spans {
		parts[i] = fmt.Sprintf("entries %d-%d: %v", s.Start, s.End-1, s.Err)
	}
	return strings.Join(parts, "; ")
}

// Unwrap returns every span's error.
func (e *BatchError) Unwrap() []error {
	errs := make([]error, len(e.Spans))
	for i, s := range e.Spans {
		errs[i] = s.Err
	}
	return errs
}

// ErrFor returns the error of entry i, or nil if its span was answered.
// It also works on a plain error, which then applies to every entry.
func ErrFor(err error, i int) error {
	if err == nil {
		return nil
	}
	var be *BatchError
	if !errors.As(err, &be) {
		return err
	}
	for _, s := range be.Spans {
		if i >= s.Start && i < s.End {
			return s.Err
		}
	}
	return nil
}

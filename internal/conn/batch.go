package conn

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
)

// A batch goes to the server as consecutive requests, cut here and nowhere
// else: by the message limit, and for ranged transfers into parts of about
// partRanges ranges or partBytes bytes (see policy.go). Each entry of a batch
// gets the answer of the request that carried it: its result, and that
// request's error when it failed.

// span is the half-open range [start, end) of a batch's entries that one
// request carries.
type span struct{ start, end int }

func (s span) len() int { return s.end - s.start }

// Encoded sizes, computed per entry so that a batch is cut without
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

// entryCost is what an entry adds to a request: its encoded bytes, and, for
// the part limits, its ranges and object bytes.
type entryCost struct {
	wire   int
	ranges int
	bytes  uint64
}

// cutter says how a batch is cut: fixed is a request's own cost; parts,
// when set, closes a request once it holds partRanges ranges or partBytes
// bytes.
type cutter struct {
	op    string
	fixed int
	parts bool
}

// cut cuts n entries into consecutive spans. A span closes before an entry
// that would take its request past maxRequestBytes, and (with parts) after
// the entry that brings it to partRanges ranges or partBytes bytes. An
// entry that cannot fit a request alone is an ErrInvalidArgument.
func (k cutter) cut(n int, cost func(i int) entryCost) ([]span, error) {
	limit := maxRequestBytes
	var spans []span
	start, used, ranges, bytes := 0, k.fixed, 0, uint64(0)
	for i := range n {
		ci := cost(i)
		if k.fixed+ci.wire > limit {
			return nil, invalid(k.op, "entry %d needs %d bytes of request, more than the %d-byte message limit", i, k.fixed+ci.wire, limit)
		}
		if used+ci.wire > limit {
			spans = append(spans, span{start, i})
			start, used, ranges, bytes = i, k.fixed, 0, 0
		}
		used += ci.wire
		ranges += ci.ranges
		bytes += ci.bytes
		if k.parts && (ranges >= partRanges || bytes >= partBytes) {
			spans = append(spans, span{start, i + 1})
			start, used, ranges, bytes = i+1, k.fixed, 0, 0
		}
	}
	if n > start || n == 0 {
		spans = append(spans, span{start, n})
	}
	return spans, nil
}

// run sends one request per span with call, up to inFlight at a time, and
// returns n results: each span's replies in place, false for every entry of
// a span whose call failed or whose reply had the wrong length. errs is nil
// when every request was answered; otherwise it holds, for each entry of a
// failed span, that span's error (nil for the others). Spans after a
// failure still run, unless ctx ended or the Conn was closed: those are
// never sent, and their entries carry the same error.
func (c *Conn) run(ctx context.Context, op string, n int, spans []span, inFlight int,
	call func(context.Context, span) ([]bool, error)) (ok []bool, errs []error) {
	if len(spans) == 1 { // almost every batch: one request, nothing to share
		got, err := call(ctx, spans[0])
		if err == nil && len(got) != n {
			err = badReply(op, "%d results for %d keys", len(got), n)
		}
		if err != nil {
			return make([]bool, n), failAll(n, err)
		}
		return got, nil
	}
	return c.runSpans(ctx, op, n, spans, inFlight, call)
}

// runSpans is run for a batch of several requests.
func (c *Conn) runSpans(ctx context.Context, op string, n int, spans []span, inFlight int,
	call func(context.Context, span) ([]bool, error)) (ok []bool, errs []error) {
	ok = make([]bool, n)
	var mu sync.Mutex // guards errs, and stop, when spans run concurrently
	var stop error
	fail := func(s span, err error) {
		if errs == nil {
			errs = make([]error, n)
		}
		for i := s.start; i < s.end; i++ {
			errs[i] = err
		}
	}
	one := func(s span) {
		mu.Lock()
		halted := stop
		mu.Unlock()
		if halted != nil {
			mu.Lock()
			fail(s, halted)
			mu.Unlock()
			return
		}
		got, err := call(ctx, s)
		if err == nil && len(got) != s.len() {
			err = badReply(op, "%d results for %d keys", len(got), s.len())
		}
		if err == nil {
			copy(ok[s.start:s.end], got)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		fail(s, err)
		if stop == nil && (ctx.Err() != nil || c.closed.Load()) {
			stop = err
		}
	}
	if inFlight <= 1 {
		for _, s := range spans {
			one(s)
		}
		return ok, errs
	}
	slots := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	for _, s := range spans {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			one(s)
		})
	}
	wg.Wait()
	return ok, errs
}

// Joined returns the distinct errors of a batch's entries (as run returns
// them) joined, in entry order; nil when there are none.
func Joined(errs []error) error {
	var distinct []error
	var last error
	for _, err := range errs {
		if err == nil || err == last {
			continue
		}
		last = err
		seen := false
		for _, d := range distinct {
			if d == err {
				seen = true
				break
			}
		}
		if !seen {
			distinct = append(distinct, err)
		}
	}
	switch len(distinct) {
	case 0:
		return nil
	case 1:
		return distinct[0]
	}
	return errors.Join(distinct...)
}

// failAll returns errs of n entries, each err.
func failAll(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

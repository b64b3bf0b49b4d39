package conn

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/umbp-go/umbp-go/internal/rpc"
)

// A batch goes to the server as consecutive requests, cut by rpc.Cutter: by
// the message limit, and for ranged transfers into parts of about
// partRanges ranges or partBytes bytes (see policy.go). Each entry of a
// batch gets the answer of the request that carried it: its result, and
// that request's error when it failed.

// varint is the size of one element of a packed repeated varint field.
func varint(v uint64) int { return protowire.SizeVarint(v) }

// fixedCost is an upper bound of what a request spends outside its
// entries: the client id field (clientID bytes; 0 when the message has
// none) and, for each of its packed fields, the tag and length prefix.
func fixedCost(clientID, packedFields int) int {
	n := 0
	if clientID > 0 {
		n += rpc.BytesField(clientID)
	}
	return n + packedFields*(1+protowire.SizeVarint(uint64(maxRequestBytes)))
}

// run sends one request per span with call, up to inFlight at a time, and
// returns n results: each span's replies in place, false for every entry of
// a span whose call failed or whose reply had the wrong length. errs is nil
// when every request was answered; otherwise it holds, for each entry of a
// failed span, that span's error (nil for the others). Spans after a
// failure still run, unless ctx ended or the Conn was closed: those are
// never sent, and their entries carry the same error.
func (c *Conn) run(ctx context.Context, op string, n int, spans []rpc.Span, inFlight int,
	call func(context.Context, rpc.Span) ([]bool, error)) (ok []bool, errs []error) {
	if len(spans) == 1 { // almost every batch: one request, nothing to share
		got, err := call(ctx, spans[0])
		if err == nil && len(got) != n {
			err = rpc.BadReply(op, "%d results for %d keys", len(got), n)
		}
		if err != nil {
			return make([]bool, n), failAll(n, err)
		}
		return got, nil
	}
	return c.runSpans(ctx, op, n, spans, inFlight, call)
}

// runSpans is run for a batch of several requests.
func (c *Conn) runSpans(ctx context.Context, op string, n int, spans []rpc.Span, inFlight int,
	call func(context.Context, rpc.Span) ([]bool, error)) (ok []bool, errs []error) {
	ok = make([]bool, n)
	var mu sync.Mutex // guards errs, and stop, when spans run concurrently
	var stop error
	fail := func(s rpc.Span, err error) {
		if errs == nil {
			errs = make([]error, n)
		}
		for i := s.Start; i < s.End; i++ {
			errs[i] = err
		}
	}
	one := func(s rpc.Span) {
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
		if err == nil && len(got) != s.Len() {
			err = rpc.BadReply(op, "%d results for %d keys", len(got), s.Len())
		}
		if err == nil {
			copy(ok[s.Start:s.End], got)
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

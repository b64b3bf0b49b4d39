package h2call

import (
	"context"
	"errors"
	"math"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// Call is a lock-step call that can stop at a bound without being lost:
// begun by TryStart, made by Run on whichever goroutine calls it, one Run
// at a time, until it has ended. A Run that may pause returns early, the
// call intact, once Pause has been called (from any goroutine): Pause wakes
// the read or write in progress with the connection's deadline, and what
// was read or written so far stays with the call. A later Run, on any
// goroutine, goes on from where the call stopped.
//
// It is for a caller that waits for a call's answer within a bound while
// the call itself must run to its end (a transfer, whose memory the server
// uses until it answers): the call runs on the waiting goroutine, with no
// hand-off to another, and is handed on only if the bound comes first.
type Call struct {
	c      *Client
	cc     *conn // while the first attempt holds it
	method string
	req    []byte
	resp   proto.Message

	mu          sync.Mutex
	pauseAsked  bool // Pause was called
	mayPause    bool // a Run that may pause is in progress
	interrupted bool // Pause set cc's deadline to wake that Run

	// The Run's own.
	begun bool // the first attempt's stream is open
	again bool // the first attempt was not processed: a second one is due
	ended bool
	err   error
}

// errPaused is the error of a read or write that a Call's Pause woke; it
// never leaves the package.
var errPaused = errors.New("h2call: paused")

// TryStart begins a call of method with req, the request message already
// encoded, whose reply Run unmarshals into resp, when one of the client's
// connections is free and idle now: nothing is written yet. It returns nil,
// having done nothing, when none is (every one busy, or a dial would be
// needed), when the client has a stats handler, or when the connection is
// secured or not a socket of the net package's (a pause must not cut a
// record in two): the caller then makes the call otherwise. req is read
// until the call has ended.
func (c *Client) TryStart(method string, req []byte, resp proto.Message) *Call {
	if c.sh != nil || len(req) > math.MaxInt32 {
		return nil
	}
	select {
	case c.slots <- struct{}{}:
	default:
		return nil
	}
	cc, _ := c.getIdle()
	if cc == nil || cc.sock == nil {
		if cc != nil {
			c.put(cc)
		}
		<-c.slots
		return nil
	}
	return &Call{c: c, cc: cc, method: method, req: req, resp: resp}
}

// Run makes the call, or goes on with it, and reports whether it has ended
// (Err then tells how). With mayPause, it returns false, the call not
// ended, once Pause has been called, and also when the server did not
// process the call, before it is sent again on another connection (which
// may need a dial). Without, it returns only once the call has ended.
func (k *Call) Run(mayPause bool) bool {
	switch {
	case k.ended:
		return true
	case k.again && mayPause:
		return false
	}
	if !k.again {
		k.mu.Lock()
		if mayPause && k.pauseAsked {
			k.mu.Unlock()
			return false
		}
		k.mayPause = mayPause
		k.mu.Unlock()
		retry, paused, err := k.first()
		k.mu.Lock()
		k.mayPause = false
		if k.interrupted {
			k.interrupted = false
			_ = k.cc.raw.SetDeadline(time.Time{})
			k.cc.pausing.Store(false)
		}
		k.mu.Unlock()
		if paused {
			return false
		}
		k.c.put(k.cc)
		k.cc = nil
		if !retry {
			k.finish(err)
			return true
		}
		k.again = true
		if mayPause {
			return false
		}
	}
	err, retry := k.c.attempt(context.Background(), k.method, k.req, k.resp, true)
	if retry {
		err = &notSentError{err} // the second attempt was not processed either
	}
	k.finish(err)
	return true
}

// Abort gives back the connection of a call no Run has been made for
// (and is not being made: Abort is one of the calls' own, as Run is),
// having sent nothing; the call has then ended with an error matching
// ErrNotSent. A call a Run was made for is left as it is.
func (k *Call) Abort() {
	if k.begun || k.ended || k.again {
		return
	}
	k.c.put(k.cc)
	k.cc = nil
	k.finish(&notSentError{failure(codes.Canceled, nil, "the call was aborted before it was sent")})
}

// first makes the first attempt on the connection TryStart took, or goes
// on with it.
func (k *Call) first() (retry, paused bool, err error) {
	cc := k.cc
	cc.resumable = true
	defer func() { cc.resumable = false }()
	ctx := context.Background()
	if !k.begun {
		k.begun = true
		cc.st.trailer = nil
		if err := cc.begin(ctx, k.method, k.resp); err != nil {
			err, retry = cc.outcome(ctx, err)
			return retry, false, err
		}
	}
	err = cc.proceed(k.req)
	if err == errPaused {
		return false, true, nil
	}
	err, retry = cc.outcome(ctx, err)
	return retry, false, err
}

func (k *Call) finish(err error) {
	k.err, k.ended = err, true
	<-k.c.slots
}

// Pause makes the Run in progress, if it may pause, return early, and any
// later Run that may pause return at once. It may be called from any
// goroutine, any number of times.
func (k *Call) Pause() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pauseAsked = true
	if k.mayPause && !k.interrupted {
		k.interrupted = true
		k.cc.pausing.Store(true)
		_ = k.cc.raw.SetDeadline(longAgo)
	}
}

// Err is the call's outcome once Run has reported its end: nil, or a
// status error as Invoke's.
func (k *Call) Err() error { return k.err }

// paused reports whether err, a read's or a write's, is a Pause waking
// it.
func (cc *conn) paused(err error) bool {
	return cc.pausing.Load() && errors.Is(err, os.ErrDeadlineExceeded)
}

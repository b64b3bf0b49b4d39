// Package h2call makes one shape of gRPC call, lock-step: a unary call
// whose request is one encoded protobuf message and whose reply is one
// protobuf message, written and read to its trailers by the goroutine that
// makes it, on an HTTP/2 connection of its own, with golang.org/x/net/http2's
// Framer and hpack (the framing grpc-go itself uses).
//
// A grpc-go call hands its request to the connection's writer goroutine and
// waits for its reader goroutine to hand the answer back: four or five
// goroutine hand-offs and a dozen system calls per call, each hand-off a
// possible wake-up of another thread. A lock-step call makes one write and
// (for a small answer) one read, and no hand-off: the cheapest way to ask a
// server a small question and wait for its answer. It is for the calls on
// a scheduler's hot path (lookups); everything else stays on grpc-go.
//
// It is a real gRPC-over-HTTP/2 client for that shape of call: connection
// preface and SETTINGS (acknowledged both ways), PING answered, flow control
// both ways (WINDOW_UPDATE granted for large answers, and a request larger
// than the server's window waits for its updates), GOAWAY and RST_STREAM,
// trailers-only answers, grpc-status and percent-decoded grpc-message, an
// answer that is not gRPC (its HTTP status), compressed messages refused,
// CONTINUATION frames, and every length and size bounded before anything is
// allocated for it (frames, header lists, the reply against MaxReplyBytes).
// A connection that nears the end of its stream ids is replaced.
//
// # Connections
//
// A Client holds up to MaxConns connections, one call at a time on each;
// a call takes an idle one, or dials one (Options.Dial, then the transport
// credentials' handshake when there are some), or waits for one to be
// free. A connection that failed, was reset, or that the server is
// draining (GOAWAY) is closed after its call; the next call dials anew.
// Nothing reads an idle connection: one idle for over a second is checked,
// without waiting, for what the server sent meanwhile before it carries a
// call (a GOAWAY or a hang-up retires it; a PING is answered with the
// call). After a failed dial, calls fail at once for a while
// (Options.Redial) rather than dial again.
//
// # Errors
//
// Every error is a gRPC status error (status.Code works on it) with the code
// grpc-go's client gives for the same event: the server's status as it
// answered; codes.Unavailable for a connection that failed, could not be
// made, or that the server is draining; codes.ResourceExhausted for a reply
// over MaxReplyBytes; codes.Internal for a violation of the protocol in the
// call's own stream (codes.Unavailable when it breaks the connection, as
// grpc-go); codes.Canceled or codes.DeadlineExceeded when the context ended,
// and codes.Canceled when the client was closed. A failure that is not the
// server's answer also wraps its cause: the dial's error, the context's
// error, ErrClosed, an I/O error — errors.Is finds them. A call the server
// did not process (refused with REFUSED_STREAM, or beyond a GOAWAY's last
// stream, or never fully written) is sent again once, on another
// connection, as grpc-go's transparent retry does.
//
// # Cancellation
//
// A call never blocks past its context: when the context ends mid-call the
// call returns at once with the context's error and its connection is shut
// down (its deadline set in the past, which wakes the read or write in
// progress, then closed). A context that cannot end costs nothing. Close
// closes every connection, which wakes the calls in flight; it never waits.
//
// # Observability
//
// With a stats.Handler, each call is seen as grpc-go's client shows it:
// TagRPC, then HandleRPC with Begin, OutHeader, OutPayload, InHeader (not
// for a trailers-only answer), InPayload, InTrailer and End, with sizes and
// the status error; each connection with TagConn, ConnBegin and ConnEnd.
// Outgoing metadata in the context (what otelgrpc injects) is sent with the
// call.
//
// Not supported, being outside the shape: streaming, compression,
// per-call credentials, and the rich error details of grpc-status-details-bin
// (a status keeps its code and message only).
package h2call

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/backoff"
)

// Defaults of Options.
const (
	// MinDefaultMaxConns is how many connections a Client opens at most
	// when Options.MaxConns is 0, or GOMAXPROCS when that is more. With
	// 16 goroutines looking up 64 keys at once on 2 cores, 4 connections
	// gave more calls a second than 2, 8 or 16, and the lowest 99th
	// percentile: a call beyond them waits its turn rather than add one
	// more stream of work to a server whose CPUs are busy.
	MinDefaultMaxConns = 4
	// DefaultDialTimeout bounds a dial and its handshake when
	// Options.DialTimeout is 0 (grpc-go's minimum connect timeout).
	DefaultDialTimeout = 20 * time.Second
	// DefaultAuthority is the :authority of a call when Options.Authority
	// is empty, as grpc-go's for a Unix socket.
	DefaultAuthority = "localhost"
)

// Variables so that tests can change them.
var (
	// idlePeek: a connection idle for longer is checked, without waiting,
	// for what the server sent meanwhile (a GOAWAY, a hang-up) before it
	// carries a call.
	idlePeek = time.Second
)

// Options configure a Client.
type Options struct {
	// Dial opens a connection to the server, bounded by ctx: a Unix socket
	// once its server's identity is checked, or a TCP connection. It is
	// required.
	Dial func(ctx context.Context) (net.Conn, error)
	// Creds, when not nil, secure each connection Dial opens: their
	// ClientHandshake runs on it (for TLS, negotiating ALPN "h2") before
	// the first byte of HTTP/2. Calls are then made with the scheme https
	// when the protocol is TLS.
	Creds credentials.TransportCredentials
	// Authority is each call's :authority, and the server name the
	// handshake is given; DefaultAuthority when empty.
	Authority string
	// MaxReplyBytes bounds a reply message; it must be positive.
	MaxReplyBytes int
	// MaxConns bounds the connections open at once; when 0,
	// MinDefaultMaxConns or GOMAXPROCS, whichever is more. A call beyond
	// them waits for one to be free.
	MaxConns int
	// DialTimeout bounds a dial and its handshake; DefaultDialTimeout when
	// 0.
	DialTimeout time.Duration
	// Redial paces dials after a failed one: until the pause it gives has
	// passed, calls fail at once with the failed dial's error, without
	// dialling. When zero: from 50 ms, doubling up to 1 s, ±20%.
	Redial backoff.Policy
	// UserAgent is sent as each call's user-agent; none when empty.
	UserAgent string
	// StatsHandler, when not nil, sees each call and each connection as it
	// sees grpc-go's client's.
	StatsHandler stats.Handler
}

// Client makes lock-step calls on a set of connections. Its methods are
// safe for concurrent use.
type Client struct {
	dial        func(context.Context) (net.Conn, error)
	creds       credentials.TransportCredentials
	authority   string
	scheme      string
	userAgent   string
	maxReply    int
	dialTimeout time.Duration
	redial      backoff.Policy
	sh          stats.Handler

	slots    chan struct{}   // a token per call holding a connection
	done     chan struct{}   // closed by Close
	closeCtx context.Context // ends with Close: dials in progress stop
	cancel   context.CancelFunc

	mu        sync.Mutex
	idle      []*conn // most recently used last
	all       map[*conn]struct{}
	closed    bool
	dialErr   error     // the last dial's failure
	retryAt   time.Time // calls fail with dialErr until then
	lastPause time.Duration
}

// New returns a Client; it does no I/O.
func New(opts Options) (*Client, error) {
	switch {
	case opts.Dial == nil:
		return nil, errors.New("h2call: Options.Dial is required")
	case opts.MaxReplyBytes <= 0:
		return nil, fmt.Errorf("h2call: Options.MaxReplyBytes %d is not positive", opts.MaxReplyBytes)
	case opts.MaxConns < 0:
		return nil, fmt.Errorf("h2call: Options.MaxConns %d is negative", opts.MaxConns)
	case opts.DialTimeout < 0:
		return nil, fmt.Errorf("h2call: Options.DialTimeout %v is negative", opts.DialTimeout)
	}
	c := &Client{
		dial:        opts.Dial,
		creds:       opts.Creds,
		authority:   opts.Authority,
		scheme:      "http",
		userAgent:   opts.UserAgent,
		maxReply:    opts.MaxReplyBytes,
		dialTimeout: opts.DialTimeout,
		redial:      opts.Redial,
		sh:          opts.StatsHandler,
		done:        make(chan struct{}),
		all:         map[*conn]struct{}{},
	}
	if c.redial == (backoff.Policy{}) {
		c.redial = backoff.Redial
	}
	if c.authority == "" {
		c.authority = DefaultAuthority
	}
	if c.creds != nil && c.creds.Info().SecurityProtocol == "tls" {
		c.scheme = "https"
	}
	if c.dialTimeout == 0 {
		c.dialTimeout = DefaultDialTimeout
	}
	n := opts.MaxConns
	if n == 0 {
		n = max(MinDefaultMaxConns, runtime.GOMAXPROCS(0))
	}
	c.slots = make(chan struct{}, n)
	c.closeCtx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// Invoke calls method (a full method name, "/package.Service/Method") with
// req, the request message already encoded, and unmarshals the reply into
// resp. req is only read, and not after Invoke returns. It returns nil or a
// status error (see the package's doc).
//
// The reply's bytes are received into a buffer of the connection, reused
// from call to call, and unmarshalled from there into resp, which keeps
// copies: no buffer changes hands, and a call allocates nothing of its own
// (what resp's content needs is proto.Unmarshal's to allocate).
func (c *Client) Invoke(ctx context.Context, method string, req []byte, resp proto.Message) error {
	if err := checkCall(ctx, req); err != nil {
		return err
	}
	select {
	case c.slots <- struct{}{}:
	default:
		select {
		case c.slots <- struct{}{}:
		case <-ctx.Done():
			return ctxFailure(ctx.Err())
		case <-c.done:
			return closedFailure()
		}
	}
	return c.invoke(ctx, method, req, resp)
}

// TryInvoke is Invoke when one of the client's connections is free now
// (MaxConns calls are not all in flight): it reports whether it made the
// call, and, when it did not, it has done nothing (it never waits for a
// connection). A caller with another way to send the call, which takes
// more calls at once, uses it when every connection is busy. A nil
// Client makes no call.
func (c *Client) TryInvoke(ctx context.Context, method string, req []byte, resp proto.Message) (sent bool, err error) {
	if c == nil {
		return false, nil
	}
	if err := checkCall(ctx, req); err != nil {
		return true, err
	}
	select {
	case c.slots <- struct{}{}:
	default:
		return false, nil
	}
	return true, c.invoke(ctx, method, req, resp)
}

// checkCall refuses a call that cannot be made, before it takes a
// connection.
func checkCall(ctx context.Context, req []byte) error {
	if err := ctx.Err(); err != nil {
		return ctxFailure(err)
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		if err := validateMetadata(md); err != nil {
			return failure(codes.Internal, nil, err.Error())
		}
	}
	if len(req) > math.MaxInt32 {
		return failuref(codes.ResourceExhausted, nil, "grpc: trying to send message larger than max (%d vs. %d)", len(req), math.MaxInt32)
	}
	return nil
}

// invoke makes a call whose slot is taken, and gives the slot back.
func (c *Client) invoke(ctx context.Context, method string, req []byte, resp proto.Message) error {
	defer func() { <-c.slots }()
	err, retry := c.attempt(ctx, method, req, resp, false)
	if retry {
		err, retry = c.attempt(ctx, method, req, resp, true)
	}
	if retry {
		return &notSentError{err} // the second attempt was not processed either
	}
	return err
}

// attempt makes one attempt of a call; retry reports an attempt the server
// did not process, which may be made again.
func (c *Client) attempt(ctx context.Context, method string, req []byte, resp proto.Message, again bool) (err error, retry bool) {
	var begin time.Time
	if c.sh != nil {
		begin = time.Now()
		ctx = c.sh.TagRPC(ctx, &stats.RPCTagInfo{FullMethodName: method, FailFast: true})
		c.sh.HandleRPC(ctx, &stats.Begin{Client: true, BeginTime: begin, FailFast: true, IsTransparentRetryAttempt: again})
	}
	cc, err := c.get(ctx)
	var trailer metadata.MD
	if err == nil {
		err, retry = cc.call(ctx, method, req, resp)
		trailer = cc.st.trailer
		c.put(cc)
	} else {
		err = &notSentError{err} // no connection: nothing went out
	}
	if c.sh != nil {
		c.sh.HandleRPC(ctx, &stats.End{Client: true, BeginTime: begin, EndTime: time.Now(), Trailer: trailer, Error: err})
	}
	return err, retry
}

// isClosed reports whether Close was called.
func (c *Client) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// get returns a connection for one call: an idle one, or a new one.
func (c *Client) get(ctx context.Context) (*conn, error) {
	if cc, err := c.getIdle(); cc != nil || err != nil {
		return cc, err
	}
	c.mu.Lock()
	if err := c.dialErr; err != nil && time.Now().Before(c.retryAt) {
		c.mu.Unlock()
		return nil, err
	}
	c.mu.Unlock()
	return c.connect(ctx)
}

// getIdle returns an idle connection that can carry a call, or none (nil,
// nil) when there is none; it never dials. Once the client is closed it
// fails.
func (c *Client) getIdle() (*conn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, closedFailure()
		}
		n := len(c.idle)
		if n == 0 {
			c.mu.Unlock()
			return nil, nil
		}
		cc := c.idle[n-1]
		c.idle[n-1] = nil
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		if time.Since(cc.lastUsed) > idlePeek && !cc.idleOK() {
			c.drop(cc)
			continue
		}
		return cc, nil
	}
}

// put takes back a connection after its call.
func (c *Client) put(cc *conn) {
	if !cc.usable() {
		c.drop(cc)
		return
	}
	cc.lastUsed = time.Now()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.drop(cc)
		return
	}
	c.idle = append(c.idle, cc)
	c.mu.Unlock()
}

// drop closes a connection and forgets it.
func (c *Client) drop(cc *conn) {
	c.mu.Lock()
	delete(c.all, cc)
	c.mu.Unlock()
	cc.close()
}

// connect dials a connection, secures it when there are credentials, and
// records it; its HTTP/2 preface goes with its first call.
func (c *Client) connect(ctx context.Context) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	defer cancel()
	stop := context.AfterFunc(c.closeCtx, cancel)
	defer stop()
	raw, err := c.dial(dctx)
	if err == nil && raw == nil {
		err = errors.New("the dial function returned no connection")
	}
	nc := raw
	if err == nil && c.creds != nil {
		nc, _, err = c.creds.ClientHandshake(dctx, c.authority, raw)
		if err != nil {
			_ = raw.Close()
		}
	}
	if err != nil {
		// A dial cut off by its caller's context (ended, or its deadline
		// passed: the dial's own timeout can fire before the context's
		// timer does) says nothing of the server: no pause for the next.
		switch {
		case c.isClosed():
			return nil, closedFailure()
		case ctx.Err() != nil:
			return nil, ctxFailure(ctx.Err())
		case deadlinePassed(ctx):
			return nil, ctxFailure(context.DeadlineExceeded)
		}
		err = transportFailure(err, "connection error: transport: error while dialing")
		c.mu.Lock()
		c.lastPause = c.redial.Next(c.lastPause)
		c.dialErr, c.retryAt = err, time.Now().Add(c.lastPause)
		c.mu.Unlock()
		return nil, err
	}
	cc := newConn(c, raw, nc)
	cc.statsCtx = context.Background()
	if c.sh != nil {
		cc.statsCtx = c.sh.TagConn(cc.statsCtx, &stats.ConnTagInfo{RemoteAddr: cc.remote, LocalAddr: cc.local})
		c.sh.HandleConn(cc.statsCtx, &stats.ConnBegin{Client: true})
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cc.close()
		return nil, closedFailure()
	}
	c.all[cc] = struct{}{}
	c.dialErr, c.lastPause = nil, 0
	c.mu.Unlock()
	return cc, nil
}

// Close closes every connection: calls in flight end at once with
// codes.Canceled, wrapping ErrClosed, and so do calls made after. It does
// not wait for anything. Closing again returns nil.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	all := c.all
	c.all, c.idle = nil, nil
	c.mu.Unlock()
	c.cancel()
	for cc := range all {
		cc.close()
	}
	return nil
}

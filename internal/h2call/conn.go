package h2call

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/sockio"
)

// conn is one HTTP/2 connection carrying one call at a time, written and
// read by the goroutine that makes the call: no goroutine of its own.
//
// Only close and interrupt may run beside the call (from Client.Close or a
// context's end); everything else belongs to the goroutine that holds the
// connection.
type conn struct {
	client  *Client
	raw     net.Conn   // as dialled: closing it, or a past deadline, wakes the call
	nc      net.Conn   // raw, or the secured connection over it
	w       io.Writer  // nc, or raw's sockio.IO when nc is raw
	sock    *sockio.IO // raw's, when nc is raw and sockio reads and writes it
	br      *bufio.Reader
	fr      *http2.Framer // reads br; writes frames into out
	out     appendBuf     // frames to write: control frames, then the request
	hblk    appendBuf     // the header block being encoded
	henc    *hpack.Encoder
	hdec    *hpack.Decoder
	blk     headerBlock // the header block being received
	tsBuf   []byte      // a grpc-timeout value being formatted
	payload []byte      // the payload of a frame other than DATA
	reply   []byte      // the reply message being received

	statsCtx      context.Context // from TagConn
	remote, local net.Addr
	closed        atomic.Bool
	lastUsed      time.Time

	// A Call's run that may pause (call.go): resumable while it runs, and
	// pausing once its Pause has set the connection's deadline, so that a
	// read or write that times out pauses the call instead of failing it.
	resumable bool
	pausing   atomic.Bool

	// The connection's state.
	broken         bool   // not to be used again
	sawSettings    bool   // the server's preface arrived
	blockBytes     int    // encoded bytes of the block being received
	nextID         uint32 // the next stream's id
	peerMaxFrame   uint32
	peerInitWindow int64
	peerMaxHeaders uint32 // 0: no limit
	sendWin        int64  // the connection's send window
	recvUnacked    uint32 // bytes received and not yet granted back
	goAway         bool
	goAwayID       uint32
	pingAck        bool // a PING awaits its ack
	pingData       [8]byte
	pendingRST     uint32 // a stream to reset (NO_ERROR) with the next write

	st stream
}

// stream is the state of the call in flight on a conn.
type stream struct {
	id          uint32
	ctx         context.Context // the call's (from TagRPC with a stats handler)
	resp        proto.Message
	sendWin     int64
	recvAvail   int64  // the window granted and not yet used
	recvUnacked uint32 // bytes received and not yet granted back
	sent        int    // bytes of the message (with its prefix) appended to out
	sendDone    bool   // send has returned: the request is out, or needs no more
	endSent     bool   // our END_STREAM was written
	headers     bool   // the response headers arrived
	done        bool   // the server ended the stream (or reset it)
	clean       bool   // ... in a way that leaves the connection usable
	unprocessed bool   // the server says it did not process the call
	err         error  // the call's outcome once done
	encoding    string // grpc-encoding
	trailer     metadata.MD
	nonGRPC     *status.Status // an answer that is not gRPC: its status
	nonGRPCData []byte         // ... and the start of its body
	prefix      [5]byte
	prefixN     int
	msgLen      int
	got         int
	msgDone     bool
	msgs        int
}

// The connection's limits.
const (
	// readBufSize is the read buffer of a connection: every frame of a
	// small answer comes in one read.
	readBufSize = 32 << 10
	// maxReadFrame is the largest frame the server may send: HTTP/2's
	// default, which is not advertised.
	maxReadFrame = 16 << 10
	// maxHeaderList bounds a received header list (SETTINGS_MAX_HEADER_LIST_SIZE).
	maxHeaderList = 64 << 10
	// headerTableSize is the decoder's table: HTTP/2's default.
	headerTableSize = 4096
	// keepReply and keepOut bound the buffers a connection keeps between
	// calls; larger ones are dropped after their call.
	keepReply = 64 << 10
	keepOut   = 256 << 10
	// nonGRPCDataMax is how much of an answer that is not gRPC is quoted
	// in its error, as grpc-go.
	nonGRPCDataMax = 1024
	// defaultWindow is HTTP/2's initial window.
	defaultWindow = 65535
	// maxWindow is the largest flow-control window.
	maxWindow = 1<<31 - 1
)

// Variables so that tests can lower them.
var (
	// recvWindow is the window granted to each stream
	// (SETTINGS_INITIAL_WINDOW_SIZE), connWindow the connection's.
	recvWindow uint32 = 1 << 20
	connWindow uint32 = 1 << 20
	// maxStreamID is the last stream id a connection uses; one that
	// reaches it is replaced.
	maxStreamID uint32 = maxWindow
)

// newConn starts an HTTP/2 connection over nc: its preface goes out with
// the first call.
func newConn(c *Client, raw, nc net.Conn) *conn {
	cc := &conn{
		client:         c,
		raw:            raw,
		nc:             nc,
		remote:         nc.RemoteAddr(),
		local:          nc.LocalAddr(),
		nextID:         1,
		peerMaxFrame:   16 << 10,
		peerInitWindow: defaultWindow,
		sendWin:        defaultWindow,
	}
	var r io.Reader = nc
	cc.w = nc
	// Read and written with raw system calls (package sockio). raw is one
	// of the net package's pointer types when sockio.New answers:
	// comparing it with nc cannot panic then.
	if s := sockio.New(raw); s != nil && nc == raw {
		r, cc.w, cc.sock = s, s, s
	}
	cc.br = bufio.NewReaderSize(r, readBufSize)
	cc.fr = http2.NewFramer(&cc.out, cc.br)
	cc.fr.SetMaxReadFrameSize(maxReadFrame)
	cc.henc = hpack.NewEncoder(&cc.hblk)
	cc.hdec = hpack.NewDecoder(headerTableSize, cc.blk.field)
	cc.hdec.SetMaxStringLength(maxHeaderList)
	cc.out.b = append(cc.out.b, http2.ClientPreface...)
	_ = cc.fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
	)
	if connWindow > defaultWindow {
		_ = cc.fr.WriteWindowUpdate(0, connWindow-defaultWindow)
	}
	return cc
}

// close closes the connection, once; it may run beside the call, whose
// reads and writes then fail at once.
func (cc *conn) close() {
	if !cc.closed.CompareAndSwap(false, true) {
		return
	}
	_ = cc.raw.Close()
	if sh := cc.client.sh; sh != nil {
		sh.HandleConn(cc.statsCtx, &stats.ConnEnd{Client: true})
	}
}

// interrupt wakes the call's read or write: the context ended.
func (cc *conn) interrupt() { _ = cc.raw.SetDeadline(longAgo) }

var longAgo = time.Unix(1, 0)

// usable reports whether the connection can carry another call.
func (cc *conn) usable() bool {
	return !cc.broken && !cc.goAway && !cc.closed.Load() && cc.nextID <= maxStreamID
}

// idleOK reports whether a connection that has been idle can carry a
// call. What the server sent meanwhile is read without waiting for more:
// complete frames are acted on (a GOAWAY or an error retires the
// connection, a PING is acknowledged with the next write), and a server
// that hung up is found out before a call is written to it.
func (cc *conn) idleOK() bool {
	sc, ok := cc.raw.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	secured := cc.nc != cc.raw
	for range 16 {
		for cc.frameBuffered() {
			if err := cc.step(); err != nil || !cc.usable() {
				return false
			}
		}
		pending, gone := peek(rc)
		switch {
		case gone:
			return false
		case !pending:
			return true
		}
		// Bytes are pending: this read returns them without waiting. On
		// a secured connection they may be the start of a record whose
		// rest is still on its way, or a record that carries no data
		// (the read goes on to the next): that read is bounded.
		if secured {
			_ = cc.raw.SetReadDeadline(time.Now().Add(idleReadWait))
		}
		_, err := cc.br.Peek(cc.br.Buffered() + 1)
		if secured {
			_ = cc.raw.SetReadDeadline(time.Time{})
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			return true // the call reads the rest
		}
		if err != nil {
			return false
		}
	}
	return true
}

// idleReadWait bounds idleOK's read on a secured connection.
const idleReadWait = 10 * time.Millisecond

// frameBuffered reports whether a whole frame is in the read buffer.
func (cc *conn) frameBuffered() bool {
	n := cc.br.Buffered()
	if n < 9 {
		return false
	}
	h, _ := cc.br.Peek(9)
	return n >= 9+int(h[0])<<16|int(h[1])<<8|int(h[2])
}

// peek reports whether bytes are pending on a socket, or its peer hung up
// (or it failed), without waiting.
func peek(rc syscall.RawConn) (pending, gone bool) {
	var b [1]byte
	err := rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
		case err != nil || n == 0:
			gone = true
		default:
			pending = true
		}
		return true
	})
	return pending, gone || err != nil
}

// call makes one call on the connection. unprocessed reports a call the
// server did not process (refused, or never fully sent): it may be sent
// again on another connection.
func (cc *conn) call(ctx context.Context, method string, req []byte, resp proto.Message) (err error, unprocessed bool) {
	cc.st.trailer = nil
	var stop func() bool
	if ctx.Done() != nil {
		if deadlinePassed(ctx) {
			return failure(codes.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded.Error()), false
		}
		stop = context.AfterFunc(ctx, cc.interrupt)
	}
	err = cc.exchange(ctx, method, req, resp)
	if stop != nil && !stop() {
		// The context ended: the connection's deadline is past.
		cc.broken = true
	}
	return cc.outcome(ctx, err)
}

// outcome is a call's answer once its exchange has returned err.
// unprocessed reports a call the server did not process (refused, or never
// fully sent): it may be sent again on another connection.
func (cc *conn) outcome(ctx context.Context, err error) (_ error, unprocessed bool) {
	if err == nil {
		return nil, false
	}
	if _, ok := err.(*callError); ok || !cc.st.done || !cc.st.clean {
		// Not the server's answer: the connection may hold the rest of
		// an answer, or none at all.
		cc.broken = true
	}
	switch {
	case cc.client.isClosed():
		return closedFailure(), false
	case ctx.Err() != nil && cc.broken && !cc.st.done:
		return ctxFailure(ctx.Err()), false
	}
	return err, cc.st.unprocessed || (!cc.st.endSent && !cc.st.done && isTransport(err))
}

// isTransport reports whether err is a failure of the connection itself.
func isTransport(err error) bool {
	var ce *callError
	return errors.As(err, &ce) && ce.st.Code() == codes.Unavailable
}

// exchange writes the request and reads the answer to its end.
func (cc *conn) exchange(ctx context.Context, method string, req []byte, resp proto.Message) error {
	if err := cc.begin(ctx, method, resp); err != nil {
		return err
	}
	return cc.proceed(req)
}

// begin opens the call's stream and encodes its header block; nothing is
// written yet.
func (cc *conn) begin(ctx context.Context, method string, resp proto.Message) error {
	id := cc.nextID
	cc.nextID += 2
	cc.st = stream{
		id:        id,
		ctx:       ctx,
		resp:      resp,
		sendWin:   cc.peerInitWindow,
		recvAvail: int64(recvWindow),
		msgLen:    -1,
	}
	// Control frames due (acks, windows, a reset) go first.
	cc.appendControl()
	return cc.writeHeaders(ctx, method)
}

// proceed writes the request, or the rest of it, and reads the answer to
// its end. A call paused (errPaused) goes on from where it stopped when
// proceed is called again.
func (cc *conn) proceed(req []byte) error {
	if cc.st.sendDone && len(cc.out.b) > 0 {
		// A pause interrupted a control frame's write (a window granted
		// back, an ack): the server may be waiting for it.
		if err := cc.flush(); err != nil {
			return err
		}
	}
	if !cc.st.sendDone {
		if err := cc.send(req); err != nil {
			return err
		}
		cc.st.sendDone = true
		cc.outPayload(req)
	}
	for !cc.st.done {
		if err := cc.step(); err != nil {
			return err
		}
	}
	cc.finishBuffers()
	return cc.st.err
}

// outPayload tells the stats handler of the request sent.
func (cc *conn) outPayload(req []byte) {
	if sh := cc.client.sh; sh != nil && cc.st.endSent {
		sh.HandleRPC(cc.st.ctx, &stats.OutPayload{
			Client:           true,
			Payload:          req,
			Length:           len(req),
			CompressedLength: len(req),
			WireLength:       len(req) + 5,
			SentTime:         time.Now(),
		})
	}
}

// finishBuffers drops a large buffer once its call is over.
func (cc *conn) finishBuffers() {
	if cap(cc.reply) > keepReply {
		cc.reply = nil
	}
	if cap(cc.out.b) > keepOut && len(cc.out.b) == 0 {
		cc.out.b = nil
	}
}

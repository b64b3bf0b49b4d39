package h2call

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func TestMain(m *testing.M) {
	if ep := os.Getenv(serverEnv); ep != "" {
		serveUntilStdinCloses(ep)
		return
	}
	goleak.VerifyTestMain(m)
}

// socketPair returns the two ends of a connected Unix stream socket pair.
func socketPair() (net.Conn, net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			if i == 1 {
				_ = conns[0].Close()
			} else {
				_ = unix.Close(fds[1])
			}
			return nil, nil, err
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}

// scripted is a client whose every dial makes a socket pair; the test plays
// the server on the other end (srvConn).
type scripted struct {
	*Client
	conns chan *srvConn
	dials atomic.Int32
}

// newScripted returns a client whose dials hand the server's ends to the
// test; mod adjusts its options.
func newScripted(t *testing.T, mod ...func(*Options)) *scripted {
	t.Helper()
	s := &scripted{conns: make(chan *srvConn, 8)}
	opts := Options{
		Dial: func(ctx context.Context) (net.Conn, error) {
			s.dials.Add(1)
			a, b, err := socketPair()
			if err != nil {
				return nil, err
			}
			s.conns <- newSrvConn(t, b)
			return a, nil
		},
		MaxReplyBytes: 4 << 20,
		UserAgent:     "h2call-test",
	}
	for _, m := range mod {
		m(&opts)
	}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Client = c
	t.Cleanup(func() {
		_ = c.Close()
		close(s.conns)
		for sc := range s.conns {
			sc.close()
		}
	})
	return s
}

// next returns the server's end of the next connection the client dials.
func (s *scripted) next(t *testing.T) *srvConn {
	t.Helper()
	select {
	case sc := <-s.conns:
		t.Cleanup(sc.close)
		return sc
	case <-time.After(10 * time.Second):
		t.Fatal("the client dialled no connection")
		return nil
	}
}

// result is a call's outcome.
type result struct {
	resp *umbppb.BatchBoolResponse
	err  error
}

// goCall starts a BatchExists call with keys; its outcome comes on the
// channel.
func (s *scripted) goCall(ctx context.Context, keys ...string) <-chan result {
	req, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: keys})
	ch := make(chan result, 1)
	go func() {
		resp := new(umbppb.BatchBoolResponse)
		err := s.Invoke(ctx, umbppb.UMBPStandalone_BatchExists_FullMethodName, req, resp)
		ch <- result{resp, err}
	}()
	return ch
}

// wait returns a call's outcome.
func wait(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return")
		return result{}
	}
}

// srvConn is the test's server end of one connection: its own framer and
// hpack contexts, reads bounded by a deadline.
type srvConn struct {
	t      *testing.T
	c      net.Conn
	fr     *http2.Framer
	henc   *hpack.Encoder
	hbuf   bytes.Buffer
	once   sync.Once
	closed atomic.Bool
}

func newSrvConn(t *testing.T, c net.Conn) *srvConn {
	sc := &srvConn{t: t, c: c}
	sc.fr = http2.NewFramer(c, c)
	sc.fr.SetMaxReadFrameSize(16 << 10) // what it advertises: nothing
	sc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	sc.fr.AllowIllegalWrites = true
	sc.henc = hpack.NewEncoder(&sc.hbuf)
	return sc
}

func (sc *srvConn) close() {
	sc.once.Do(func() {
		sc.closed.Store(true)
		_ = sc.c.Close()
	})
}

// read returns the next frame from the client.
func (sc *srvConn) read() http2.Frame {
	sc.t.Helper()
	_ = sc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := sc.fr.ReadFrame()
	if err != nil {
		sc.t.Fatalf("server: read a frame: %v", err)
	}
	return f
}

// preface reads the client's connection preface and its SETTINGS, and
// returns the settings.
func (sc *srvConn) preface() map[http2.SettingID]uint32 {
	sc.t.Helper()
	_ = sc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(sc.c, buf); err != nil || string(buf) != http2.ClientPreface {
		sc.t.Fatalf("server: preface %q, %v", buf, err)
	}
	f, ok := sc.read().(*http2.SettingsFrame)
	if !ok || f.IsAck() {
		sc.t.Fatalf("server: the client's first frame is %v, not SETTINGS", f)
	}
	set := map[http2.SettingID]uint32{}
	_ = f.ForeachSetting(func(s http2.Setting) error { set[s.ID] = s.Val; return nil })
	return set
}

// handshake reads the client's preface and sends the server's (settings
// s, and no more).
func (sc *srvConn) handshake(s ...http2.Setting) {
	sc.t.Helper()
	sc.preface()
	sc.check(sc.fr.WriteSettings(s...))
}

// check fails the test on a server's error, except a write the client
// hung up on (it may, once it has seen enough of an answer).
func (sc *srvConn) check(err error) {
	sc.t.Helper()
	if err != nil && !hungUp(err) {
		sc.t.Fatalf("server: %v", err)
	}
}

// hungUp reports whether err says the other end closed the connection.
func hungUp(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

// request is a call as the server read it.
type request struct {
	id      uint32
	headers []hpack.HeaderField
	data    []byte // the DATA frames' payload: prefix and message
	frames  []http2.Frame
	other   []http2.Frame // control frames read meanwhile (acks, window updates)
}

func (r request) header(name string) string {
	for _, f := range r.headers {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// message returns the request's message, checking its prefix.
func (r request) message(t *testing.T) []byte {
	t.Helper()
	if len(r.data) < 5 || r.data[0] != 0 || int(binary.BigEndian.Uint32(r.data[1:])) != len(r.data)-5 {
		t.Fatalf("request data %x is not one uncompressed message", r.data)
	}
	return r.data[5:]
}

// readRequest reads frames until a stream's END_STREAM, keeping the other
// frames it meets.
func (sc *srvConn) readRequest() request {
	sc.t.Helper()
	var r request
	for {
		f := sc.read()
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			r.id = f.StreamID
			r.headers = append(r.headers, f.Fields...)
			r.frames = append(r.frames, f)
			if f.StreamEnded() {
				return r
			}
		case *http2.DataFrame:
			r.data = append(r.data, f.Data()...)
			r.frames = append(r.frames, copyData(f))
			if f.StreamEnded() {
				return r
			}
		default:
			r.other = append(r.other, f)
		}
	}
}

// copyData keeps what a test needs of a DATA frame, which the framer reuses.
func copyData(f *http2.DataFrame) http2.Frame {
	return &dataCopy{FrameHeader: f.FrameHeader, data: append([]byte(nil), f.Data()...)}
}

type dataCopy struct {
	http2.FrameHeader
	data []byte
}

// block hpack-encodes fields.
func (sc *srvConn) block(fields ...string) []byte {
	sc.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = sc.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), sc.hbuf.Bytes()...)
}

// headers writes a header block carrying fields: one HEADERS frame, and
// CONTINUATION frames beyond 16 KiB.
func (sc *srvConn) headers(id uint32, end bool, fields ...string) {
	sc.t.Helper()
	blk := sc.block(fields...)
	n := min(len(blk), 16<<10)
	sc.check(sc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: blk[:n], EndHeaders: n == len(blk), EndStream: end}))
	for blk = blk[n:]; len(blk) > 0; blk = blk[n:] {
		n = min(len(blk), 16<<10)
		sc.check(sc.fr.WriteContinuation(id, n == len(blk), blk[:n]))
	}
}

// respHeaders writes gRPC's response headers.
func (sc *srvConn) respHeaders(id uint32) {
	sc.headers(id, false, ":status", "200", "content-type", "application/grpc")
}

// trailers writes gRPC trailers with code and message (sent as is).
func (sc *srvConn) trailers(id uint32, code codes.Code, msg string) {
	sc.t.Helper()
	f := []string{"grpc-status", strconv.Itoa(int(code))}
	if msg != "" {
		f = append(f, "grpc-message", msg)
	}
	sc.headers(id, true, f...)
}

// frameMsg returns m with its gRPC prefix.
func frameMsg(m []byte) []byte {
	b := make([]byte, 5, 5+len(m))
	binary.BigEndian.PutUint32(b[1:], uint32(len(m)))
	return append(b, m...)
}

// data writes p in DATA frames of at most 16 KiB.
func (sc *srvConn) data(id uint32, p []byte, end bool) {
	sc.t.Helper()
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), 16<<10)
		sc.check(sc.fr.WriteData(id, end && n == len(p), p[:n]))
		p = p[n:]
	}
}

// answer writes a whole successful answer: headers, the message, trailers.
func (sc *srvConn) answer(id uint32, m proto.Message) {
	sc.t.Helper()
	b, err := proto.Marshal(m)
	sc.check(err)
	sc.respHeaders(id)
	sc.data(id, frameMsg(b), false)
	sc.trailers(id, codes.OK, "")
}

// expectEOF waits for the client to close the connection, discarding
// what it sends meanwhile.
func (sc *srvConn) expectEOF() {
	sc.t.Helper()
	if sc.closed.Load() {
		return
	}
	_ = sc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, sc.c); err != nil && !hungUp(err) {
		sc.t.Fatalf("server: waiting for the client to hang up: %v", err)
	}
}

// bools is a BatchBoolResponse.
func bools(v ...bool) *umbppb.BatchBoolResponse { return &umbppb.BatchBoolResponse{Ok: v} }

// wantCode fails t unless err has code c and, when msg is not empty, that
// message.
func wantCode(t *testing.T, err error, c codes.Code, msg string) {
	t.Helper()
	s, ok := status.FromError(err)
	if !ok || s.Code() != c || (msg != "" && s.Message() != msg) {
		t.Fatalf("error %v (a status: %v), want code %v message %q", err, ok, c, msg)
	}
}

// errIs fails t unless errors.Is(err, target).
func errIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v does not wrap %v", err, target)
	}
}

package h2call

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/backoff"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// A call writes the preface, its SETTINGS, the request's headers as
// grpc-go's client writes them and its message; it reads the answer; the
// server's SETTINGS are acknowledged at once, its PING with the next call,
// and the next call goes on the same connection with the next stream id.
func TestCallOnTheWire(t *testing.T) {
	s := newScripted(t)
	ch := s.goCall(context.Background(), "a", "b")
	sc := s.next(t)
	set := sc.preface()
	if set[http2.SettingEnablePush] != 0 || set[http2.SettingInitialWindowSize] != recvWindow || set[http2.SettingMaxHeaderListSize] != maxHeaderList {
		t.Errorf("client settings %v", set)
	}
	r := sc.readRequest()
	// The connection's window update came with the preface.
	if len(r.other) != 1 {
		t.Fatalf("frames before the request: %v", r.other)
	}
	if wu, ok := r.other[0].(*http2.WindowUpdateFrame); !ok || wu.StreamID != 0 || wu.Increment != connWindow-defaultWindow {
		t.Errorf("first frame after SETTINGS: %v", r.other[0])
	}
	want := []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/umbp.UMBPStandalone/BatchExists"},
		{Name: ":authority", Value: "localhost"},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "user-agent", Value: "h2call-test"},
		{Name: "te", Value: "trailers"},
	}
	if !slices.Equal(r.headers, want) {
		t.Errorf("request headers %v, want %v", r.headers, want)
	}
	if r.id != 1 || len(r.frames) != 2 {
		t.Errorf("stream %d in %d frames", r.id, len(r.frames))
	}
	var req umbppb.BatchKeysRequest
	if err := proto.Unmarshal(r.message(t), &req); err != nil || !slices.Equal(req.Keys, []string{"a", "b"}) {
		t.Errorf("request %v, %v", req.Keys, err)
	}
	sc.check(sc.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100}))
	if f, ok := sc.read().(*http2.SettingsFrame); !ok || !f.IsAck() {
		t.Fatalf("the client answered SETTINGS with %v", f)
	}
	sc.check(sc.fr.WritePing(false, [8]byte{1, 2, 3}))
	sc.answer(r.id, bools(true, false))
	res := wait(t, ch)
	if res.err != nil || !slices.Equal(res.resp.Ok, []bool{true, false}) {
		t.Fatalf("call: %v, %v", res.resp, res.err)
	}

	ch = s.goCall(context.Background(), "c")
	r = sc.readRequest()
	if len(r.other) != 1 {
		t.Fatalf("frames before the second request: %v", r.other)
	}
	if p, ok := r.other[0].(*http2.PingFrame); !ok || !p.IsAck() || p.Data != [8]byte{1, 2, 3} {
		t.Errorf("the PING was answered with %v", r.other[0])
	}
	if r.id != 3 {
		t.Errorf("second stream id %d", r.id)
	}
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil || !slices.Equal(res.resp.Ok, []bool{true}) {
		t.Fatalf("second call: %v, %v", res.resp, res.err)
	}
	if n := s.dials.Load(); n != 1 {
		t.Errorf("%d dials for two calls", n)
	}
}

// The answers that end a call with a status, each on a fresh client.
func TestStatuses(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer func(sc *srvConn, id uint32)
		code   codes.Code
		msg    string
		reuse  bool // the connection carries the next call
	}{
		{"trailers only", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "5", "grpc-message", "no such key")
		}, codes.NotFound, "no such key", true},
		{"percent-encoded message", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.trailers(id, codes.InvalidArgument, "bad%20key%3A%zz%E2%82%AC%4")
		}, codes.InvalidArgument, "bad key:%zz€%4", true},
		{"status after the message", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			b, _ := proto.Marshal(bools(true))
			sc.data(id, frameMsg(b), false)
			sc.trailers(id, codes.ResourceExhausted, "later")
		}, codes.ResourceExhausted, "later", true},
		{"no grpc-status", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.headers(id, true, "x-other", "1")
		}, codes.Unknown, "", true},
		{"an unknown code", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "99")
		}, codes.Code(99), "", true},
		{"malformed grpc-status", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "x")
		}, codes.Unknown, `transport: malformed grpc-status: strconv.ParseInt: parsing "x": invalid syntax`, false},
		{"grpc-status wins over :status", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":status", "500", "content-type", "application/grpc", "grpc-status", "7")
		}, codes.PermissionDenied, "", true},
		{"HTTP 404 without a body", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":status", "404")
		}, codes.Unimplemented, "unexpected HTTP status code received from server: 404 (Not Found); malformed header: missing HTTP content-type", false},
		{"HTTP 503 with a body", func(sc *srvConn, id uint32) {
			sc.headers(id, false, ":status", "503", "content-type", "text/html")
			sc.data(id, []byte("<h1>busy</h1>"), true)
		}, codes.Unavailable, "unexpected HTTP status code received from server: 503 (Service Unavailable); transport: received unexpected content-type \"text/html\"\ndata: \"<h1>busy</h1>\"", false},
		{"HTTP 200 that is not gRPC", func(sc *srvConn, id uint32) {
			sc.headers(id, false, ":status", "200", "content-type", "text/plain")
			sc.data(id, bytes.Repeat([]byte("x"), 3000), false)
		}, codes.Unknown, "unexpected HTTP status code received from server: 200 (OK); transport: received unexpected content-type \"text/plain\"\ndata: \"" + strings.Repeat("x", 1024) + "\"", false},
		{"informational headers first", func(sc *srvConn, id uint32) {
			sc.headers(id, false, ":status", "100")
			sc.answer(id, bools(true))
		}, codes.OK, "", true},
		{"informational headers ending the stream", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":status", "100")
		}, codes.Internal, "protocol error: informational header with status code 100 must not have END_STREAM set", false},
		{"compressed message", func(sc *srvConn, id uint32) {
			sc.headers(id, false, ":status", "200", "content-type", "application/grpc", "grpc-encoding", "gzip")
			sc.data(id, []byte{1, 0, 0, 0, 1, 0}, false)
		}, codes.Internal, `grpc: Decompressor is not installed for grpc-encoding "gzip"`, false},
		{"compressed flag without an encoding", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.data(id, []byte{1, 0, 0, 0, 1, 0}, false)
		}, codes.Internal, "grpc: compressed flag set with identity or empty encoding", false},
		{"unknown payload format", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.data(id, []byte{2, 0, 0, 0, 0}, false)
		}, codes.Internal, "grpc: received unexpected payload format 2", false},
		{"reply over MaxReplyBytes", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.data(id, []byte{0, 0, 0x40, 0, 1}, false)
		}, codes.ResourceExhausted, "grpc: received message larger than max (4194305 vs. 4194304)", false},
		{"two messages", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			b, _ := proto.Marshal(bools(true))
			sc.data(id, append(frameMsg(b), frameMsg(b)...), false)
			sc.trailers(id, codes.OK, "")
		}, codes.Internal, "cardinality violation: expected <EOF> for non server-streaming RPCs, but received another message", false},
		{"no message", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.trailers(id, codes.OK, "")
		}, codes.Internal, "cardinality violation: received no response message from non-server-streaming RPC", false},
		{"message cut by the trailers", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.data(id, []byte{0, 0, 0, 0, 9, 1, 2}, false)
			sc.trailers(id, codes.OK, "")
		}, codes.Internal, "unexpected EOF", false},
		{"prefix cut by the trailers", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.data(id, []byte{0, 0}, false)
			sc.trailers(id, codes.NotFound, "")
		}, codes.Internal, "unexpected EOF", false},
		{"a message that does not unmarshal", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.data(id, frameMsg([]byte{0xff}), false)
			sc.trailers(id, codes.OK, "")
		}, codes.Internal, "", false},
		{"no trailers", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			b, _ := proto.Marshal(bools(true))
			sc.data(id, frameMsg(b), true)
		}, codes.Internal, "server closed the stream without sending trailers", false},
		{"DATA before headers", func(sc *srvConn, id uint32) {
			sc.data(id, frameMsg(nil), false)
		}, codes.Internal, "protocol error: DATA frame before the response headers", false},
		{"headers twice", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.respHeaders(id)
		}, codes.Internal, "a HEADERS frame cannot appear in the middle of a stream", false},
		{"upper-case header name", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":status", "200", "Content-Type", "application/grpc")
		}, codes.Internal, `invalid header field name "Content-Type"`, false},
		{"pseudo header after a regular one", func(sc *srvConn, id uint32) {
			sc.headers(id, true, "content-type", "application/grpc", ":status", "200")
		}, codes.Internal, "pseudo header field after regular header field", false},
		{"request pseudo header in an answer", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":path", "/x")
		}, codes.Internal, `invalid pseudo-header ":path"`, false},
		{"header list over the limit", func(sc *srvConn, id uint32) {
			sc.headers(id, true, ":status", "200", "content-type", "application/grpc", "x-big", strings.Repeat("v", maxHeaderList))
		}, codes.Internal, "peer header list size exceeded limit", false},
		{"RST_STREAM CANCEL", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WriteRSTStream(id, http2.ErrCodeCancel))
		}, codes.Canceled, "stream terminated by RST_STREAM with error code: CANCEL", false},
		{"RST_STREAM INTERNAL_ERROR after headers", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.check(sc.fr.WriteRSTStream(id, http2.ErrCodeInternal))
		}, codes.Internal, "stream terminated by RST_STREAM with error code: INTERNAL_ERROR", false},
		{"RST_STREAM FLOW_CONTROL", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WriteRSTStream(id, http2.ErrCodeFlowControl))
		}, codes.ResourceExhausted, "stream terminated by RST_STREAM with error code: FLOW_CONTROL_ERROR", false},
		{"connection closed", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.close()
		}, codes.Unavailable, "", false},
		{"GOAWAY with an even stream id", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WriteGoAway(2, http2.ErrCodeNo, nil))
		}, codes.Unavailable, "connection error: received goaway with non-zero even-numbered stream id: 2", false},
		{"bad setting", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 100}))
		}, codes.Unavailable, "", false},
		{"PUSH_PROMISE", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WritePushPromise(http2.PushPromiseParam{StreamID: id, PromiseID: 2, BlockFragment: sc.block(":method", "GET"), EndHeaders: true}))
		}, codes.Unavailable, "connection error: PUSH_PROMISE, with push disabled", false},
		{"frame over the size limit", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WriteRawFrame(http2.FrameType(0x77), 0, 0, make([]byte, maxReadFrame+1)))
		}, codes.Unavailable, "", false},
		{"DATA on stream 0", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WriteRawFrame(http2.FrameData, 0, 0, []byte{1}))
		}, codes.Unavailable, "connection error: DATA frame with stream ID 0", false},
		{"padding longer than the frame", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			sc.check(sc.fr.WriteRawFrame(http2.FrameData, http2.FlagDataPadded, id, []byte{5, 0, 0}))
		}, codes.Unavailable, "connection error: pad size larger than data payload", false},
		{"CONTINUATION out of place", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WriteContinuation(id, true, sc.block(":status", "200")))
		}, codes.Unavailable, "", false},
		{"broken hpack", func(sc *srvConn, id uint32) {
			sc.check(sc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff, 0xff}, EndHeaders: true}))
		}, codes.Unavailable, "", false},
		{"data over the stream's window", func(sc *srvConn, id uint32) {
			sc.respHeaders(id)
			big := frameMsg(make([]byte, recvWindow+10))
			for len(big) > 0 {
				n := min(len(big), 16<<10)
				sc.check(sc.fr.WriteData(id, false, big[:n]))
				big = big[n:]
			}
		}, codes.Internal, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScripted(t)
			ch := s.goCall(context.Background(), "k")
			sc := s.next(t)
			sc.handshake()
			r := sc.readRequest()
			c.answer(sc, r.id)
			res := wait(t, ch)
			if c.code == codes.OK {
				if res.err != nil {
					t.Fatalf("call: %v", res.err)
				}
			} else {
				wantCode(t, res.err, c.code, c.msg)
			}
			// A connection still in a known state carries the next call;
			// any other is closed.
			ch = s.goCall(context.Background(), "k")
			if c.reuse {
				r := sc.readRequest()
				sc.answer(r.id, bools(true))
			} else {
				sc.expectEOF()
				sc2 := s.next(t)
				sc2.handshake()
				r := sc2.readRequest()
				sc2.answer(r.id, bools(true))
			}
			if res := wait(t, ch); res.err != nil {
				t.Fatalf("the next call: %v", res.err)
			}
		})
	}
}

// A reply larger than the windows granted is received through WINDOW_UPDATEs
// the client sends, and the server never has to exceed a window.
func TestReplyNeedsWindowUpdates(t *testing.T) {
	defer setWindows(defaultWindow, defaultWindow)()
	s := newScripted(t)
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	n := 300000
	want := make([]bool, n)
	for i := range want {
		want[i] = i%3 == 0
	}
	b, _ := proto.Marshal(bools(want...))
	msg := frameMsg(b)
	sc.respHeaders(r.id)
	connWin, streamWin := int64(defaultWindow), int64(defaultWindow)
	updates := 0
	for len(msg) > 0 {
		for connWin <= 0 || streamWin <= 0 {
			switch f := sc.read().(type) {
			case *http2.WindowUpdateFrame:
				updates++
				if f.StreamID == 0 {
					connWin += int64(f.Increment)
				} else if f.StreamID == r.id {
					streamWin += int64(f.Increment)
				}
			case *http2.SettingsFrame:
			default:
				t.Fatalf("server: waiting for a window update, got %v", f)
			}
		}
		k := int(min(int64(len(msg)), connWin, streamWin, 16<<10))
		sc.check(sc.fr.WriteData(r.id, false, msg[:k]))
		msg = msg[k:]
		connWin -= int64(k)
		streamWin -= int64(k)
	}
	sc.trailers(r.id, codes.OK, "")
	res := wait(t, ch)
	if res.err != nil || !slices.Equal(res.resp.Ok, want) {
		t.Fatalf("call: %d results, %v", len(res.resp.GetOk()), res.err)
	}
	if updates < 2*(len(b)/defaultWindow) {
		t.Errorf("%d window updates for %d bytes", updates, len(b))
	}
}

// setWindows sets the windows the client grants, for the connections it
// makes from now on, and returns what restores them.
func setWindows(stream, conn uint32) func() {
	s, c := recvWindow, connWindow
	recvWindow, connWindow = stream, conn
	return func() { recvWindow, connWindow = s, c }
}

// A request larger than the server's windows waits for its WINDOW_UPDATEs
// (stream's and connection's), in frames no larger than the server allows.
func TestRequestWaitsForWindowUpdates(t *testing.T) {
	s := newScripted(t)
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = strings.Repeat("k", 90) + string(rune('a'+i%26))
	}
	ch := s.goCall(context.Background(), keys...)
	sc := s.next(t)
	sc.preface()
	const streamWin, frameMax = 10000, 20000
	sc.check(sc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWin}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: frameMax}))
	connLeft, streamLeft := int64(defaultWindow), int64(defaultWindow) // until our SETTINGS are acked
	var data []byte
	var id uint32
	acked := false
	for done := false; !done; {
		switch f := sc.read().(type) {
		case *http2.SettingsFrame:
			if f.IsAck() && !acked {
				acked = true
				// From now on the stream's window is ours: what it had,
				// less what was sent.
				streamLeft += streamWin - defaultWindow
			}
		case *http2.MetaHeadersFrame:
			id = f.StreamID
		case *http2.DataFrame:
			n := int64(f.Length)
			if n > frameMax || (!acked && n > 16<<10) {
				t.Fatalf("DATA frame of %d bytes", n)
			}
			connLeft -= n
			streamLeft -= n
			if connLeft < 0 || streamLeft < 0 {
				t.Fatalf("the client overran a window: connection %d, stream %d", connLeft, streamLeft)
			}
			data = append(data, f.Data()...)
			done = f.StreamEnded()
		}
		// Grant a little at a time.
		for !done && (connLeft <= 0 || streamLeft <= 0) {
			sc.check(sc.fr.WriteWindowUpdate(0, 7000))
			sc.check(sc.fr.WriteWindowUpdate(id, 7000))
			connLeft += 7000
			streamLeft += 7000
		}
	}
	var req umbppb.BatchKeysRequest
	if err := proto.Unmarshal(request{data: data}.message(t), &req); err != nil || !slices.Equal(req.Keys, keys) {
		t.Fatalf("request of %d keys, %v", len(req.Keys), err)
	}
	sc.answer(id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
}

// A server that answers before reading the whole request ends the call;
// the rest of the request is not sent, our half of the stream is reset,
// and the connection carries the next call.
func TestEarlyAnswer(t *testing.T) {
	s := newScripted(t)
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = strings.Repeat("k", 100)
	}
	ch := s.goCall(context.Background(), keys...)
	sc := s.next(t)
	sc.handshake(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1000})
	var id uint32
	for id == 0 {
		if f, ok := sc.read().(*http2.MetaHeadersFrame); ok {
			id = f.StreamID
		}
	}
	sc.headers(id, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "8", "grpc-message", "too big")
	// What the client sent of the connection's window is granted back, as
	// a server does for what it read.
	sc.check(sc.fr.WriteWindowUpdate(0, defaultWindow))
	res := wait(t, ch)
	wantCode(t, res.err, codes.ResourceExhausted, "too big")
	ch = s.goCall(context.Background(), "k")
	var rst *http2.RSTStreamFrame
	for {
		f := sc.read()
		if r, ok := f.(*http2.RSTStreamFrame); ok {
			rst = r
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			if rst == nil || rst.StreamID != id || rst.ErrCode != http2.ErrCodeNo {
				t.Fatalf("no RST_STREAM for the answered stream before the next call: %v", rst)
			}
			for {
				if d, ok := sc.read().(*http2.DataFrame); ok && d.StreamEnded() {
					break
				}
			}
			sc.answer(h.StreamID, bools(true))
			break
		}
	}
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
}

// Header blocks in HEADERS and CONTINUATION frames, both ways: outgoing
// metadata too large for one frame goes in CONTINUATIONs, and so can the
// answer's headers and trailers.
func TestContinuation(t *testing.T) {
	s := newScripted(t)
	big := strings.Repeat("m", 40000)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-big", big, "x-bin", "\x00\x01")
	ch := s.goCall(ctx, "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	if r.header("x-big") != big || r.header("x-bin") != "AAE" {
		t.Errorf("metadata not sent: x-bin %q", r.header("x-bin"))
	}
	split := func(end bool, fields ...string) {
		blk := sc.block(fields...)
		n := len(blk) / 3
		sc.check(sc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.id, BlockFragment: blk[:n], EndStream: end}))
		sc.check(sc.fr.WriteContinuation(r.id, false, blk[n:2*n]))
		sc.check(sc.fr.WriteContinuation(r.id, true, blk[2*n:]))
	}
	split(false, ":status", "200", "content-type", "application/grpc", "x-long", strings.Repeat("h", 20000))
	b, _ := proto.Marshal(bools(true))
	sc.data(r.id, frameMsg(b), false)
	split(true, "grpc-status", "0", "x-long", strings.Repeat("t", 20000))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
}

// Metadata that grpc-go refuses is refused before anything is sent.
func TestBadMetadata(t *testing.T) {
	s := newScripted(t)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-ok", "bad\nvalue")
	res := wait(t, s.goCall(ctx, "k"))
	wantCode(t, res.err, codes.Internal, `header key "x-ok" contains value with non-printable ASCII characters`)
	if n := s.dials.Load(); n != 0 {
		t.Errorf("%d dials", n)
	}
}

// A GOAWAY that leaves the call out makes it unprocessed: it is sent again
// on a new connection. One that covers it lets it finish; the connection is
// then closed.
func TestGoAway(t *testing.T) {
	s := newScripted(t)
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	sc.check(sc.fr.WriteGoAway(0, http2.ErrCodeNo, []byte("restarting")))
	sc.expectEOF()
	sc2 := s.next(t)
	sc2.handshake()
	r2 := sc2.readRequest()
	if r2.id != 1 || !bytes.Equal(r2.data, r.data) {
		t.Fatalf("retried as stream %d with %x", r2.id, r2.data)
	}
	sc2.check(sc2.fr.WriteGoAway(1, http2.ErrCodeNo, nil))
	sc2.answer(r2.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	sc2.expectEOF()
	if n := s.dials.Load(); n != 2 {
		t.Errorf("%d dials", n)
	}
}

// An unprocessed call is sent again once only.
func TestUnprocessedTwice(t *testing.T) {
	s := newScripted(t)
	ch := s.goCall(context.Background(), "k")
	for range 2 {
		sc := s.next(t)
		sc.handshake()
		r := sc.readRequest()
		sc.check(sc.fr.WriteRSTStream(r.id, http2.ErrCodeRefusedStream))
	}
	wantCode(t, wait(t, ch).err, codes.Unavailable, "stream terminated by RST_STREAM with error code: REFUSED_STREAM")
	if n := s.dials.Load(); n != 2 {
		t.Errorf("%d dials", n)
	}
}

// A connection whose stream ids run out is replaced.
func TestStreamIDsRenewed(t *testing.T) {
	defer func(v uint32) { maxStreamID = v }(maxStreamID)
	maxStreamID = 5
	s := newScripted(t)
	sc := s.next
	var cur *srvConn
	for i := range 4 {
		ch := s.goCall(context.Background(), "k")
		if i%3 == 0 {
			if cur != nil {
				cur.expectEOF()
			}
			cur = sc(t)
			cur.handshake()
		}
		r := cur.readRequest()
		if want := uint32(1 + 2*(i%3)); r.id != want {
			t.Fatalf("call %d on stream %d, want %d", i, r.id, want)
		}
		cur.answer(r.id, bools(true))
		if res := wait(t, ch); res.err != nil {
			t.Fatal(res.err)
		}
	}
	if n := s.dials.Load(); n != 2 {
		t.Errorf("%d dials for 4 calls of 3 a connection", n)
	}
}

// A call whose context ends mid-call returns at once with the context's
// error, and its connection is shut down; a deadline is sent as
// grpc-timeout.
func TestContextEnds(t *testing.T) {
	s := newScripted(t)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.goCall(ctx, "k")
	sc := s.next(t)
	sc.handshake()
	sc.readRequest()
	cancel()
	res := wait(t, ch)
	wantCode(t, res.err, codes.Canceled, "context canceled")
	errIs(t, res.err, context.Canceled)
	sc.expectEOF()

	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	ch = s.goCall(ctx, "k")
	sc = s.next(t)
	sc.handshake()
	r := sc.readRequest()
	if v := r.header("grpc-timeout"); !strings.HasSuffix(v, "u") && !strings.HasSuffix(v, "m") {
		t.Errorf("grpc-timeout %q", v)
	}
	res = wait(t, ch)
	wantCode(t, res.err, codes.DeadlineExceeded, "context deadline exceeded")
	errIs(t, res.err, context.DeadlineExceeded)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("returned %v after a deadline of 300ms", d)
	}
	sc.expectEOF()

	// An ended context fails a call before anything.
	res = wait(t, s.goCall(ctx, "k"))
	wantCode(t, res.err, codes.DeadlineExceeded, "")
	if n := s.dials.Load(); n != 2 {
		t.Errorf("%d dials", n)
	}
}

// A call waiting for a connection (all busy) is bounded by its context.
func TestWaitForAConnection(t *testing.T) {
	s := newScripted(t, func(o *Options) { o.MaxConns = 1 })
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	ctx, cancel := context.WithCancel(context.Background())
	ch2 := s.goCall(ctx, "k")
	cancel()
	wantCode(t, wait(t, ch2).err, codes.Canceled, "")
	ch3 := s.goCall(context.Background(), "k")
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	r = sc.readRequest()
	sc.answer(r.id, bools(true))
	if res := wait(t, ch3); res.err != nil {
		t.Fatal(res.err)
	}
}

// TryInvoke makes the call on a free connection, and does nothing while
// every connection is busy.
func TestTryInvoke(t *testing.T) {
	s := newScripted(t, func(o *Options) { o.MaxConns = 1 })
	req, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: []string{"k"}})
	try := func() (bool, error) {
		return s.TryInvoke(context.Background(), umbppb.UMBPStandalone_BatchExists_FullMethodName, req, new(umbppb.BatchBoolResponse))
	}
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	if sent, err := try(); sent || err != nil {
		t.Fatalf("TryInvoke with the one connection busy = %v, %v; want not sent", sent, err)
	}
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if sent, err := try(); !sent || err != nil {
			t.Errorf("TryInvoke with the connection free = %v, %v", sent, err)
		}
	}()
	r = sc.readRequest()
	sc.answer(r.id, bools(true))
	<-done
	if n := s.dials.Load(); n != 1 {
		t.Errorf("%d dials", n)
	}
}

// Close wakes a call stuck on a silent server, and a call waiting for a
// connection; both end with codes.Canceled wrapping ErrClosed. Later calls
// are refused the same way.
func TestCloseWakesCalls(t *testing.T) {
	s := newScripted(t, func(o *Options) { o.MaxConns = 1 })
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	sc.readRequest()
	ch2 := s.goCall(context.Background(), "k")
	done := make(chan struct{})
	go func() {
		_ = s.Close()
		close(done)
	}()
	for _, c := range []<-chan result{ch, ch2} {
		res := wait(t, c)
		wantCode(t, res.err, codes.Canceled, "grpc: the client connection is closing")
		errIs(t, res.err, ErrClosed)
	}
	<-done
	sc.expectEOF()
	res := wait(t, s.goCall(context.Background(), "k"))
	errIs(t, res.err, ErrClosed)
}

// A failed dial fails the call as unavailable, wrapping the dial's error;
// calls fail at once for a while after, without dialling; then a dial is
// tried again.
func TestDialFails(t *testing.T) {
	errNo := errors.New("no server")
	dials := 0
	c, err := New(Options{Dial: func(context.Context) (net.Conn, error) { dials++; return nil, errNo }, MaxReplyBytes: 1,
		Redial: backoff.Policy{Base: time.Hour, Max: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		err := c.Invoke(context.Background(), "/x/y", nil, new(umbppb.Empty))
		wantCode(t, err, codes.Unavailable, "")
		errIs(t, err, errNo)
	}
	if dials != 1 {
		t.Errorf("%d dials", dials)
	}
	c.mu.Lock()
	c.retryAt = time.Time{}
	c.mu.Unlock()
	_ = c.Invoke(context.Background(), "/x/y", nil, new(umbppb.Empty))
	if dials != 2 {
		t.Errorf("%d dials after the pause", dials)
	}
}

// A server whose first frame is not SETTINGS is not an HTTP/2 server.
func TestFirstFrameNotSettings(t *testing.T) {
	s := newScripted(t)
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.preface()
	sc.check(sc.fr.WritePing(false, [8]byte{}))
	wantCode(t, wait(t, ch).err, codes.Unavailable, "connection error: the server's first frame is PING, not SETTINGS")
}

// An idle connection the server hung up on is found out before it carries
// a call: the call goes on a new one, in one attempt (not by a retry after
// a failed write).
func TestIdleConnectionGone(t *testing.T) {
	defer func(d time.Duration) { idlePeek = d }(idlePeek)
	idlePeek = 0
	var rec recorder
	s := newScripted(t, func(o *Options) { o.StatsHandler = &rec })
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	// The server's last frames (a ping, say) are left unread, then it
	// hangs up.
	sc.check(sc.fr.WritePing(false, [8]byte{}))
	sc.close()
	ch = s.goCall(context.Background(), "k")
	sc2 := s.next(t)
	sc2.handshake()
	r = sc2.readRequest()
	sc2.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	if calls, _ := rec.snapshot(); len(calls) != 2 {
		t.Errorf("%d attempts for 2 calls", len(calls))
	}
}

// A reply's buffer grows with what arrives: a server declaring a huge
// message and sending little makes the client allocate little.
func TestDeclaredLengthNotAllocated(t *testing.T) {
	s := newScripted(t, func(o *Options) { o.MaxReplyBytes = 1 << 30 })
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	sc.respHeaders(r.id)
	sc.data(r.id, []byte{0, 0x3f, 0xff, 0xff, 0xff, 1, 2, 3}, false)
	sc.trailers(r.id, codes.OK, "")
	wantCode(t, wait(t, ch).err, codes.Internal, "unexpected EOF")
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("%d bytes allocated for a reply declaring 1 GiB and sending 3 bytes", d)
	}
}

// A header list the server limits (SETTINGS_MAX_HEADER_LIST_SIZE) is not
// exceeded.
func TestServerHeaderListLimit(t *testing.T) {
	s := newScripted(t)
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake(http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: 300})
	r := sc.readRequest()
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-long", strings.Repeat("v", 300))
	wantCode(t, wait(t, s.goCall(ctx, "k")).err, codes.Internal, "header list size to send violates the maximum size (300 bytes) set by server")
}

// Options are checked.
func TestNewRefuses(t *testing.T) {
	dial := func(context.Context) (net.Conn, error) { return nil, io.EOF }
	for _, o := range []Options{
		{MaxReplyBytes: 1},
		{Dial: dial},
		{Dial: dial, MaxReplyBytes: 1, MaxConns: -1},
		{Dial: dial, MaxReplyBytes: 1, DialTimeout: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// DATA of another stream (an old one's, say) is discarded, and its bytes
// are granted back to the connection's window.
func TestOtherStreamsDataGrantedBack(t *testing.T) {
	defer setWindows(defaultWindow, defaultWindow)()
	s := newScripted(t)
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	granted, sent := int64(0), int64(0)
	chunk := make([]byte, 16<<10)
	for sent < 4*defaultWindow {
		if sent-granted+int64(len(chunk)) > defaultWindow {
			switch f := sc.read().(type) {
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					granted += int64(f.Increment)
				}
			case *http2.SettingsFrame:
			default:
				t.Fatalf("server: waiting for the connection's window, got %v", f)
			}
			continue
		}
		sc.check(sc.fr.WriteData(r.id+2, false, chunk))
		sent += int64(len(chunk))
	}
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
}

// A GOAWAY that reaches an idle connection retires it before it carries
// another call: the next call goes on a new connection at its first
// attempt, and the old one is closed.
func TestIdleGoAway(t *testing.T) {
	defer func(d time.Duration) { idlePeek = d }(idlePeek)
	idlePeek = 0
	var rec recorder
	s := newScripted(t, func(o *Options) { o.StatsHandler = &rec })
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	sc.check(sc.fr.WritePing(false, [8]byte{9}))
	sc.check(sc.fr.WriteGoAway(r.id, http2.ErrCodeNo, nil))
	ch = s.goCall(context.Background(), "k")
	sc.expectEOF()
	sc2 := s.next(t)
	sc2.handshake()
	r = sc2.readRequest()
	sc2.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	if calls, _ := rec.snapshot(); len(calls) != 2 {
		t.Errorf("%d attempts for 2 calls", len(calls))
	}
}

// A call that never went out matches ErrNotSent: no connection could be
// dialled, or the server refused it unprocessed twice. One whose request
// the server read does not, whatever happened to it after: it may have
// been processed.
func TestNotSent(t *testing.T) {
	refused := errors.New("connection refused")
	s := newScripted(t, func(o *Options) {
		o.Dial = func(context.Context) (net.Conn, error) { return nil, refused }
	})
	err := wait(t, s.goCall(context.Background(), "k")).err
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, refused) || status.Code(err) != codes.Unavailable {
		t.Fatalf("a call with no connection: %v (code %v), want ErrNotSent, the dial's error and Unavailable", err, status.Code(err))
	}

	s = newScripted(t)
	ch := s.goCall(context.Background(), "k")
	for range 2 {
		sc := s.next(t)
		sc.handshake()
		r := sc.readRequest()
		sc.check(sc.fr.WriteRSTStream(r.id, http2.ErrCodeRefusedStream))
	}
	if err := wait(t, ch).err; !errors.Is(err, ErrNotSent) || status.Code(err) != codes.Unavailable {
		t.Fatalf("a call refused unprocessed twice: %v, want ErrNotSent and Unavailable", err)
	}

	s = newScripted(t)
	ch = s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	sc.readRequest()
	sc.close() // read, and never answered
	if err := wait(t, ch).err; err == nil || errors.Is(err, ErrNotSent) {
		t.Fatalf("a call the server read, then hung up on: %v, want an error that is not ErrNotSent", err)
	}
}

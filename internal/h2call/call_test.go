package h2call

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

const existsMethod = umbppb.UMBPStandalone_BatchExists_FullMethodName

// warmed makes one call on a new connection, so that the client has an
// idle one, and returns the server's end of it.
func warmed(t *testing.T, s *scripted) *srvConn {
	t.Helper()
	ch := s.goCall(context.Background(), "warm")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	return sc
}

// started begins a call of keys with TryStart, which must take the idle
// connection.
func started(t *testing.T, s *scripted, keys ...string) (*Call, *umbppb.BatchBoolResponse, []byte) {
	t.Helper()
	req, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: keys})
	resp := new(umbppb.BatchBoolResponse)
	k := s.TryStart(existsMethod, req, resp)
	if k == nil {
		t.Fatal("TryStart with a connection idle = nil")
	}
	return k, resp, req
}

// runIn runs k.Run(mayPause) on a goroutine of its own; its answer comes
// on the channel.
func runIn(k *Call, mayPause bool) <-chan bool {
	ch := make(chan bool, 1)
	go func() { ch <- k.Run(mayPause) }()
	return ch
}

func ran(t *testing.T, ch <-chan bool) bool {
	t.Helper()
	select {
	case ended := <-ch:
		return ended
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return false
	}
}

// A Call started on an idle connection runs on the goroutine that calls
// Run, to its end, and gives the connection back.
func TestCallRuns(t *testing.T) {
	s := newScripted(t)
	sc := warmed(t, s)
	k, resp, req := started(t, s, "a", "b")
	ch := runIn(k, true)
	r := sc.readRequest()
	if !bytes.Equal(r.message(t), req) {
		t.Fatal("the request differs from the one given")
	}
	sc.answer(r.id, bools(true, false))
	if !ran(t, ch) || k.Err() != nil || !slices.Equal(resp.Ok, []bool{true, false}) {
		t.Fatalf("Run: err %v, reply %v", k.Err(), resp.Ok)
	}
	if !k.Run(true) {
		t.Error("Run of an ended call reports it running")
	}
	k.Pause() // after the end: nothing happens
	ch2 := s.goCall(context.Background(), "c")
	r = sc.readRequest()
	sc.answer(r.id, bools(true))
	if res := wait(t, ch2); res.err != nil {
		t.Fatal(res.err)
	}
	if n := s.dials.Load(); n != 1 {
		t.Errorf("%d dials, want the one connection throughout", n)
	}
}

// TryStart does nothing when no connection is idle and free now, or with a
// stats handler.
func TestTryStartRefuses(t *testing.T) {
	s := newScripted(t, func(o *Options) { o.MaxConns = 1 })
	req, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: []string{"k"}})
	if k := s.TryStart(existsMethod, req, new(umbppb.BatchBoolResponse)); k != nil {
		t.Fatal("TryStart with no connection yet: a call (it would dial)")
	}
	ch := s.goCall(context.Background(), "k")
	sc := s.next(t)
	sc.handshake()
	r := sc.readRequest()
	if k := s.TryStart(existsMethod, req, new(umbppb.BatchBoolResponse)); k != nil {
		t.Fatal("TryStart with the one connection busy: a call")
	}
	sc.answer(r.id, bools(true))
	wait(t, ch)
	k := s.TryStart(existsMethod, req, new(umbppb.BatchBoolResponse))
	if k == nil {
		t.Fatal("TryStart with the connection idle = nil")
	}
	if k2 := s.TryStart(existsMethod, req, new(umbppb.BatchBoolResponse)); k2 != nil {
		t.Fatal("TryStart while a started call holds the one connection: a call")
	}
	ch2 := runIn(k, false)
	sc.answer(sc.readRequest().id, bools(true))
	if !ran(t, ch2) || k.Err() != nil {
		t.Fatal(k.Err())
	}

	withStats := newScripted(t, func(o *Options) { o.StatsHandler = nopStats{} })
	warmed(t, withStats)
	if k := withStats.TryStart(existsMethod, req, new(umbppb.BatchBoolResponse)); k != nil {
		t.Fatal("TryStart with a stats handler: a call")
	}
}

type nopStats struct{}

func (nopStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (nopStats) HandleRPC(context.Context, stats.RPCStats)                         {}
func (nopStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (nopStats) HandleConn(context.Context, stats.ConnStats)                       {}

// A Run that may pause returns once Pause is called while it waits for
// the answer, with the call intact: an answer that arrives in two pieces,
// one before the pause and one after, is read whole by a later Run on
// another goroutine, and the connection then carries the next call.
func TestCallPausedWhileReading(t *testing.T) {
	s := newScripted(t)
	sc := warmed(t, s)
	k, resp, _ := started(t, s, "a", "b", "c")
	ch := runIn(k, true)
	r := sc.readRequest()

	var wire bytes.Buffer
	fr := http2.NewFramer(&wire, nil)
	sc.check(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.id, BlockFragment: sc.block(":status", "200", "content-type", "application/grpc"), EndHeaders: true}))
	m, _ := proto.Marshal(bools(true, false, true))
	sc.check(fr.WriteData(r.id, false, frameMsg(m)))
	sc.check(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.id, BlockFragment: sc.block("grpc-status", "0"), EndHeaders: true, EndStream: true}))
	b := wire.Bytes()
	cut := len(b) / 2 // within the DATA frame
	if _, err := sc.c.Write(b[:cut]); err != nil {
		t.Fatal(err)
	}
	readByPeer(t, sc) // the half is in the client's buffer: it waits for the rest
	k.Pause()
	if ran(t, ch) {
		t.Fatalf("Run ended (err %v) though its answer is half sent", k.Err())
	}
	if k.Run(true) {
		t.Fatal("a Run that may pause, after Pause: ended")
	}
	if _, err := sc.c.Write(b[cut:]); err != nil {
		t.Fatal(err)
	}
	if !ran(t, runIn(k, false)) || k.Err() != nil || !slices.Equal(resp.Ok, []bool{true, false, true}) {
		t.Fatalf("the Run after the pause: err %v, reply %v", k.Err(), resp.Ok)
	}
	ch2 := s.goCall(context.Background(), "d")
	sc.answer(sc.readRequest().id, bools(true))
	if res := wait(t, ch2); res.err != nil {
		t.Fatalf("the next call on the connection: %v", res.err)
	}
	if n := s.dials.Load(); n != 1 {
		t.Errorf("%d dials", n)
	}
}

// A Run that may pause returns once Pause is called while its request is
// still being written; what it had written stays written, and a later Run
// writes the rest: the server gets the request whole, byte for byte.
func TestCallPausedWhileWriting(t *testing.T) {
	s := newScripted(t)
	ch := s.goCall(context.Background(), "warm")
	sc := s.next(t)
	sc.handshake(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	sc.check(sc.fr.WriteWindowUpdate(0, 1<<30))
	r := sc.readRequest()
	sc.answer(r.id, bools(true))
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	keys := make([]string, 40000) // about 4 MB: more than the socket holds
	for i := range keys {
		keys[i] = strings.Repeat("k", 90) + string(rune('a'+i%26))
	}
	k, resp, req := started(t, s, keys...)
	run := runIn(k, true)
	// Once the server has read the request's first 64 KiB, the client is
	// writing the rest (4 MB do not fit the socket): the pause stops a
	// write half done.
	prefix := make([]byte, 64<<10)
	_ = sc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(sc.c, prefix); err != nil {
		t.Fatal(err)
	}
	k.Pause()
	if ran(t, run) {
		t.Fatalf("Run ended (err %v) with its request not read", k.Err())
	}
	run = runIn(k, false)
	fr := http2.NewFramer(sc.c, io.MultiReader(bytes.NewReader(prefix), sc.c))
	fr.SetMaxReadFrameSize(16 << 10)
	fr.ReadMetaHeaders = sc.fr.ReadMetaHeaders // the same header table
	fr.AllowIllegalWrites = true
	sc.fr = fr
	r = sc.readRequest()
	if !bytes.Equal(r.message(t), req) {
		t.Fatalf("the server read %d bytes of request, not the %d given", len(r.data)-5, len(req))
	}
	sc.answer(r.id, bools(true))
	if !ran(t, run) || k.Err() != nil || !slices.Equal(resp.Ok, []bool{true}) {
		t.Fatalf("err %v, reply %v", k.Err(), resp.Ok)
	}
}

// Pause before the first Run: a Run that may pause returns at once having
// sent nothing; one that may not makes the call.
func TestCallPausedBeforeRun(t *testing.T) {
	s := newScripted(t)
	sc := warmed(t, s)
	k, _, req := started(t, s, "a")
	k.Pause()
	if k.Run(true) {
		t.Fatal("Run(true) after Pause ended the call")
	}
	ch := runIn(k, false)
	r := sc.readRequest()
	if !bytes.Equal(r.message(t), req) {
		t.Fatal("the request differs")
	}
	sc.answer(r.id, bools(true))
	if !ran(t, ch) || k.Err() != nil {
		t.Fatal(k.Err())
	}
}

// A call the server did not process: a Run that may pause returns before
// it is sent again (which may need a dial); the next Run sends it on a new
// connection.
func TestCallUnprocessed(t *testing.T) {
	s := newScripted(t)
	sc := warmed(t, s)
	k, resp, _ := started(t, s, "a")
	ch := runIn(k, true)
	r := sc.readRequest()
	sc.check(sc.fr.WriteRSTStream(r.id, http2.ErrCodeRefusedStream))
	if ran(t, ch) {
		t.Fatalf("Run ended (err %v) at a refused stream", k.Err())
	}
	ch = runIn(k, true)
	if ran(t, ch) {
		t.Fatal("a Run that may pause made the second attempt")
	}
	ch = runIn(k, false)
	sc2 := s.next(t)
	sc2.handshake()
	sc2.answer(sc2.readRequest().id, bools(true))
	if !ran(t, ch) || k.Err() != nil || !slices.Equal(resp.Ok, []bool{true}) {
		t.Fatalf("err %v, reply %v", k.Err(), resp.Ok)
	}
}

// Close ends a paused call: its next Run fails as Invoke's do.
func TestCallClosedWhilePaused(t *testing.T) {
	s := newScripted(t)
	sc := warmed(t, s)
	k, _, _ := started(t, s, "a")
	ch := runIn(k, true)
	sc.readRequest()
	k.Pause()
	if ran(t, ch) {
		t.Fatal("Run ended with no answer")
	}
	_ = s.Close()
	if !ran(t, runIn(k, false)) {
		t.Fatal("Run(false) did not end")
	}
	wantCode(t, k.Err(), codes.Canceled, "grpc: the client connection is closing")
	errIs(t, k.Err(), ErrClosed)
}

// readByPeer waits until the client has read everything the server wrote
// to it (the server's socket holds none of it any more).
func readByPeer(t *testing.T, sc *srvConn) {
	t.Helper()
	rc, err := sc.c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		var queued int
		var qerr error
		if err := rc.Control(func(fd uintptr) { queued, qerr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || qerr != nil {
			t.Fatal(err, qerr)
		}
		if queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client left %d bytes unread", queued)
		}
	}
}

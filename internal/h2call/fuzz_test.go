package h2call

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// script writes what a server sends, frame by frame, into a buffer.
type script struct {
	bytes.Buffer
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer
}

func newScript() *script {
	s := &script{}
	s.fr = http2.NewFramer(&s.Buffer, nil)
	s.fr.AllowIllegalWrites = true
	s.henc = hpack.NewEncoder(&s.hbuf)
	return s
}

func (s *script) block(fields ...string) []byte {
	s.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = s.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), s.hbuf.Bytes()...)
}

func (s *script) settings(set ...http2.Setting) *script { _ = s.fr.WriteSettings(set...); return s }

func (s *script) headers(id uint32, end bool, fields ...string) *script {
	_ = s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: s.block(fields...), EndHeaders: true, EndStream: end})
	return s
}

func (s *script) answer(id uint32, ok ...bool) *script {
	b, _ := proto.Marshal(bools(ok...))
	s.headers(id, false, ":status", "200", "content-type", "application/grpc")
	_ = s.fr.WriteData(id, false, frameMsg(b))
	return s.headers(id, true, "grpc-status", "0")
}

// fuzz modes: the first byte of an input.
const (
	fuzzSettings   = 1 << iota // a valid SETTINGS frame goes before the script
	fuzzBigRequest             // the request outgrows the default windows
	fuzzTwoCalls               // a second call follows on the same client
	fuzzSlow                   // the script is written in small pieces
)

// hostileSeeds are whole conversations and their usual faults, for the
// mutator to start from.
func hostileSeeds() [][]byte {
	seed := func(mode byte, s *script) []byte { return append([]byte{mode}, s.Bytes()...) }
	big := strings.Repeat("x", 20000)
	return [][]byte{
		seed(0, newScript().settings().answer(1, true, false)),
		seed(fuzzSettings|fuzzTwoCalls, newScript().answer(1, true).answer(3, false)),
		seed(fuzzTwoCalls, newScript().settings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0}).answer(1, true).answer(3, false)),
		seed(fuzzSettings, newScript().headers(1, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "5", "grpc-message", "no%20key")),
		seed(fuzzSettings, newScript().headers(1, true, ":status", "503", "content-type", "text/html")),
		seed(fuzzSettings, func() *script {
			s := newScript()
			_ = s.fr.WriteGoAway(0, http2.ErrCodeNo, []byte("bye"))
			return s
		}()),
		seed(fuzzSettings, func() *script {
			s := newScript()
			_ = s.fr.WriteRSTStream(1, http2.ErrCodeRefusedStream)
			return s
		}()),
		seed(fuzzSettings|fuzzBigRequest, func() *script {
			s := newScript().settings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 20000})
			_ = s.fr.WriteWindowUpdate(0, 1<<20)
			_ = s.fr.WriteWindowUpdate(1, 1<<20)
			_ = s.fr.WritePing(false, [8]byte{7})
			return s.answer(1, true)
		}()),
		seed(fuzzSettings, func() *script {
			s := newScript()
			blk := s.block(":status", "200", "content-type", "application/grpc", "x-big", big)
			n := len(blk) / 3
			_ = s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk[:n]})
			_ = s.fr.WriteContinuation(1, false, blk[n:2*n])
			_ = s.fr.WriteContinuation(1, true, blk[2*n:])
			_ = s.fr.WriteData(1, false, []byte{0, 0, 0, 0, 2, 10, 0})
			_ = s.fr.WriteDataPadded(1, false, nil, make([]byte, 10))
			return s.headers(1, true, "grpc-status", "0")
		}()),
		seed(fuzzSettings, func() *script {
			s := newScript()
			s.headers(1, false, ":status", "200", "content-type", "application/grpc", "grpc-encoding", "gzip")
			_ = s.fr.WriteData(1, false, []byte{1, 0, 0, 0, 1, 0})
			return s
		}()),
		seed(fuzzSettings|fuzzSlow, newScript().answer(1, true)),
		{},
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	}
}

// allocatedBytes is how much the process has allocated so far.
func allocatedBytes() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// FuzzH2Server plays a hostile server: the input's first byte chooses a
// mode, the rest is what the server sends on every connection the client
// makes, whatever the client sends (which it reads and discards), before
// it hangs up (shutdown for writing). Whatever it sends, a call returns
// before its deadline with nil or a status error, without panicking, and
// allocates within a bound the server cannot raise.
func FuzzH2Server(f *testing.F) {
	for _, s := range hostileSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) { hostile(t, in) })
}

// The seeds end as they should: the harness is not one where every call
// fails.
func TestHostileSeeds(t *testing.T) {
	want := [][]codes.Code{
		{codes.OK},
		{codes.OK, codes.OK},
		{codes.OK, codes.OK},
		{codes.NotFound},
		{codes.Unavailable},
		{codes.Unavailable}, // GOAWAY: retried, refused again
		{codes.Unavailable}, // REFUSED_STREAM: retried, refused again
		{codes.OK},
		{codes.OK},
		{codes.Internal},
		{codes.OK},
		{codes.Unavailable},
		{codes.Unavailable, codes.Unavailable},
	}
	for i, s := range hostileSeeds() {
		errs := hostile(t, s)
		var got []codes.Code
		for _, err := range errs {
			got = append(got, status.Code(err))
		}
		if !slices.Equal(got, want[i]) {
			t.Errorf("seed %d: %v (%v), want %v", i, got, errs, want[i])
		}
	}
}

var (
	fuzzSettingsFrame = newScript().settings().Bytes()
	fuzzBigReq        = func() []byte {
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = strings.Repeat("k", 95) + strconv.Itoa(i)
		}
		b, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: keys})
		return b
	}()
	fuzzSmallReq, _ = proto.Marshal(&umbppb.BatchKeysRequest{Keys: []string{"a", "b"}})
)

// hostile runs the calls of a fuzz input against its server and checks
// them; it returns their errors.
func hostile(t *testing.T, in []byte) []error {
	var mode byte
	if len(in) > 0 {
		mode, in = in[0], in[1:]
	}
	// Nothing may hang: not a call (bounded by its deadline), not Close,
	// not the server's goroutines, which end when the client hangs up.
	watchdog := time.AfterFunc(10*time.Second, func() {
		buf := make([]byte, 1<<20)
		panic(fmt.Sprintf("hostile server: hung for 10s\n%s", buf[:runtime.Stack(buf, true)]))
	})
	defer watchdog.Stop()
	var wg sync.WaitGroup
	dial := func(context.Context) (net.Conn, error) {
		a, b, err := socketPair()
		if err != nil {
			return nil, err
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(io.Discard, b)
			_ = b.Close()
		}()
		go func() {
			defer wg.Done()
			if mode&fuzzSettings != 0 {
				_, _ = b.Write(fuzzSettingsFrame)
			}
			if mode&fuzzSlow != 0 {
				for p := in; len(p) > 0; p = p[min(len(p), 7):] {
					if _, err := b.Write(p[:min(len(p), 7)]); err != nil {
						break
					}
				}
			} else {
				_, _ = b.Write(in)
			}
			_ = b.(*net.UnixConn).CloseWrite()
		}()
		return a, nil
	}
	const maxReply = 64 << 10
	c, err := New(Options{Dial: dial, MaxReplyBytes: maxReply, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer wg.Wait()
	defer c.Close()
	before := allocatedBytes()
	req := fuzzSmallReq
	if mode&fuzzBigRequest != 0 {
		req = fuzzBigReq
	}
	calls := 1
	if mode&fuzzTwoCalls != 0 {
		calls = 2
	}
	const deadline = time.Second
	var errs []error
	for range calls {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		resp := new(umbppb.BatchBoolResponse)
		err := c.Invoke(ctx, umbppb.UMBPStandalone_BatchExists_FullMethodName, req, resp)
		took := time.Since(start)
		cancel()
		if took > deadline+time.Second {
			t.Fatalf("the call took %v with a deadline of %v", took, deadline)
		}
		if err != nil {
			if s, ok := status.FromError(err); !ok || s.Code() == codes.OK {
				t.Fatalf("error %v (%T) is not a status error", err, err)
			}
		} else if proto.Size(resp) > maxReply {
			t.Fatalf("a reply of %d bytes passed a limit of %d", proto.Size(resp), maxReply)
		}
		errs = append(errs, err)
	}
	// What a call allocates is bounded by the limits (frames, header
	// lists, MaxReplyBytes), never by what the server declares: the input
	// is at most what arrives, and the rest is slack for the fuzzing
	// engine's own allocations.
	if got, bound := allocatedBytes()-before, uint64(8<<20+4*len(in)); got > bound {
		t.Fatalf("%d bytes allocated for %d calls on %d bytes of input (bound %d)", got, calls, len(in), bound)
	}
	return errs
}

package h2call

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/testcert"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/masterdouble"
	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// The conformance tests run the same calls through the lock-step client and
// through grpc-go's, against grpc-go servers (the project's own standalone
// server; the master test double), and compare what each decodes.

// faultInterceptor lets a lookup's first key script the server's answer:
//
//	"fail/<code>/<message>"         an error: a trailers-only answer
//	"headers-then-fail/<code>/<m>"  headers, then the error in trailers
//	"metadata"                      headers and trailers with metadata, the
//	                                headers echoing the request's x-tagged
func faultInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	r, ok := req.(*umbppb.BatchKeysRequest)
	if !ok || len(r.Keys) == 0 {
		return handler(ctx, req)
	}
	parts := strings.SplitN(r.Keys[0], "/", 3)
	switch parts[0] {
	case "fail", "headers-then-fail":
		code, _ := strconv.Atoi(parts[1])
		if parts[0] == "headers-then-fail" {
			_ = grpc.SendHeader(ctx, metadata.Pairs("x-header", "h"))
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t", "x-trailer-bin", "\x00\xff"))
		}
		return nil, status.Error(codes.Code(code), parts[2])
	case "metadata":
		md, _ := metadata.FromIncomingContext(ctx)
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-header", "h", "x-echo", strings.Join(md.Get("x-tagged"), ",")))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t"))
	}
	return handler(ctx, req)
}

// shortDir is a temporary directory whose socket paths fit sun_path.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "h2c")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// standalone starts the project's Go server on a Unix socket, with keys
// "held-<i>" for i < held stored, and returns its gRPC socket's path.
func standalone(t testing.TB, held int) string {
	t.Helper()
	ep := "unix://" + filepath.Join(shortDir(t), "s.grpc.sock")
	srv, err := server.New(server.Options{
		Endpoint:         ep,
		Capacity:         64 << 20,
		Logger:           slog.New(slog.DiscardHandler),
		UnaryInterceptor: faultInterceptor,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	grpcPath, fdPath, _ := fdpass.SocketPaths(ep)
	if held > 0 {
		store(t, grpcPath, fdPath, held)
	}
	return grpcPath
}

// store registers a memfd with the server and stores keys held-0.. from it.
func store(t testing.TB, grpcPath, fdPath string, n int) {
	t.Helper()
	ctx := context.Background()
	const base, size, obj = 0x10000, 1 << 20, 16
	fd, err := unix.MemfdCreate("h2call-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	const client = "h2call-test"
	if err := fdpass.Send(ctx, fdPath, fd, fdpass.Registration{ClientID: client, WorkerBase: base, Size: size}, nil); err != nil {
		t.Fatal(err)
	}
	cc := stub(t, "unix://"+grpcPath)
	c := umbppb.NewUMBPStandaloneClient(cc)
	if r, err := c.RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{ClientId: client, WorkerBase: base, Size: size, Kind: umbppb.MemoryKind_MEMORY_KIND_HOST_SHM}); err != nil || !r.GetOk() {
		t.Fatalf("RegisterMemory: %v %v", r, err)
	}
	req := &umbppb.BatchDataRequest{ClientId: client}
	for i := range n {
		req.Keys = append(req.Keys, heldKey(i))
		req.ShmOffsets = append(req.ShmOffsets, uint64(i*obj%size))
		req.Sizes = append(req.Sizes, obj)
		req.RegionBases = append(req.RegionBases, base)
	}
	r, err := c.BatchPut(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range r.GetOk() {
		if !ok {
			t.Fatalf("BatchPut refused key %d", i)
		}
	}
}

func heldKey(i int) string { return fmt.Sprintf("held-%d", i) }

// stub is a grpc-go channel to target.
func stub(t testing.TB, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20))}, opts...)
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// unixDial dials a Unix socket.
func unixDial(path string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

// tcpDial dials a TCP address.
func tcpDial(addr string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

// lockstep is a Client for the conformance tests.
func lockstep(t testing.TB, opts Options) *Client {
	t.Helper()
	if opts.MaxReplyBytes == 0 {
		opts.MaxReplyBytes = 64 << 20
	}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// keys returns n keys of about width bytes: every third one held (of the
// first held ones), the others not.
func keys(n, width, held int) []string {
	out := make([]string, n)
	for i := range out {
		if i%3 == 0 && i/3 < held {
			out[i] = heldKey(i / 3)
			continue
		}
		k := fmt.Sprintf("missing-%d-", i)
		out[i] = k + strings.Repeat("x", max(0, width-len(k)))
	}
	return out
}

// call is one call of a conformance sequence.
type call struct {
	name   string
	method string
	req    proto.Message
	resp   func() proto.Message
}

func exists(name string, ks ...string) call {
	return call{name, umbppb.UMBPStandalone_BatchExists_FullMethodName, &umbppb.BatchKeysRequest{Keys: ks}, func() proto.Message { return new(umbppb.BatchBoolResponse) }}
}

func consecutive(name string, ks ...string) call {
	return call{name, umbppb.UMBPStandalone_BatchExistsConsecutive_FullMethodName, &umbppb.BatchKeysRequest{Keys: ks}, func() proto.Message { return new(umbppb.CountResponse) }}
}

func lookup(name string, ks ...string) call {
	return call{name, umbppb.UMBPMaster_BatchLookup_FullMethodName, &umbppb.BatchLookupRequest{Keys: ks}, func() proto.Message { return new(umbppb.BatchLookupResponse) }}
}

// compare runs each call through c and through cc, and fails t where their
// answers (decoded replies, or status codes and messages) differ. It
// returns the statuses, for the caller's own checks.
func compare(t *testing.T, c *Client, cc *grpc.ClientConn, calls []call) []*status.Status {
	t.Helper()
	var out []*status.Status
	for _, k := range calls {
		req, err := proto.Marshal(k.req)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		got, want := k.resp(), k.resp()
		gotErr := c.Invoke(ctx, k.method, req, got)
		wantErr := cc.Invoke(ctx, k.method, k.req, want)
		cancel()
		gs, ws := status.Convert(gotErr), status.Convert(wantErr)
		if gs.Code() != ws.Code() || gs.Message() != ws.Message() {
			t.Errorf("%s: lock-step %v; grpc-go %v", k.name, gotErr, wantErr)
		}
		if wantErr == nil && !proto.Equal(got, want) {
			t.Errorf("%s: lock-step answered %v; grpc-go %v", k.name, brief(got), brief(want))
		}
		out = append(out, gs)
	}
	return out
}

func brief(m proto.Message) string {
	s := fmt.Sprint(m)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// standaloneCalls is the sequence of the standalone server's conformance.
func standaloneCalls(held int) []call {
	huge := keys(120000, 10, held)
	return []call{
		exists("no keys"),
		exists("one held key", heldKey(0)),
		exists("one missing key", "missing"),
		exists("64 keys", keys(64, 100, held)...),
		exists("1024 keys", keys(1024, 100, held)...),
		consecutive("consecutive, none", "missing", heldKey(0)),
		consecutive("consecutive, 5", heldKey(0), heldKey(1), heldKey(2), heldKey(3), heldKey(4), "missing", heldKey(5)),
		consecutive("consecutive, 1024", keys(1024, 100, held)...),
		exists("a trailers-only error", "fail/5/no such thing"),
		exists("an error with percent-encoding", "fail/3/bad %key: ünïcode\n"),
		exists("an error after headers", "headers-then-fail/13/boom"),
		exists("metadata both ways", "metadata", heldKey(0)),
		{"an unknown method", "/umbp.UMBPStandalone/NoSuchMethod", &umbppb.Empty{}, func() proto.Message { return new(umbppb.Empty) }},
		{"an unknown service", "/no.Such/Method", &umbppb.Empty{}, func() proto.Message { return new(umbppb.Empty) }},
		exists("120000 keys: a request and an answer past the windows", huge...),
		exists("after the big one", heldKey(1)),
	}
}

// The standalone service's calls give the same answers through both
// clients, with the client's default windows and with HTTP/2's smallest:
// then the answer of 120000 keys (120 KB) cannot arrive without the
// client's WINDOW_UPDATEs, and its request (1.4 MB) goes through grpc-go's
// server's flow control either way.
func TestConformanceStandalone(t *testing.T) {
	const held = 300
	path := standalone(t, held)
	cc := stub(t, "unix://"+path)
	for _, w := range []uint32{recvWindow, defaultWindow} {
		t.Run(fmt.Sprintf("window %d", w), func(t *testing.T) {
			defer setWindows(w, w)()
			c := lockstep(t, Options{Dial: unixDial(path)})
			compare(t, c, cc, standaloneCalls(held))
			// The held keys are found at all: the comparison is not of
			// two empty answers.
			var r umbppb.BatchBoolResponse
			req, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: []string{heldKey(held - 1), "x"}})
			if err := c.Invoke(context.Background(), umbppb.UMBPStandalone_BatchExists_FullMethodName, req, &r); err != nil || !r.Ok[0] || r.Ok[1] {
				t.Fatalf("held key answered %v, %v", r.Ok, err)
			}
		})
	}
}

// A reply over the limit is refused by both with the same status, and the
// next call goes through.
func TestConformanceMaxReply(t *testing.T) {
	path := standalone(t, 10)
	cc := stub(t, "unix://"+path, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1000)))
	c := lockstep(t, Options{Dial: unixDial(path), MaxReplyBytes: 1000})
	st := compare(t, c, cc, []call{
		exists("a reply of 1003 bytes", keys(1000, 10, 10)...),
		exists("a reply of 1000 bytes", keys(997, 10, 10)...),
	})
	if st[0].Code() != codes.ResourceExhausted || st[1].Code() != codes.OK {
		t.Errorf("statuses %v", st)
	}
}

// masterDouble serves the master test double on loopback TCP, over TLS
// when cert is not nil, with keys held-<i> for i < held on one node.
func masterDouble(t testing.TB, held int, cert *tls.Certificate) (addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if cert != nil {
		opts = append(opts, grpc.Creds(credentials.NewServerTLSFromCert(cert)))
	}
	gs := grpc.NewServer(opts...)
	svc := masterdouble.New(masterdouble.Options{})
	umbppb.RegisterUMBPMasterServer(gs, svc)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	ctx := context.Background()
	if _, err := svc.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n1", NodeAddress: "127.0.0.1:1", PeerAddress: "p1"}); err != nil {
		t.Fatal(err)
	}
	b := &umbppb.EventBundle{Seq: 1}
	for i := range held {
		b.Events = append(b.Events, &umbppb.KvEvent{Kind: umbppb.KvEvent_ADD, Key: heldKey(i), Tier: umbppb.TierType_TIER_DRAM, Size: 4096})
	}
	if r, err := svc.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n1", Bundles: []*umbppb.EventBundle{b}}); err != nil || r.GetAckedSeq() != 1 {
		t.Fatalf("Heartbeat: %v %v", r, err)
	}
	return lis.Addr().String()
}

func masterCalls(held int) []call {
	return []call{
		lookup("no keys"),
		lookup("one held key", heldKey(0)),
		lookup("64 keys", keys(64, 100, held)...),
		lookup("1024 keys", keys(1024, 100, held)...),
		lookup("100000 keys", keys(100000, 20, held)...),
		{"a method the double does not serve", umbppb.UMBPMaster_RouteGet_FullMethodName, &umbppb.RouteGetRequest{Key: "k"}, func() proto.Message { return new(umbppb.RouteGetResponse) }},
		lookup("after", heldKey(1)),
	}
}

// The master's BatchLookup gives the same answers through both clients, in
// plaintext and over TLS.
func TestConformanceMaster(t *testing.T) {
	const held = 200
	t.Run("plaintext", func(t *testing.T) {
		addr := masterDouble(t, held, nil)
		c := lockstep(t, Options{Dial: tcpDial(addr), Authority: addr})
		compare(t, c, stub(t, addr), masterCalls(held))
	})
	t.Run("TLS", func(t *testing.T) {
		cert, pool := testcert.New(t)
		addr := masterDouble(t, held, &cert)
		creds := credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
		c := lockstep(t, Options{Dial: tcpDial(addr), Authority: addr, Creds: creds})
		if c.scheme != "https" {
			t.Errorf("scheme %q over TLS", c.scheme)
		}
		compare(t, c, stub(t, addr, grpc.WithTransportCredentials(creds)), masterCalls(held))
		// Without the server's certificate, the handshake fails: no byte
		// of HTTP/2 goes out.
		bad := lockstep(t, Options{Dial: tcpDial(addr), Authority: addr,
			Creds: credentials.NewTLS(&tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12})})
		err := bad.Invoke(context.Background(), umbppb.UMBPMaster_BatchLookup_FullMethodName, nil, new(umbppb.BatchLookupResponse))
		wantCode(t, err, codes.Unavailable, "")
		var ue x509.UnknownAuthorityError
		if !errors.As(err, &ue) {
			t.Errorf("error %v does not wrap the certificate's", err)
		}
		// A plaintext client gets nowhere with a TLS server.
		plain := lockstep(t, Options{Dial: tcpDial(addr), Authority: addr})
		err = plain.Invoke(context.Background(), umbppb.UMBPMaster_BatchLookup_FullMethodName, nil, new(umbppb.BatchLookupResponse))
		wantCode(t, err, codes.Unavailable, "")
	})
}

// closeNotifier is a listener whose connections report their closing.
type closeNotifier struct {
	net.Listener
	closed chan struct{}
}

func (l closeNotifier) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &notifyConn{Conn: c, closed: l.closed}, nil
}

type notifyConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

// Close hangs up (shutdown for writing, which the client sees at once, while
// the descriptor may stay open until a goroutine blocked on it lets go),
// closes, and then reports.
func (c *notifyConn) Close() error {
	if uc, ok := c.Conn.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	err := c.Conn.Close()
	c.once.Do(func() { c.closed <- struct{}{} })
	return err
}

// A server that closes an idle connection costs the next call nothing: the
// client reads what the server sent before using the connection, and makes
// the call on a new one at the first attempt, in plaintext and over TLS.
// Here the server is grpc-go's with its keepalive (by default a PING after
// 2 hours without a call, and the connection closed when it is not
// answered within 20 s), which an idle lock-step connection does not
// answer: nothing reads it.
func TestServerClosesIdleConnection(t *testing.T) {
	defer func(d time.Duration) { idlePeek = d }(idlePeek)
	idlePeek = 0
	cert, pool := testcert.New(t)
	for _, secure := range []bool{false, true} {
		t.Run(fmt.Sprintf("TLS=%v", secure), func(t *testing.T) {
			sock := filepath.Join(shortDir(t), "m.sock")
			lis, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			cn := closeNotifier{lis, make(chan struct{}, 4)}
			opts := []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{Time: 20 * time.Millisecond, Timeout: 20 * time.Millisecond})}
			var creds credentials.TransportCredentials
			if secure {
				opts = append(opts, grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
				creds = credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
			}
			gs := grpc.NewServer(opts...)
			umbppb.RegisterUMBPMasterServer(gs, masterdouble.New(masterdouble.Options{}))
			go func() { _ = gs.Serve(cn) }()
			defer gs.Stop()
			const addr = "127.0.0.1:1" // what the certificate names
			var rec recorder
			dials := 0
			dial := unixDial(sock)
			c := lockstep(t, Options{Dial: func(ctx context.Context) (net.Conn, error) { dials++; return dial(ctx) }, Authority: addr, Creds: creds, StatsHandler: &rec})
			for i := range 2 {
				if err := c.Invoke(context.Background(), umbppb.UMBPMaster_BatchLookup_FullMethodName, nil, new(umbppb.BatchLookupResponse)); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if i == 0 {
					select {
					case <-cn.closed:
					case <-time.After(10 * time.Second):
						t.Fatal("the server did not close the idle connection")
					}
				}
			}
			if calls, _ := rec.snapshot(); len(calls) != 2 || dials != 2 {
				t.Errorf("%d attempts and %d dials for 2 calls", len(calls), dials)
			}
		})
	}
}

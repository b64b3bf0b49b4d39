package conn

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/h2call"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func TestMain(m *testing.M) {
	// A Conn dialled without a logger logs to slog's default: quiet
	// unless -v.
	flag.Parse()
	if !testing.Verbose() {
		slog.SetDefault(quietLog)
	}
	goleak.VerifyTestMain(m)
}

func dial(t testing.TB, endpoint string, mod ...func(*Options)) *Conn {
	t.Helper()
	opts := Options{Endpoint: endpoint}
	for _, m := range mod {
		m(&opts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// memfd returns a read-write memfd of size bytes mapped MAP_SHARED.
func memfd(t testing.TB, size int) (fd int, mem []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("umbp-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Munmap(mem)
		_ = unix.Close(fd)
	})
	return fd, mem
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// wantReq fails unless got and want encode to the same bytes.
func wantReq(t *testing.T, got call, method string, want proto.Message) {
	t.Helper()
	if got.method != method {
		t.Fatalf("method %s, want %s", got.method, method)
	}
	// As the generated stub sends it, requests encoded ahead of their
	// call (lookups) included.
	if got.contentType != "application/grpc" {
		t.Fatalf("%s: content-type %q, want application/grpc", method, got.contentType)
	}
	mo := proto.MarshalOptions{Deterministic: true}
	gb, err := mo.Marshal(got.req)
	if err != nil {
		t.Fatal(err)
	}
	wb, err := mo.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gb, wb) {
		t.Fatalf("%s request:\n got %s\nwant %s", method, prototext.Format(got.req), prototext.Format(want))
	}
}

func oneCall(t *testing.T, f *fake) call {
	t.Helper()
	calls := f.take()
	if len(calls) != 1 {
		t.Fatalf("%d calls, want 1: %v", len(calls), calls)
	}
	return calls[0]
}

func TestDialCapabilitiesAndIdentity(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	caps := c.Capabilities()
	if !caps.Ready || !caps.RangedIO || caps.Mode != umbppb.StandaloneBackendMode_STANDALONE_BACKEND_LOCAL {
		t.Fatalf("capabilities %+v", caps)
	}
	if c.Endpoint() != f.endpoint {
		t.Fatalf("Endpoint %q", c.Endpoint())
	}
	if want := filepath.Join(f.dir, "n.fd.sock"); c.FDSocketPath() != want {
		t.Fatalf("FDSocketPath %q, want %q", c.FDSocketPath(), want)
	}
	if want := filepath.Join(f.dir, "n.grpc.sock"); c.SocketPath() != want {
		t.Fatalf("SocketPath %q, want %q", c.SocketPath(), want)
	}
	if s := c.State(); s != connectivity.Ready {
		t.Fatalf("State %v", s)
	}
	c2 := dial(t, f.endpoint)
	ids := map[string]bool{}
	for _, id := range []string{c.ClientID(), c2.ClientID(), newClientID(), newClientID()} {
		if ids[id] {
			t.Fatalf("client id %q repeated", id)
		}
		ids[id] = true
		if len(id) == 0 || len(id) > fdpass.MaxClientIDLen || !strings.HasPrefix(id, "umbp-go") {
			t.Fatalf("client id %q", id)
		}
		for _, r := range id {
			if r < 0x21 || r > 0x7e {
				t.Fatalf("client id %q has %q", id, r)
			}
		}
	}
	// Even the counter's last value keeps the id within the field.
	saved := idCounter.Load()
	idCounter.Store(^uint64(0) - 1)
	defer idCounter.Store(saved)
	if id := newClientID(); len(id) > fdpass.MaxClientIDLen {
		t.Fatalf("client id %q is %d bytes", id, len(id))
	}
	// Ping refreshes the capabilities.
	f.setHandler(func(_ context.Context, m string, _ proto.Message) (proto.Message, error) {
		if m == "Ping" {
			return &umbppb.PingResponse{Ready: true, DeploymentMode: umbppb.StandaloneBackendMode_STANDALONE_BACKEND_DISTRIBUTED}, nil
		}
		return nil, nil
	})
	caps, err := c.Ping(context.Background())
	if err != nil || caps.RangedIO || caps.Mode != umbppb.StandaloneBackendMode_STANDALONE_BACKEND_DISTRIBUTED {
		t.Fatalf("Ping = %+v, %v", caps, err)
	}
	if c.Capabilities() != caps {
		t.Fatalf("Capabilities %+v after Ping %+v", c.Capabilities(), caps)
	}
}

func TestSanitizeHost(t *testing.T) {
	for in, want := range map[string]string{
		"node-1.example.com": "node-1",
		"we ird\x00host":     "weirdhost",
		"":                   "",
	} {
		if got := sanitizeHost(in); got != want {
			t.Errorf("sanitizeHost(%q) = %q, want %q", in, got, want)
		}
	}
}

// Dial makes one attempt: a server that answers ready=false is refused at
// once, as unavailable, and the next Dial attaches once it is ready.
func TestDialOneAttempt(t *testing.T) {
	f := startFake(t)
	var pings atomic.Int32
	f.setHandler(func(_ context.Context, m string, _ proto.Message) (proto.Message, error) {
		if m == "Ping" && pings.Add(1) == 1 {
			return &umbppb.PingResponse{Ready: false}, nil
		}
		return nil, nil
	})
	_, err := Dial(context.Background(), Options{Endpoint: f.endpoint})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "ready=false") || pings.Load() != 1 {
		t.Fatalf("Dial to a server not ready: %v after %d pings", err, pings.Load())
	}
	c := dial(t, f.endpoint)
	if !c.Capabilities().Ready {
		t.Fatalf("%+v", c.Capabilities())
	}
}

// Dial says at once that there is no socket, without the endpoint (the
// caller names it).
func TestDialNoSocket(t *testing.T) {
	endpoint := "unix://" + filepath.Join(shortDir(t), "none.grpc.sock")
	start := time.Now()
	c, err := Dial(context.Background(), Options{Endpoint: endpoint})
	if err == nil {
		_ = c.Close()
		t.Fatal("Dial succeeded with nothing listening")
	}
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "no socket file") || strings.Contains(err.Error(), endpoint) {
		t.Fatalf("error %v: want errdefs.ErrUnavailable saying there is no socket file, without the endpoint", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Dial took %v", d)
	}
}

// A process that accepts and never answers holds Dial until its context
// ends, and Dial says what it saw.
func TestDialSilentServer(t *testing.T) {
	path := filepath.Join(shortDir(t), "n.grpc.sock")
	l := listenAt(t, path)
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	defer func() {
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Dial(ctx, Options{Endpoint: "unix://" + path})
	if !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "never answered") {
		t.Fatalf("error %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Dial took %v after its context ended", d)
	}
}

func TestDialInvalid(t *testing.T) {
	for _, opts := range []Options{
		{Endpoint: "relative.sock"},
		{Endpoint: "unix:///" + strings.Repeat("x", 120)},
	} {
		if _, err := Dial(context.Background(), opts); !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("Dial(%+v) = %v, want rpc.ErrInvalidArgument", opts, err)
		}
	}
}

// TestNoRedialAfterLoss: a Conn is the one transport Dial attached
// through. Once it is lost, gRPC's redials are refused without touching the
// socket, even with a server back at the path: calls fail as unavailable,
// and only a new Dial attaches to the new server.
func TestNoRedialAfterLoss(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	f.stop()
	if _, err := c.Ping(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Ping with the server down: %v", err)
	}
	if ok, err := c.Exists(context.Background(), "k"); ok || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Exists with the server down: %v, %v", ok, err)
	} else if st, _ := status.FromError(err); st.Code() != codes.Unavailable {
		t.Fatalf("status %v", st)
	}
	f.serve(t)
	fresh := dial(t, f.endpoint) // the server is back
	if _, err := fresh.Ping(context.Background()); err != nil {
		t.Fatalf("Ping on a new Conn: %v", err)
	}
	// gRPC asks for a transport again and again; each one is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // does not hang
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for from := c.redialsRefused.Load(); c.redialsRefused.Load() < from+2; {
		if s := c.cc.GetState(); s == connectivity.Ready {
			t.Fatal("the lost Conn redialled")
		}
		c.cc.Connect()
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("no redial within 30s (refused %d)", c.redialsRefused.Load())
		}
	}
	if _, err := c.Ping(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), errTransportLost.Error()) {
		t.Fatalf("Ping on the lost Conn with the server back: %v", err)
	}
	if n := c.Transports(); n != 1 {
		t.Fatalf("Transports = %d, want 1", n)
	}
}

// TestLookupsNotRedialledToANewServer: the lock-step lookups dial
// connections of their own, to the server Dial attached to only; once it is
// gone they fail as every call of the Conn does, even with a new server at
// the path, which they never reach.
func TestLookupsNotRedialledToANewServer(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	if c.lookups == nil {
		t.Fatal("no lock-step lookups by default")
	}
	ctx := context.Background()
	if _, errs := c.BatchExists(ctx, []string{"a", "b"}); errs != nil {
		t.Fatalf("BatchExists: %v", errs)
	}
	f.take()
	f.stop()
	f.serve(t) // a new server, a new socket at the same path
	for range 3 {
		ok, errs := c.BatchExists(ctx, []string{"a"})
		if len(errs) != 1 || !errors.Is(errs[0], errdefs.ErrUnavailable) || ok[0] {
			t.Fatalf("BatchExists with the server replaced: %v, %v", ok, errs)
		}
	}
	if n, err := c.BatchExistsConsecutive(ctx, []string{"a"}); n != 0 || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("BatchExistsConsecutive with the server replaced: %d, %v", n, err)
	}
	if calls := f.take(); len(calls) != 0 {
		t.Fatalf("the new server got %d calls from the old Conn: %v", len(calls), calls)
	}
	fresh := dial(t, f.endpoint)
	if _, errs := fresh.BatchExists(ctx, []string{"a"}); errs != nil {
		t.Fatalf("BatchExists on a new Conn: %v", errs)
	}
}

// TestLookupConnectionsShareThePidfd: the lock-step lookups' connections
// go to the server the Conn watches already; however many there are, the
// Conn holds one pidfd for it.
func TestLookupConnectionsShareThePidfd(t *testing.T) {
	f := startServerProcess(t, shortDir(t), -1)
	c := dial(t, f.endpoint)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 20 {
				if _, errs := c.BatchExists(ctx, []string{"a"}); errs != nil {
					t.Errorf("BatchExists: %v", errs)
					return
				}
			}
		})
	}
	wg.Wait()
	c.peers.mu.Lock()
	n := len(c.peers.fds)
	c.peers.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d pidfds held for one server, want 1", n)
	}
}

// TestLookupsNotQueued: with every lock-step lookup connection busy, a
// lookup goes through the gRPC channel at once rather than wait for one.
func TestLookupsNotQueued(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	release := make(chan struct{})
	var arrived sync.WaitGroup
	f.setHandler(func(ctx context.Context, method string, _ proto.Message) (proto.Message, error) {
		if method == "BatchExists" {
			arrived.Done()
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil, nil
	})
	n := h2call.MinDefaultMaxConns + 2 // above the connections this 2-core test opens
	if p := runtime.GOMAXPROCS(0); p > h2call.MinDefaultMaxConns {
		n = p + 2
	}
	arrived.Add(n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, errs := c.BatchExists(context.Background(), []string{"k"}); errs != nil {
				t.Errorf("BatchExists: %v", errs)
			}
		})
	}
	waited := make(chan struct{})
	go func() { arrived.Wait(); close(waited) }()
	select {
	case <-waited: // every one reached the server while the others were held
	case <-time.After(30 * time.Second): // does not hang
		t.Error("lookups queued behind busy lookup connections")
	}
	close(release)
	wg.Wait()
}

// TestGRPCLookups: with Options.GRPCLookups the lookups go through the
// gRPC channel, and the Conn dials nothing else.
func TestGRPCLookups(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint, func(o *Options) { o.GRPCLookups = true })
	if c.lookups != nil {
		t.Fatal("lock-step lookups with GRPCLookups")
	}
	if _, errs := c.BatchExists(context.Background(), []string{"a"}); errs != nil {
		t.Fatalf("BatchExists: %v", errs)
	}
	f.stop()
	if _, errs := c.BatchExists(context.Background(), []string{"a"}); len(errs) != 1 || !errors.Is(errs[0], errdefs.ErrUnavailable) {
		t.Fatalf("BatchExists with the server down: %v", errs)
	}
}

// TestRequestMapping checks the exact request every wrapper sends, and
// that none of them adds a deadline.
func TestRequestMapping(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint, func(o *Options) {
		o.NodeID, o.NodeAddress, o.Tags = "node7", "10.0.0.7:1234", []string{"a", "b"}
	})
	f.take()
	ctx := context.Background()
	cid := c.ClientID()
	seg := Segment{RegionBase: 0x7f0000000000, Offset: 4096, Size: 512}

	check := func(name string, ok bool, err error) {
		t.Helper()
		if !ok || err != nil {
			t.Fatalf("%s = %v, %v", name, ok, err)
		}
	}
	checkAll := func(name string, got []bool, err error, n int) {
		t.Helper()
		if err != nil || len(got) != n {
			t.Fatalf("%s = %v, %v", name, got, err)
		}
		for i, ok := range got {
			if !ok {
				t.Fatalf("%s[%d] false", name, i)
			}
		}
	}

	ok, err := c.Put(ctx, "k1", seg)
	check("Put", ok, err)
	wantReq(t, oneCall(t, f), "Put", &umbppb.PutRequest{Key: "k1", ClientId: cid, ShmOffset: 4096, Size: 512, RegionBase: 0x7f0000000000})

	ok, err = c.Get(ctx, "k1", seg)
	check("Get", ok, err)
	wantReq(t, oneCall(t, f), "Get", &umbppb.GetRequest{Key: "k1", ClientId: cid, ShmOffset: 4096, Size: 512, RegionBase: 0x7f0000000000})

	segs := []Segment{seg, {RegionBase: 0x1000, Offset: 0, Size: 1}}
	got, err := joined(c.BatchPut(ctx, []string{"a", "b"}, segs))
	checkAll("BatchPut", got, err, 2)
	wantReq(t, oneCall(t, f), "BatchPut", &umbppb.BatchDataRequest{
		Keys: []string{"a", "b"}, ClientId: cid,
		ShmOffsets: []uint64{4096, 0}, Sizes: []uint64{512, 1}, RegionBases: []uint64{0x7f0000000000, 0x1000},
	})
	got, err = joined(c.BatchGet(ctx, []string{"a", "b"}, segs))
	checkAll("BatchGet", got, err, 2)
	wantReq(t, oneCall(t, f), "BatchGet", &umbppb.BatchDataRequest{
		Keys: []string{"a", "b"}, ClientId: cid,
		ShmOffsets: []uint64{4096, 0}, Sizes: []uint64{512, 1}, RegionBases: []uint64{0x7f0000000000, 0x1000},
	})

	objs := []Object{
		{Key: "x", Size: 30, Ranges: []Range{
			{RegionBase: 0x1000, Offset: 0, Size: 10, ObjectOffset: 0},
			{RegionBase: 0x2000, Offset: 100, Size: 20, ObjectOffset: 10},
		}},
		{Key: "y", Size: 5, Ranges: []Range{{RegionBase: 0x1000, Offset: 50, Size: 5, ObjectOffset: 0}}},
	}
	got, err = joined(c.BatchPutRanges(ctx, objs))
	checkAll("BatchPutRanges", got, err, 2)
	wantReq(t, oneCall(t, f), "BatchPutRanges", &umbppb.BatchRangeDataRequest{
		Keys: []string{"x", "y"}, ClientId: cid, RangeCounts: []uint32{2, 1},
		ShmOffsets: []uint64{0, 100, 50}, RegionBases: []uint64{0x1000, 0x2000, 0x1000},
		Sizes: []uint64{10, 20, 5}, ObjectOffsets: []uint64{0, 10, 0}, ObjectSizes: []uint64{30, 5},
	})
	got, err = joined(c.BatchGetRanges(ctx, objs))
	checkAll("BatchGetRanges", got, err, 2)
	gr := oneCall(t, f)
	wantReq(t, gr, "BatchGetRanges", &umbppb.BatchRangeDataRequest{
		Keys: []string{"x", "y"}, ClientId: cid, RangeCounts: []uint32{2, 1},
		ShmOffsets: []uint64{0, 100, 50}, RegionBases: []uint64{0x1000, 0x2000, 0x1000},
		Sizes: []uint64{10, 20, 5}, ObjectOffsets: []uint64{0, 10, 0},
	})
	if n := len(gr.req.(*umbppb.BatchRangeDataRequest).ObjectSizes); n != 0 {
		t.Fatalf("get sent %d object sizes", n)
	}

	ok, err = c.Exists(ctx, "k1")
	check("Exists", ok, err)
	wantReq(t, oneCall(t, f), "Exists", &umbppb.KeyRequest{Key: "k1"})
	got, err = joined(c.BatchExists(ctx, []string{"a", "b", "c"}))
	checkAll("BatchExists", got, err, 3)
	wantReq(t, oneCall(t, f), "BatchExists", &umbppb.BatchKeysRequest{Keys: []string{"a", "b", "c"}})
	n, err := c.BatchExistsConsecutive(ctx, []string{"a", "b", "c"})
	if n != 3 || err != nil {
		t.Fatalf("BatchExistsConsecutive = %d, %v", n, err)
	}
	wantReq(t, oneCall(t, f), "BatchExistsConsecutive", &umbppb.BatchKeysRequest{Keys: []string{"a", "b", "c"}})
	ok, err = c.Clear(ctx)
	check("Clear", ok, err)
	wantReq(t, oneCall(t, f), "Clear", &umbppb.Empty{})
	ok, err = c.Flush(ctx)
	check("Flush", ok, err)
	wantReq(t, oneCall(t, f), "Flush", &umbppb.Empty{})

	// Host registration: the fd handoff, then RegisterMemory.
	fd, mem := memfd(t, 1<<16)
	if err := c.RegisterHost(ctx, fd, addr(mem), 1<<16); err != nil {
		t.Fatalf("RegisterHost: %v", err)
	}
	if regs := f.registrations(); len(regs) != 1 || regs[0] != (fdpass.Registration{ClientID: cid, WorkerBase: uint64(addr(mem)), Size: 1 << 16}) {
		t.Fatalf("fd handoff registrations %+v", regs)
	}
	wantReq(t, oneCall(t, f), "RegisterMemory", &umbppb.RegisterMemoryRequest{
		ClientId: cid, WorkerBase: uint64(addr(mem)), Size: 1 << 16,
		WorkerNodeId: "node7", WorkerNodeAddress: "10.0.0.7:1234", Tags: []string{"a", "b"},
		Kind: umbppb.MemoryKind_MEMORY_KIND_HOST_SHM,
	})

	var h [IPCHandleSize]byte
	for i := range h {
		h[i] = byte(i + 1)
	}
	if err := c.RegisterGPU(ctx, GPURegion{Device: 3, Base: 0x7000_0000_1000, Size: 8192, Handle: h, IPCOffset: 0x1000, AllocBase: 0x7000_0000_0000}); err != nil {
		t.Fatalf("RegisterGPU: %v", err)
	}
	wantReq(t, oneCall(t, f), "RegisterMemory", &umbppb.RegisterMemoryRequest{
		ClientId: cid, WorkerBase: 0x7000_0000_1000, Size: 8192,
		WorkerNodeId: "node7", WorkerNodeAddress: "10.0.0.7:1234", Tags: []string{"a", "b"},
		Kind: umbppb.MemoryKind_MEMORY_KIND_GPU_IPC, DeviceId: 3, IpcHandle: h[:], IpcOffset: 0x1000, AllocBase: 0x7000_0000_0000,
	})
	if err := c.Deregister(ctx); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	wantReq(t, oneCall(t, f), "DeregisterMemory", &umbppb.DeregisterMemoryRequest{ClientId: cid})

	ok, err = c.ReportExternalKvBlocks(ctx, []string{"h1", "h2"}, umbppb.TierType_TIER_DRAM)
	check("ReportExternalKvBlocks", ok, err)
	wantReq(t, oneCall(t, f), "ReportExternalKvBlocks", &umbppb.StandaloneExternalKvMutationRequest{Hashes: []string{"h1", "h2"}, Tier: umbppb.TierType_TIER_DRAM, ClientId: cid})
	ok, err = c.RevokeExternalKvBlocks(ctx, []string{"h1"}, umbppb.TierType_TIER_SSD)
	check("RevokeExternalKvBlocks", ok, err)
	wantReq(t, oneCall(t, f), "RevokeExternalKvBlocks", &umbppb.StandaloneExternalKvMutationRequest{Hashes: []string{"h1"}, Tier: umbppb.TierType_TIER_SSD, ClientId: cid})
	ok, err = c.RevokeAllExternalKvBlocksAtTier(ctx, umbppb.TierType_TIER_HBM)
	check("RevokeAllExternalKvBlocksAtTier", ok, err)
	wantReq(t, oneCall(t, f), "RevokeAllExternalKvBlocksAtTier", &umbppb.StandaloneExternalKvTierRequest{Tier: umbppb.TierType_TIER_HBM, ClientId: cid})

	f.setHandler(func(_ context.Context, m string, _ proto.Message) (proto.Message, error) {
		if m == "MatchExternalKv" {
			return &umbppb.StandaloneMatchExternalKvResponse{Matches: []*umbppb.StandaloneExternalKvMatch{{
				NodeId: "n1", PeerAddress: "p1",
				HashesByTier: []*umbppb.TierHashes{{Tier: umbppb.TierType_TIER_DRAM, Hashes: []string{"h2"}}},
			}}}, nil
		}
		return nil, nil
	})
	matches, err := c.MatchExternalKv(ctx, []string{"h1", "h2"}, true)
	if err != nil || len(matches) != 1 || matches[0].NodeID != "n1" || matches[0].PeerAddress != "p1" ||
		len(matches[0].HashesByTier) != 1 || matches[0].HashesByTier[0].Tier != umbppb.TierType_TIER_DRAM ||
		fmt.Sprint(matches[0].HashesByTier[0].Hashes) != "[h2]" {
		t.Fatalf("MatchExternalKv = %+v, %v", matches, err)
	}
	wantReq(t, oneCall(t, f), "MatchExternalKv", &umbppb.StandaloneMatchExternalKvRequest{Hashes: []string{"h1", "h2"}, CountAsHit: true, ClientId: cid})
	counts, err := c.GetExternalKvHitCounts(ctx, []string{"h1", "h2"})
	if err != nil || fmt.Sprint(counts) != "[{h1 0} {h2 1}]" {
		t.Fatalf("GetExternalKvHitCounts = %v, %v", counts, err)
	}
	wantReq(t, oneCall(t, f), "GetExternalKvHitCounts", &umbppb.StandaloneExternalKvHitCountsRequest{Hashes: []string{"h1", "h2"}, ClientId: cid})

	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	wantReq(t, oneCall(t, f), "Ping", &umbppb.Empty{})
}

// TestNoDeadlineAdded: data calls carry the caller's context as it is.
func TestNoDeadlineAdded(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	f.take()
	ctx := context.Background()
	seg := Segment{RegionBase: 0x1000, Size: 1}
	_, _ = c.Put(ctx, "k", seg)
	_, _ = c.Get(ctx, "k", seg)
	_, _ = joined(c.BatchPut(ctx, []string{"k"}, []Segment{seg}))
	_, _ = joined(c.BatchGet(ctx, []string{"k"}, []Segment{seg}))
	o := []Object{{Key: "k", Size: 1, Ranges: []Range{{RegionBase: 0x1000, Size: 1}}}}
	_, _ = joined(c.BatchPutRanges(ctx, o))
	_, _ = joined(c.BatchGetRanges(ctx, o))
	_, _ = joined(c.BatchExists(ctx, []string{"k"}))
	calls := f.take()
	if len(calls) != 7 {
		t.Fatalf("%d calls", len(calls))
	}
	for _, cl := range calls {
		if cl.deadline {
			t.Errorf("%s carried a deadline", cl.method)
		}
	}
}

// TestGoldenWireBytes encodes requests by hand from the field numbers of
// the protocol and compares them with what the server received.
func TestGoldenWireBytes(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	f.take()
	ctx := context.Background()
	cid := c.ClientID()
	str := func(b []byte, num protowire.Number, s string) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	u64 := func(b []byte, num protowire.Number, v uint64) []byte {
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, v)
	}
	packed := func(b []byte, num protowire.Number, vs ...uint64) []byte {
		var p []byte
		for _, v := range vs {
			p = protowire.AppendVarint(p, v)
		}
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendBytes(b, p)
	}
	got := func() []byte {
		t.Helper()
		b, err := proto.Marshal(oneCall(t, f).req)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	// PutRequest {1 key; 2 client_id; 3 shm_offset; 4 size; 5 region_base}
	_, _ = c.Put(ctx, "key", Segment{RegionBase: 0x10000, Offset: 300, Size: 64})
	want := str(nil, 1, "key")
	want = str(want, 2, cid)
	want = u64(want, 3, 300)
	want = u64(want, 4, 64)
	want = u64(want, 5, 0x10000)
	if g := got(); !bytes.Equal(g, want) {
		t.Fatalf("PutRequest\n got %x\nwant %x", g, want)
	}

	// BatchRangeDataRequest {1 keys; 2 client_id; 3 range_counts; 4 shm_offsets;
	// 5 region_bases; 6 sizes; 7 object_offsets; 8 object_sizes}
	objs := []Object{{Key: "o", Size: 48, Ranges: []Range{
		{RegionBase: 0x10000, Offset: 0, Size: 16, ObjectOffset: 0},
		{RegionBase: 0x20000, Offset: 200, Size: 32, ObjectOffset: 16},
	}}}
	_, _ = joined(c.BatchPutRanges(ctx, objs))
	body := func() []byte {
		b := str(nil, 1, "o")
		b = str(b, 2, cid)
		b = packed(b, 3, 2)
		b = packed(b, 4, 0, 200)
		b = packed(b, 5, 0x10000, 0x20000)
		b = packed(b, 6, 16, 32)
		return packed(b, 7, 0, 16)
	}
	want = packed(body(), 8, 48)
	if g := got(); !bytes.Equal(g, want) {
		t.Fatalf("BatchPutRanges\n got %x\nwant %x", g, want)
	}
	_, _ = joined(c.BatchGetRanges(ctx, objs))
	if g, want := got(), body(); !bytes.Equal(g, want) {
		t.Fatalf("BatchGetRanges\n got %x\nwant %x", g, want)
	}

	// RegisterMemoryRequest {1 client_id; 2 worker_base; 3 size; 4 node id;
	// 5 node address; 6 tags; 7 kind; 8 device_id; 9 ipc_handle; 10 ipc_offset; 11 alloc_base}
	var h [64]byte
	h[0], h[63] = 0xaa, 0xbb
	_ = c.RegisterGPU(ctx, GPURegion{Device: 1, Base: 0x5000, Size: 4096, Handle: h, IPCOffset: 0x1000, AllocBase: 0x4000})
	want = str(nil, 1, cid)
	want = u64(want, 2, 0x5000)
	want = u64(want, 3, 4096)
	want = u64(want, 7, 1)
	want = u64(want, 8, 1)
	want = protowire.AppendTag(want, 9, protowire.BytesType)
	want = protowire.AppendBytes(want, h[:])
	want = u64(want, 10, 0x1000)
	want = u64(want, 11, 0x4000)
	if g := got(); !bytes.Equal(g, want) {
		t.Fatalf("RegisterMemoryRequest\n got %x\nwant %x", g, want)
	}
}

func TestRefusals(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	ctx := context.Background()
	const reason = "unregistered or out-of-range shm buffer"
	f.setHandler(func(_ context.Context, m string, _ proto.Message) (proto.Message, error) {
		switch m {
		case "Put", "Clear", "Flush", "Exists", "ReportExternalKvBlocks":
			return &umbppb.BoolResponse{Error: reason}, nil
		case "Get":
			return &umbppb.BoolResponse{}, nil
		case "RegisterMemory":
			return &umbppb.BoolResponse{Error: "fd handoff registration was not found"}, nil
		}
		return nil, nil
	})
	seg := Segment{RegionBase: 0x1000, Size: 1}
	var re *RefusedError
	ok, err := c.Put(ctx, "k", seg)
	if ok || !errors.Is(err, errdefs.ErrRefused) || !errors.As(err, &re) || re.Reason != reason || re.Op != "Put" {
		t.Fatalf("Put = %v, %v", ok, err)
	}
	if ok, err := c.Get(ctx, "k", seg); ok || err != nil {
		t.Fatalf("Get of a plain false = %v, %v", ok, err)
	}
	for name, fn := range map[string]func() (bool, error){
		"Exists": func() (bool, error) { return c.Exists(ctx, "k") },
		"Clear":  func() (bool, error) { return c.Clear(ctx) },
		"Flush":  func() (bool, error) { return c.Flush(ctx) },
		"Report": func() (bool, error) { return c.ReportExternalKvBlocks(ctx, []string{"h"}, umbppb.TierType_TIER_DRAM) },
	} {
		if ok, err := fn(); ok || !errors.Is(err, errdefs.ErrRefused) || !strings.Contains(err.Error(), reason) {
			t.Errorf("%s = %v, %v", name, ok, err)
		}
	}
	var h [64]byte
	err = c.RegisterGPU(ctx, GPURegion{Base: 0x2000, AllocBase: 0x2000, Size: 1, Handle: h})
	if !errors.As(err, &re) || re.Reason != "fd handoff registration was not found" {
		t.Fatalf("RegisterGPU = %v", err)
	}

	// A rejected fd handoff is a refusal with no text, and no RegisterMemory follows.
	f.mu.Lock()
	f.fdReply = fdpass.StatusFailed
	f.mu.Unlock()
	f.take()
	fd, mem := memfd(t, 4096)
	err = c.RegisterHost(ctx, fd, addr(mem), 4096)
	if !errors.Is(err, errdefs.ErrRefused) || !errors.Is(err, fdpass.ErrRejected) {
		t.Fatalf("RegisterHost with a rejected handoff = %v", err)
	}
	if calls := f.take(); len(calls) != 0 {
		t.Fatalf("calls after a rejected handoff: %v", calls)
	}
}

func TestHostValidation(t *testing.T) {
	f := startFake(t)
	checked := 0
	c := dial(t, f.endpoint, func(o *Options) {
		o.PeerCheck = func(*net.UnixConn) error { checked++; return errors.New("untrusted peer") }
	})
	f.take()
	ctx := context.Background()
	fd, mem := memfd(t, 4096)
	base := addr(mem)

	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	ro, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ro)

	for name, try := range map[string]func() error{
		"lying size": func() error { return c.RegisterHost(ctx, fd, base, 8192) },
		"zero size":  func() error { return c.RegisterHost(ctx, fd, base, 0) },
		"zero base":  func() error { return c.RegisterHost(ctx, fd, 0, 4096) },
		"bad fd":     func() error { return c.RegisterHost(ctx, -1, base, 4096) },
		"pipe":       func() error { return c.RegisterHost(ctx, p[0], base, 1) },
		"read-only":  func() error { return c.RegisterHost(ctx, ro, base, 4096) },
		"gpu offset": func() error {
			return c.RegisterGPU(ctx, GPURegion{Base: 0x2000, AllocBase: 0x1000, IPCOffset: 0, Size: 1})
		},
		"gpu zero alloc": func() error { return c.RegisterGPU(ctx, GPURegion{Base: 0x2000, Size: 1}) },
		"gpu device": func() error {
			return c.RegisterGPU(ctx, GPURegion{Device: -1, Base: 0x2000, AllocBase: 0x2000, Size: 1})
		},
		"gpu size": func() error { return c.RegisterGPU(ctx, GPURegion{Base: 0x2000, AllocBase: 0x2000}) },
	} {
		if err := try(); !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("%s: %v, want rpc.ErrInvalidArgument", name, err)
		}
	}
	if checked != 0 || len(f.registrations()) != 0 || len(f.take()) != 0 {
		t.Fatalf("invalid registrations reached the server")
	}
	// The peer check runs before the descriptor leaves.
	if err := c.RegisterHost(ctx, fd, base, 4096); err == nil || !strings.Contains(err.Error(), "untrusted peer") {
		t.Fatalf("RegisterHost with a failing peer check = %v", err)
	}
	if checked != 1 || len(f.registrations()) != 0 || len(f.take()) != 0 {
		t.Fatalf("peer check %d, registrations %v", checked, f.registrations())
	}
}

func TestHandoffUnavailable(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	_ = f.fdLis.Close()
	fd, mem := memfd(t, 4096)
	if err := c.RegisterHost(context.Background(), fd, addr(mem), 4096); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("RegisterHost without an fd socket = %v", err)
	}
}

func TestValidation(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	f.take()
	ctx := context.Background()
	good := Segment{RegionBase: 0x1000, Size: 1}
	batches := map[string]func() ([]bool, error){
		"BatchPut length":  func() ([]bool, error) { return joined(c.BatchPut(ctx, []string{"a", "b"}, []Segment{good})) },
		"BatchExists utf8": func() ([]bool, error) { return joined(c.BatchExists(ctx, []string{"a", "\xff"})) },
	}
	for name, fn := range batches {
		got, err := fn()
		if !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("%s: %v, want rpc.ErrInvalidArgument", name, err)
		}
		if len(got) == 0 {
			t.Errorf("%s: %d results", name, len(got))
		}
		for _, ok := range got {
			if ok {
				t.Errorf("%s: a true result", name)
			}
		}
	}
	singles := map[string]func() error{
		"Put empty key": func() error { _, err := c.Put(ctx, "", good); return err },
		"Get size 0":    func() error { _, err := c.Get(ctx, "k", Segment{RegionBase: 1}); return err },
		"Exists empty":  func() error { _, err := c.Exists(ctx, ""); return err },
		"Consecutive":   func() error { _, err := c.BatchExistsConsecutive(ctx, []string{""}); return err },
		"Match utf8":    func() error { _, err := c.MatchExternalKv(ctx, []string{"\xff"}, false); return err },
	}
	for name, fn := range singles {
		if err := fn(); !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("%s: %v, want rpc.ErrInvalidArgument", name, err)
		}
	}
	if calls := f.take(); len(calls) != 0 {
		t.Fatalf("invalid requests reached the server: %v", calls)
	}
	// Empty batches need no request.
	if got, err := joined(c.BatchExists(ctx, nil)); len(got) != 0 || err != nil {
		t.Fatalf("BatchExists(nil) = %v, %v", got, err)
	}
	if got, err := joined(c.BatchPutRanges(ctx, nil)); len(got) != 0 || err != nil {
		t.Fatalf("BatchPutRanges(nil) = %v, %v", got, err)
	}
	if calls := f.take(); len(calls) != 0 {
		t.Fatalf("empty batches reached the server: %v", calls)
	}
}

// setLimit lowers the request limit for one test.
func setLimit(t *testing.T, n int) {
	old := maxRequestBytes
	maxRequestBytes = n
	t.Cleanup(func() { maxRequestBytes = old })
}

func keysN(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%04d", i)
	}
	return keys
}

// parityHandler answers each batch key true when its number is even.
func parityHandler(_ context.Context, m string, req proto.Message) (proto.Message, error) {
	var keys []string
	switch r := req.(type) {
	case *umbppb.BatchKeysRequest:
		if m == "BatchExistsConsecutive" {
			return nil, nil
		}
		keys = r.Keys
	case *umbppb.BatchDataRequest:
		keys = r.Keys
	case *umbppb.BatchRangeDataRequest:
		keys = r.Keys
	default:
		return nil, nil
	}
	ok := make([]bool, len(keys))
	for i, k := range keys {
		var n int
		_, _ = fmt.Sscanf(k, "key-%d", &n)
		ok[i] = n%2 == 0
	}
	return &umbppb.BatchBoolResponse{Ok: ok}, nil
}

func TestBatchSplit(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	f.take()
	f.setHandler(parityHandler)
	const limit = 300
	setLimit(t, limit)
	ctx := context.Background()
	keys := keysN(100)
	segs := make([]Segment, len(keys))
	objs := make([]Object, len(keys))
	for i := range segs {
		segs[i] = Segment{RegionBase: 0x7f00_0000_0000, Offset: uint64(i) << 20, Size: 1 << 20}
		objs[i] = Object{Key: keys[i], Size: 1 << 21, Ranges: []Range{
			{RegionBase: 0x7f00_0000_0000, Offset: uint64(i) << 21, Size: 1 << 20},
			{RegionBase: 0x7e00_0000_0000, Offset: uint64(i) << 20, Size: 1 << 20, ObjectOffset: 1 << 20},
		}}
	}
	for name, fn := range map[string]func() ([]bool, error){
		"BatchExists":    func() ([]bool, error) { return joined(c.BatchExists(ctx, keys)) },
		"BatchPut":       func() ([]bool, error) { return joined(c.BatchPut(ctx, keys, segs)) },
		"BatchGet":       func() ([]bool, error) { return joined(c.BatchGet(ctx, keys, segs)) },
		"BatchPutRanges": func() ([]bool, error) { return joined(c.BatchPutRanges(ctx, objs)) },
		"BatchGetRanges": func() ([]bool, error) { return joined(c.BatchGetRanges(ctx, objs)) },
	} {
		got, err := fn()
		if err != nil || len(got) != len(keys) {
			t.Fatalf("%s = %d results, %v", name, len(got), err)
		}
		for i, ok := range got {
			if ok != (i%2 == 0) {
				t.Fatalf("%s[%d] = %v", name, i, ok)
			}
		}
		calls := f.take()
		if len(calls) < 3 {
			t.Fatalf("%s: %d requests, want a split", name, len(calls))
		}
		// Ranged parts go up to partsInFlight at a time: take the requests
		// in the order of the entries they carry, not of their arrival.
		first := func(m proto.Message) string {
			switch r := m.(type) {
			case *umbppb.BatchKeysRequest:
				return r.Keys[0]
			case *umbppb.BatchDataRequest:
				return r.Keys[0]
			case *umbppb.BatchRangeDataRequest:
				return r.Keys[0]
			}
			return ""
		}
		slices.SortStableFunc(calls, func(a, b call) int { return strings.Compare(first(a.req), first(b.req)) })
		var sent []string
		var sentRanges, sentSizes int
		for i, cl := range calls {
			size := proto.Size(cl.req)
			if size > limit {
				t.Fatalf("%s request %d is %d bytes, over %d", name, i, size, limit)
			}
			// Every request but the last is reasonably full.
			if i < len(calls)-1 && size < limit/2 {
				t.Fatalf("%s request %d is only %d bytes", name, i, size)
			}
			switch r := cl.req.(type) {
			case *umbppb.BatchKeysRequest:
				sent = append(sent, r.Keys...)
			case *umbppb.BatchDataRequest:
				sent = append(sent, r.Keys...)
				for j := range r.Keys {
					k := len(sent) - len(r.Keys) + j
					if r.ShmOffsets[j] != segs[k].Offset || r.Sizes[j] != segs[k].Size || r.RegionBases[j] != segs[k].RegionBase {
						t.Fatalf("%s: entry %d mismatched", name, k)
					}
				}
			case *umbppb.BatchRangeDataRequest:
				sent = append(sent, r.Keys...)
				sentRanges += len(r.ShmOffsets)
				sentSizes += len(r.ObjectSizes)
				if len(r.RangeCounts) != len(r.Keys) || len(r.RegionBases) != len(r.ShmOffsets) ||
					len(r.Sizes) != len(r.ShmOffsets) || len(r.ObjectOffsets) != len(r.ShmOffsets) {
					t.Fatalf("%s: inconsistent request %s", name, prototext.Format(r))
				}
			}
		}
		if fmt.Sprint(sent) != fmt.Sprint(keys) {
			t.Fatalf("%s sent keys %v", name, sent)
		}
		if strings.HasSuffix(name, "Ranges") {
			wantSizes := 0
			if name == "BatchPutRanges" {
				wantSizes = len(keys)
			}
			if sentRanges != 2*len(keys) || sentSizes != wantSizes {
				t.Fatalf("%s sent %d ranges, %d object sizes", name, sentRanges, sentSizes)
			}
		}
	}

	// One entry too large for any request: refused locally.
	big := strings.Repeat("k", limit)
	if got, err := joined(c.BatchExists(ctx, []string{"a", big})); !errors.Is(err, rpc.ErrInvalidArgument) || len(got) != 2 {
		t.Fatalf("oversize key: %v, %v", got, err)
	}
	if _, err := c.Exists(ctx, big); !errors.Is(err, rpc.ErrInvalidArgument) {
		t.Fatalf("oversize Exists: %v", err)
	}
	if calls := f.take(); len(calls) != 0 {
		t.Fatalf("oversize requests sent: %d", len(calls))
	}
}

func TestBatchExistsConsecutiveSplit(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	setLimit(t, 100)
	keys := keysN(40)
	present := 23
	f.setHandler(func(_ context.Context, m string, req proto.Message) (proto.Message, error) {
		if m != "BatchExistsConsecutive" {
			return nil, nil
		}
		n := 0
		for _, k := range req.(*umbppb.BatchKeysRequest).Keys {
			var i int
			_, _ = fmt.Sscanf(k, "key-%d", &i)
			if i >= present {
				break
			}
			n++
		}
		return &umbppb.CountResponse{Count: uint64(n)}, nil
	})
	f.take()
	n, err := c.BatchExistsConsecutive(context.Background(), keys)
	if n != present || err != nil {
		t.Fatalf("BatchExistsConsecutive = %d, %v", n, err)
	}
	calls := f.take()
	if len(calls) < 2 {
		t.Fatalf("%d requests", len(calls))
	}
	// It stops at the first chunk with a miss.
	last := calls[len(calls)-1].req.(*umbppb.BatchKeysRequest).Keys
	if first := last[0]; first > keys[present] {
		t.Fatalf("asked beyond the first miss: chunk starts at %s", first)
	}
	// A count above the chunk's length is a bad reply.
	f.setHandler(func(_ context.Context, m string, _ proto.Message) (proto.Message, error) {
		return &umbppb.CountResponse{Count: 1000}, nil
	})
	if _, err := c.BatchExistsConsecutive(context.Background(), keys[:2]); !errors.Is(err, rpc.ErrBadReply) {
		t.Fatalf("oversize count: %v", err)
	}
}

func TestWrongLengthAndChunkFailures(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	ctx := context.Background()

	// Unsplit: too few and too many results.
	for _, n := range []int{2, 4, 0} {
		f.setHandler(func(context.Context, string, proto.Message) (proto.Message, error) {
			return &umbppb.BatchBoolResponse{Ok: make([]bool, n)}, nil
		})
		got, err := joined(c.BatchExists(ctx, []string{"a", "b", "c"}))
		if !errors.Is(err, rpc.ErrBadReply) || len(got) != 3 {
			t.Fatalf("%d results: %v, %v", n, got, err)
		}
	}

	// Split: the second chunk has the wrong length, the third fails; the
	// others still answer.
	setLimit(t, 100)
	keys := keysN(60)
	var chunk atomic.Int32
	f.setHandler(func(_ context.Context, _ string, req proto.Message) (proto.Message, error) {
		r := req.(*umbppb.BatchKeysRequest)
		switch chunk.Add(1) {
		case 2:
			return &umbppb.BatchBoolResponse{Ok: []bool{true}}, nil
		case 3:
			return nil, status.Error(codes.Internal, "boom")
		}
		ok := make([]bool, len(r.Keys))
		for i := range ok {
			ok[i] = true
		}
		return &umbppb.BatchBoolResponse{Ok: ok}, nil
	})
	f.take()
	got, errs := c.BatchExists(ctx, keys)
	err := Joined(errs)
	calls := f.take()
	if len(calls) < 4 || len(got) != len(keys) {
		t.Fatalf("%d requests, %d results", len(calls), len(got))
	}
	if !errors.Is(err, rpc.ErrBadReply) || status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error %v", err)
	}
	i := 0
	for ci, cl := range calls {
		for range cl.req.(*umbppb.BatchKeysRequest).Keys {
			if want := ci != 1 && ci != 2; got[i] != want {
				t.Fatalf("result %d (chunk %d) = %v", i, ci, got[i])
			}
			// Each entry's error is its own chunk's.
			switch e := errs[i]; ci {
			case 1:
				if !errors.Is(e, rpc.ErrBadReply) || status.Code(e) == codes.Internal {
					t.Fatalf("errs[%d] in the short-reply chunk = %v", i, e)
				}
			case 2:
				if status.Code(e) != codes.Internal {
					t.Fatalf("errs[%d] in the failed chunk = %v", i, e)
				}
			default:
				if e != nil {
					t.Fatalf("errs[%d] in an answered chunk = %v", i, e)
				}
			}
			i++
		}
	}
}

func TestErrorClassification(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	ctx := context.Background()
	for _, tc := range []struct {
		code codes.Code
		want error
	}{
		{codes.Unavailable, errdefs.ErrUnavailable},
		{codes.Unimplemented, rpc.ErrUnimplemented},
		{codes.Internal, nil},
		{codes.ResourceExhausted, nil},
	} {
		f.setHandler(func(context.Context, string, proto.Message) (proto.Message, error) {
			return nil, status.Error(tc.code, "injected")
		})
		_, err := c.Get(ctx, "k", Segment{RegionBase: 1, Size: 1})
		if err == nil {
			t.Fatalf("%v: no error", tc.code)
		}
		if st, ok := status.FromError(err); !ok || st.Code() != tc.code {
			t.Errorf("%v: status %v", tc.code, st)
		}
		for _, s := range []error{errdefs.ErrUnavailable, rpc.ErrUnimplemented, errdefs.ErrRefused, rpc.ErrBadReply, rpc.ErrInvalidArgument, errdefs.ErrClosed} {
			if errors.Is(err, s) != (s == tc.want) {
				t.Errorf("%v: errors.Is(%v) = %v", tc.code, s, !(s == tc.want))
			}
		}
	}
}

func TestV1ServerRangedUnimplemented(t *testing.T) {
	f := startFakeVersion(t, 1)
	c := dial(t, f.endpoint)
	if c.Capabilities().RangedIO {
		t.Fatal("v1 server with ranged I/O")
	}
	o := []Object{{Key: "k", Size: 1, Ranges: []Range{{RegionBase: 0x1000, Size: 1}}}}
	for name, fn := range map[string]func() ([]bool, error){
		"BatchPutRanges": func() ([]bool, error) { return joined(c.BatchPutRanges(context.Background(), o)) },
		"BatchGetRanges": func() ([]bool, error) { return joined(c.BatchGetRanges(context.Background(), o)) },
	} {
		got, err := fn()
		if !errors.Is(err, rpc.ErrUnimplemented) || len(got) != 1 || got[0] {
			t.Errorf("%s = %v, %v", name, got, err)
		}
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("%s status %v", name, status.Code(err))
		}
	}
}

func TestContextHonoured(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	f.setHandler(func(ctx context.Context, m string, _ proto.Message) (proto.Message, error) {
		if m == "Ping" {
			return nil, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	got, err := joined(c.BatchGet(ctx, []string{"a"}, []Segment{{RegionBase: 1, Size: 1}}))
	if !errors.Is(err, context.Canceled) || len(got) != 1 || got[0] {
		t.Fatalf("BatchGet = %v, %v", got, err)
	}
	if status.Code(err) != codes.Canceled {
		t.Fatalf("status %v", status.Code(err))
	}
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Exists(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exists = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cancelled calls took %v", d)
	}
	// A context that already ended sends nothing useful and says so.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := c.Put(ctx, "a", Segment{RegionBase: 1, Size: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a cancelled context = %v", err)
	}
}

func TestClose(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	started := make(chan struct{})
	f.setHandler(func(ctx context.Context, m string, _ proto.Message) (proto.Message, error) {
		if m == "BatchPut" {
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return nil, nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := joined(c.BatchPut(context.Background(), []string{"a"}, []Segment{{RegionBase: 1, Size: 1}}))
		done <- err
	}()
	<-started
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-done; !errors.Is(err, errdefs.ErrClosed) || !errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, rpc.ErrNotSent) {
		t.Fatalf("in-flight BatchPut after Close = %v, want errdefs.ErrClosed and errdefs.ErrUnavailable: it was sent", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := context.Background()
	seg := Segment{RegionBase: 1, Size: 1}
	o := []Object{{Key: "k", Size: 1, Ranges: []Range{{RegionBase: 1, Size: 1}}}}
	fd, mem := memfd(t, 4096)
	calls := map[string]func() error{
		"Ping":           func() error { _, err := c.Ping(ctx); return err },
		"Put":            func() error { _, err := c.Put(ctx, "k", seg); return err },
		"Get":            func() error { _, err := c.Get(ctx, "k", seg); return err },
		"BatchPut":       func() error { _, err := joined(c.BatchPut(ctx, []string{"k"}, []Segment{seg})); return err },
		"BatchGet":       func() error { _, err := joined(c.BatchGet(ctx, []string{"k"}, []Segment{seg})); return err },
		"BatchPutRanges": func() error { _, err := joined(c.BatchPutRanges(ctx, o)); return err },
		"BatchGetRanges": func() error { _, err := joined(c.BatchGetRanges(ctx, o)); return err },
		"Exists":         func() error { _, err := c.Exists(ctx, "k"); return err },
		"BatchExists":    func() error { _, err := joined(c.BatchExists(ctx, []string{"k"})); return err },
		"Consecutive":    func() error { _, err := c.BatchExistsConsecutive(ctx, []string{"k"}); return err },
		"Clear":          func() error { _, err := c.Clear(ctx); return err },
		"Flush":          func() error { _, err := c.Flush(ctx); return err },
		"RegisterHost":   func() error { return c.RegisterHost(ctx, fd, addr(mem), 4096) },
		"RegisterGPU":    func() error { return c.RegisterGPU(ctx, GPURegion{Base: 1, AllocBase: 1, Size: 1}) },
		"Deregister":     func() error { return c.Deregister(ctx) },
		"Report":         func() error { _, err := c.ReportExternalKvBlocks(ctx, nil, 0); return err },
		"Revoke":         func() error { _, err := c.RevokeExternalKvBlocks(ctx, nil, 0); return err },
		"RevokeAll":      func() error { _, err := c.RevokeAllExternalKvBlocksAtTier(ctx, 0); return err },
		"Match":          func() error { _, err := c.MatchExternalKv(ctx, nil, false); return err },
		"HitCounts":      func() error { _, err := c.GetExternalKvHitCounts(ctx, nil); return err },
	}
	for name, fn := range calls {
		if err := fn(); !errors.Is(err, errdefs.ErrClosed) || !errors.Is(err, rpc.ErrNotSent) {
			t.Errorf("%s after Close = %v, want errdefs.ErrClosed and rpc.ErrNotSent", name, err)
		}
	}
	if s := c.State(); s != connectivity.Shutdown {
		t.Errorf("State after Close = %v", s)
	}
}

package server

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testLogger is quiet unless UMBP_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("UMBP_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// shortDir is a temporary directory with a path short enough for sockets.
func shortDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "umbps")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// harness is a server with a generated client connected to it.
type harness struct {
	srv *Server
	cc  *grpc.ClientConn
	c   umbppb.UMBPStandaloneClient
}

func dial(tb testing.TB, endpoint string) (*grpc.ClientConn, umbppb.UMBPStandaloneClient) {
	tb.Helper()
	cc, err := grpc.NewClient(endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(rpc.MaxMessageSize), grpc.MaxCallSendMsgSize(rpc.MaxMessageSize)))
	if err != nil {
		tb.Fatal(err)
	}
	return cc, umbppb.NewUMBPStandaloneClient(cc)
}

func newHarness(tb testing.TB, opts Options) *harness {
	tb.Helper()
	if opts.Endpoint == "" {
		opts.Endpoint = "unix://" + filepath.Join(shortDir(tb), "t.grpc.sock")
	}
	if opts.Logger == nil {
		opts.Logger = testLogger()
	}
	srv, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{srv: srv}
	h.cc, h.c = dial(tb, srv.Endpoint())
	tb.Cleanup(func() {
		_ = h.cc.Close()
		if err := srv.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return h
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// memfd is a client buffer shared with the server.
type memfd struct {
	fd   int
	mem  []byte
	base uint64 // the client's address of mem
}

func newMemfd(tb testing.TB, size int) *memfd {
	tb.Helper()
	fd, err := unix.MemfdCreate("umbp-test", unix.MFD_CLOEXEC)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		tb.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		tb.Fatal(err)
	}
	m := &memfd{fd: fd, mem: mem, base: uint64(uintptr(unsafe.Pointer(&mem[0])))}
	tb.Cleanup(func() {
		_ = unix.Munmap(mem)
		_ = unix.Close(fd)
	})
	return m
}

// fill writes a pattern derived from seed.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

// handoff sends m's fd for client at m.base with size.
func (h *harness) handoff(tb testing.TB, client string, m *memfd, base, size uint64) error {
	tb.Helper()
	return fdpass.Send(ctxT(tb), h.srv.FDSocketPath(), m.fd, fdpass.Registration{ClientID: client, WorkerBase: base, Size: size}, nil)
}

// register does both registration steps for all of m.
func (h *harness) register(tb testing.TB, client string, m *memfd) {
	tb.Helper()
	if err := h.handoff(tb, client, m, m.base, uint64(len(m.mem))); err != nil {
		tb.Fatalf("fd handoff: %v", err)
	}
	r, err := h.c.RegisterMemory(ctxT(tb), &umbppb.RegisterMemoryRequest{ClientId: client, WorkerBase: m.base, Size: uint64(len(m.mem))})
	if err != nil || !r.Ok {
		tb.Fatalf("RegisterMemory: %v %v", r, err)
	}
}

func (h *harness) put(tb testing.TB, client, key string, base, off, size uint64) *umbppb.BoolResponse {
	tb.Helper()
	r, err := h.c.Put(ctxT(tb), &umbppb.PutRequest{Key: key, ClientId: client, ShmOffset: off, Size: size, RegionBase: base})
	if err != nil {
		tb.Fatalf("Put: %v", err)
	}
	return r
}

func (h *harness) get(tb testing.TB, client, key string, base, off, size uint64) *umbppb.BoolResponse {
	tb.Helper()
	r, err := h.c.Get(ctxT(tb), &umbppb.GetRequest{Key: key, ClientId: client, ShmOffset: off, Size: size, RegionBase: base})
	if err != nil {
		tb.Fatalf("Get: %v", err)
	}
	return r
}

func (h *harness) exists(tb testing.TB, key string) bool {
	tb.Helper()
	r, err := h.c.Exists(ctxT(tb), &umbppb.KeyRequest{Key: key})
	if err != nil {
		tb.Fatalf("Exists: %v", err)
	}
	if r.Error != "" {
		tb.Fatalf("Exists(%q): error %q", key, r.Error)
	}
	return r.Ok
}

func wantOK(tb testing.TB, what string, r *umbppb.BoolResponse) {
	tb.Helper()
	if !r.GetOk() || r.GetError() != "" {
		tb.Fatalf("%s: got ok=%v error=%q, want ok", what, r.GetOk(), r.GetError())
	}
}

func wantFail(tb testing.TB, what string, r *umbppb.BoolResponse, msg string) {
	tb.Helper()
	if r.GetOk() || r.GetError() != msg {
		tb.Fatalf("%s: got ok=%v error=%q, want false with %q", what, r.GetOk(), r.GetError(), msg)
	}
}

func wantBools(tb testing.TB, what string, got []bool, want ...bool) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Fatalf("%s: %d results %v, want %v", what, len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			tb.Fatalf("%s: got %v, want %v", what, got, want)
		}
	}
}

func wantBytes(tb testing.TB, what string, got, want []byte) {
	tb.Helper()
	if !bytes.Equal(got, want) {
		tb.Fatalf("%s: bytes differ", what)
	}
}

func allFalse(n int) []bool { return make([]bool, n) }

// openFDs counts this process's open descriptors.
func openFDs(tb testing.TB) int {
	tb.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Skipf("cannot count descriptors: %v", err)
	}
	return len(ents)
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

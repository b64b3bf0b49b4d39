package umbptest_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func client(t *testing.T, s *umbptest.Server) umbppb.UMBPStandaloneClient {
	t.Helper()
	cc, err := grpc.NewClient(s.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return umbppb.NewUMBPStandaloneClient(cc)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

type memfd struct {
	fd   int
	mem  []byte
	base uint64
}

func newMemfd(t *testing.T, size int) *memfd {
	t.Helper()
	fd, err := unix.MemfdCreate("umbptest", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem); _ = unix.Close(fd) })
	return &memfd{fd: fd, mem: mem, base: uint64(uintptr(unsafe.Pointer(&mem[0])))}
}

func (m *memfd) send(ctx context.Context, s *umbptest.Server, client string) error {
	return fdpass.Send(ctx, s.FDSocketPath(), m.fd, fdpass.Registration{ClientID: client, WorkerBase: m.base, Size: uint64(len(m.mem))}, nil)
}

func register(t *testing.T, s *umbptest.Server, c umbppb.UMBPStandaloneClient, m *memfd, id string) {
	t.Helper()
	if err := m.send(ctxT(t, 10*time.Second), s, id); err != nil {
		t.Fatal(err)
	}
	r, err := c.RegisterMemory(ctxT(t, 10*time.Second), &umbppb.RegisterMemoryRequest{ClientId: id, WorkerBase: m.base, Size: uint64(len(m.mem))})
	if err != nil || !r.Ok {
		t.Fatalf("RegisterMemory: %v %v", r, err)
	}
}

func TestServer(t *testing.T) {
	s := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	if !strings.HasPrefix(s.Endpoint(), "unix:///") {
		t.Fatalf("Endpoint() = %q", s.Endpoint())
	}
	grpcPath, fdPath, err := fdpass.SocketPaths(s.Endpoint())
	if err != nil || fdPath != s.FDSocketPath() {
		t.Fatalf("socket paths %q %q %v", grpcPath, fdPath, err)
	}
	c := client(t, s)
	r, err := c.Ping(ctxT(t, 10*time.Second), &umbppb.Empty{})
	if err != nil || !r.Ready || !r.SupportsRangedIo {
		t.Fatalf("Ping = %v, %v", r, err)
	}
	m := newMemfd(t, 8192)
	register(t, s, c, m, "w")
	copy(m.mem, "hello")
	pr, err := c.Put(ctxT(t, 10*time.Second), &umbppb.PutRequest{Key: "k", ClientId: "w", Size: 4096, RegionBase: m.base})
	if err != nil || !pr.Ok {
		t.Fatalf("Put = %v, %v", pr, err)
	}
	if st := s.Stats(); st.Objects != 1 || st.BytesUsed != 4096 || st.Capacity != 1<<20 || st.Regions != 1 || st.Clients != 1 {
		t.Fatalf("Stats() = %+v", st)
	}
	if s.Calls("Ping") != 1 || s.Calls("Put") != 1 || s.Calls("RegisterMemory") != 1 || s.Calls(umbptest.FDHandoff) != 1 {
		t.Fatalf("calls: Ping %d Put %d RegisterMemory %d FDHandoff %d", s.Calls("Ping"), s.Calls("Put"), s.Calls("RegisterMemory"), s.Calls(umbptest.FDHandoff))
	}
	s.Close()
	s.Close()
	if _, err := os.Stat(grpcPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after Close: %v", err)
	}
}

func TestOptions(t *testing.T) {
	v1 := umbptest.NewServer(t, umbptest.Options{Version: 1})
	_, err := client(t, v1).BatchPutRanges(ctxT(t, 10*time.Second), &umbppb.BatchRangeDataRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("v1 BatchPutRanges: %v", err)
	}
	ssd := umbptest.NewServer(t, umbptest.Options{DisableRangedIO: true})
	r, err := client(t, ssd).Ping(ctxT(t, 10*time.Second), &umbppb.Empty{})
	if err != nil || r.SupportsRangedIo {
		t.Fatalf("Ping = %v, %v", r, err)
	}
	if st := ssd.Stats(); st.Capacity != 1<<30 {
		t.Fatalf("default capacity %d", st.Capacity)
	}
}

func TestStallResume(t *testing.T) {
	s := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	c := client(t, s)
	if _, err := c.Ping(ctxT(t, 10*time.Second), &umbppb.Empty{}); err != nil {
		t.Fatal(err)
	}
	s.Stall()
	done := make(chan error, 1)
	go func() {
		_, err := c.BatchExists(ctxT(t, 20*time.Second), &umbppb.BatchKeysRequest{Keys: []string{"a"}})
		done <- err
	}()
	m := newMemfd(t, 4096)
	fdDone := make(chan error, 1)
	go func() { fdDone <- m.send(ctxT(t, 20*time.Second), s, "w") }()
	waitCalls(t, s, "BatchExists", 1)
	waitCalls(t, s, umbptest.FDHandoff, 1)
	select {
	case err := <-done:
		t.Fatalf("stalled call returned: %v", err)
	case err := <-fdDone:
		t.Fatalf("stalled fd handoff returned: %v", err)
	case <-time.After(150 * time.Millisecond):
	}
	// A stalled call ends with its client's deadline.
	_, err := c.Ping(ctxT(t, 100*time.Millisecond), &umbppb.Empty{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("stalled Ping with a deadline: %v", err)
	}
	s.Resume()
	for _, ch := range []chan error{done, fdDone} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("after Resume: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Resume did not release the stalled call")
		}
	}
	if _, err := c.Ping(ctxT(t, 10*time.Second), &umbppb.Empty{}); err != nil {
		t.Fatal(err)
	}
}

func waitCalls(t *testing.T, s *umbptest.Server, method string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Calls(method) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d calls, want %d", method, s.Calls(method), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestCloseReleasesStalled(t *testing.T) {
	s := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	c := client(t, s)
	s.Stall()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exists(ctxT(t, 30*time.Second), &umbppb.KeyRequest{Key: "k"})
		done <- err
	}()
	m := newMemfd(t, 4096)
	fdDone := make(chan error, 1)
	go func() { fdDone <- m.send(ctxT(t, 30*time.Second), s, "w") }()
	waitCalls(t, s, "Exists", 1)
	waitCalls(t, s, umbptest.FDHandoff, 1)
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	for _, ch := range []chan error{done, fdDone} {
		select {
		case err := <-ch:
			if err == nil {
				t.Fatal("a stalled call succeeded after Close")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not release a stalled call")
		}
	}
}

func TestFailNext(t *testing.T) {
	s := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	c := client(t, s)
	m := newMemfd(t, 8192)
	s.FailNext(umbptest.FDHandoff, 1)
	if err := m.send(ctxT(t, 10*time.Second), s, "w"); !errors.Is(err, fdpass.ErrRejected) {
		t.Fatalf("failed fd handoff: %v", err)
	}
	register(t, s, c, m, "w")
	s.FailNext("BatchPut", 2)
	req := &umbppb.BatchDataRequest{Keys: []string{"k"}, ClientId: "w", ShmOffsets: []uint64{0}, Sizes: []uint64{4096}, RegionBases: []uint64{m.base}}
	for i := range 2 {
		if _, err := c.BatchPut(ctxT(t, 10*time.Second), req); status.Code(err) != codes.Unavailable {
			t.Fatalf("call %d: %v, want Unavailable", i, err)
		}
	}
	r, err := c.BatchPut(ctxT(t, 10*time.Second), req)
	if err != nil || len(r.Ok) != 1 || !r.Ok[0] {
		t.Fatalf("third BatchPut = %v, %v", r, err)
	}
	// Other methods are unaffected; n <= 0 clears.
	s.FailNext("Get", 5)
	s.FailNext("Get", 0)
	if _, err := c.Get(ctxT(t, 10*time.Second), &umbppb.GetRequest{Key: "k", ClientId: "w", Size: 4096, RegionBase: m.base}); err != nil {
		t.Fatal(err)
	}
	if got := s.Calls("BatchPut"); got != 3 {
		t.Fatalf("Calls(BatchPut) = %d, want 3", got)
	}
	if got := s.Calls(umbptest.FDHandoff); got != 2 {
		t.Fatalf("Calls(FDHandoff) = %d, want 2", got)
	}
	if got := s.Calls("Flush"); got != 0 {
		t.Fatalf("Calls(Flush) = %d", got)
	}
}

func TestRestart(t *testing.T) {
	s := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	c := client(t, s)
	m := newMemfd(t, 8192)
	register(t, s, c, m, "w")
	if r, err := c.Put(ctxT(t, 10*time.Second), &umbppb.PutRequest{Key: "k", ClientId: "w", Size: 4096, RegionBase: m.base}); err != nil || !r.Ok {
		t.Fatalf("Put = %v, %v", r, err)
	}
	endpoint := s.Endpoint()
	before := s.Calls("Put")

	// A call stalled across the restart is released with an error.
	s.Stall()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exists(ctxT(t, 30*time.Second), &umbppb.KeyRequest{Key: "k"})
		done <- err
	}()
	waitCalls(t, s, "Exists", 1)
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("stalled call succeeded across Restart")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Restart did not release a stalled call")
	}
	s.Resume()

	if s.Endpoint() != endpoint {
		t.Fatalf("endpoint changed: %q -> %q", endpoint, s.Endpoint())
	}
	ctx := ctxT(t, 20*time.Second)
	r, err := c.Exists(ctx, &umbppb.KeyRequest{Key: "k"}, grpc.WaitForReady(true))
	if err != nil || r.Ok {
		t.Fatalf("Exists after Restart = %v, %v; want a miss", r, err)
	}
	if st := s.Stats(); st.Objects != 0 || st.Regions != 0 {
		t.Fatalf("state survived Restart: %+v", st)
	}
	rr, err := c.RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{ClientId: "w", WorkerBase: m.base, Size: 8192})
	if err != nil || rr.Ok || rr.Error != "fd handoff registration was not found" {
		t.Fatalf("RegisterMemory after Restart = %v, %v", rr, err)
	}
	register(t, s, c, m, "w")
	if s.Calls("Put") != before {
		t.Fatalf("Calls reset by Restart")
	}
	if s.Calls("Exists") != 2 {
		t.Fatalf("Calls(Exists) = %d, want 2", s.Calls("Exists"))
	}
}

// WaitCalls returns once the calls have arrived, a stalled one included,
// and with ctx's error when they do not.
func TestWaitCalls(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	srv.Stall("Ping")
	c := client(t, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.Ping(context.Background(), &umbppb.Empty{})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.WaitCalls(ctx, "Ping", 1); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancelShort()
	if err := srv.WaitCalls(short, "Ping", 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitCalls for a call that never comes = %v", err)
	}
	srv.Resume("Ping")
	<-done
}

// TestDropConnections: a stalled call is cut off with its transport, but
// the server lives on: a client that connects again finds its object and
// its registration.
func TestDropConnections(t *testing.T) {
	s := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	c := client(t, s)
	m := newMemfd(t, 8192)
	register(t, s, c, m, "w")
	if r, err := c.Put(ctxT(t, 10*time.Second), &umbppb.PutRequest{Key: "k", ClientId: "w", Size: 4096, RegionBase: m.base}); err != nil || !r.Ok {
		t.Fatalf("Put = %v, %v", r, err)
	}
	s.Stall("Exists")
	done := make(chan error, 1)
	go func() {
		_, err := c.Exists(ctxT(t, 30*time.Second), &umbppb.KeyRequest{Key: "k"})
		done <- err
	}()
	waitCalls(t, s, "Exists", 1)
	s.DropConnections()
	select {
	case err := <-done:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("call in flight across DropConnections: %v, want Unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("DropConnections did not cut off a call in flight")
	}
	s.Resume("Exists")
	r, err := c.Exists(ctxT(t, 20*time.Second), &umbppb.KeyRequest{Key: "k"}, grpc.WaitForReady(true))
	if err != nil || !r.Ok {
		t.Fatalf("Exists after DropConnections = %v, %v; want a hit", r, err)
	}
	if st := s.Stats(); st.Objects != 1 || st.Regions != 1 || st.Clients != 1 {
		t.Fatalf("state after DropConnections: %+v", st)
	}
}

package server

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// rawConn connects to the fd socket.
func rawConn(t *testing.T, h *harness) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: h.srv.FDSocketPath(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// readStatus reads the server's reply: a status, then EOF.
func readStatus(t *testing.T, c *net.UnixConn) int32 {
	t.Helper()
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatalf("read status: %v", err)
	}
	// The server closes the connection: EOF, or a reset when it left
	// unread bytes behind.
	if n, err := c.Read(b[:1]); n != 0 || !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after the status: %d bytes, %v; want EOF (one registration per connection)", n, err)
	}
	return int32(binary.LittleEndian.Uint32(b[:]))
}

func validMsg(t *testing.T, size uint64) []byte {
	t.Helper()
	msg, err := fdpass.Registration{ClientID: "raw", WorkerBase: 0x1000, Size: size}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func TestFDPlaneRobustness(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20, FDReceiveTimeout: 300 * time.Millisecond})
	m := newMemfd(t, 8192)
	if _, err := h.c.Ping(ctxT(t), &umbppb.Empty{}); err != nil { // the gRPC connection's descriptors, before counting
		t.Fatal(err)
	}
	before := openFDs(t)

	t.Run("garbage without fd", func(t *testing.T) {
		c := rawConn(t, h)
		defer c.Close()
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 60)))); err != nil {
			t.Fatal(err)
		}
		if st := readStatus(t, c); st != fdpass.StatusFailed {
			t.Fatalf("status %d", st)
		}
	})
	t.Run("valid message, no fd", func(t *testing.T) {
		c := rawConn(t, h)
		defer c.Close()
		if _, err := c.Write(validMsg(t, 4096)); err != nil {
			t.Fatal(err)
		}
		if st := readStatus(t, c); st != fdpass.StatusFailed {
			t.Fatalf("status %d", st)
		}
	})
	t.Run("bad magic with fd", func(t *testing.T) {
		c := rawConn(t, h)
		defer c.Close()
		msg := validMsg(t, 4096)
		msg[0] ^= 0xff
		if _, _, err := c.WriteMsgUnix(msg, unix.UnixRights(m.fd), nil); err != nil {
			t.Fatal(err)
		}
		if st := readStatus(t, c); st != fdpass.StatusFailed {
			t.Fatalf("status %d", st)
		}
	})
	t.Run("two fds", func(t *testing.T) {
		c := rawConn(t, h)
		defer c.Close()
		if _, _, err := c.WriteMsgUnix(validMsg(t, 4096), unix.UnixRights(m.fd, m.fd), nil); err != nil {
			t.Fatal(err)
		}
		if st := readStatus(t, c); st != fdpass.StatusFailed {
			t.Fatalf("status %d", st)
		}
	})
	t.Run("truncated then closed", func(t *testing.T) {
		c := rawConn(t, h)
		if _, _, err := c.WriteMsgUnix(validMsg(t, 4096)[:40], unix.UnixRights(m.fd), nil); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	})
	t.Run("truncated then silent", func(t *testing.T) {
		c := rawConn(t, h)
		defer c.Close()
		if _, _, err := c.WriteMsgUnix(validMsg(t, 4096)[:40], unix.UnixRights(m.fd), nil); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if st := readStatus(t, c); st != fdpass.StatusFailed {
			t.Fatalf("status %d", st)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the receive timeout did not apply: %v", d)
		}
	})
	t.Run("silent", func(t *testing.T) {
		c := rawConn(t, h)
		defer c.Close()
		if st := readStatus(t, c); st != fdpass.StatusFailed {
			t.Fatalf("status %d", st)
		}
	})
	t.Run("long message", func(t *testing.T) {
		c := rawConn(t, h)
		defer c.Close()
		msg := append(validMsg(t, 4096), 1, 2, 3)
		if _, _, err := c.WriteMsgUnix(msg, unix.UnixRights(m.fd), nil); err != nil {
			t.Fatal(err)
		}
		if st := readStatus(t, c); st != fdpass.StatusFailed {
			t.Fatalf("status %d", st)
		}
	})
	t.Run("connect and close", func(t *testing.T) {
		c := rawConn(t, h)
		_ = c.Close()
	})
	t.Run("valid after all that", func(t *testing.T) {
		c := rawConn(t, h)
		defer c.Close()
		if _, _, err := c.WriteMsgUnix(validMsg(t, 8192), unix.UnixRights(m.fd), nil); err != nil {
			t.Fatal(err)
		}
		if st := readStatus(t, c); st != fdpass.StatusOK {
			t.Fatalf("status %d", st)
		}
	})
	// Every descriptor the server received was closed (the mapping of the
	// valid one stays, without a descriptor); one pidfd watches the process
	// that registered it (this one) while it does.
	if !waitFor(5*time.Second, func() bool { return openFDs(t) <= before+1 }) {
		t.Fatalf("descriptors leaked: %d before, %d after (one pidfd expected)", before, openFDs(t))
	}
	if st := h.srv.Stats(); st.ClientProcesses != 1 || st.Regions != 1 {
		t.Fatalf("after the valid registration: %d client processes, %d regions; want 1 1", st.ClientProcesses, st.Regions)
	}
	if !h.srv.regs.hasHost("raw", 0x1000, 8192) {
		t.Fatal("the valid registration was not recorded")
	}
	if _, err := h.c.DeregisterMemory(ctxT(t), &umbppb.DeregisterMemoryRequest{ClientId: "raw"}); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return openFDs(t) <= before }) {
		t.Fatalf("descriptors left after deregistering: %d before, %d after", before, openFDs(t))
	}
	if st := h.srv.Stats(); st.ClientProcesses != 0 {
		t.Fatalf("after deregistering: %d client processes watched, want 0", st.ClientProcesses)
	}
}

func TestFDPlaneConcurrent(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	const n = 40
	mems := make([]*memfd, n)
	for i := range mems {
		mems[i] = newMemfd(t, 4096)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- fdpass.Send(context.Background(), h.srv.FDSocketPath(), mems[i].fd,
				fdpass.Registration{ClientID: "many", WorkerBase: mems[i].base, Size: 4096}, nil)
		}()
	}
	// Some silent connections hold slots meanwhile.
	for range 4 {
		c := rawConn(t, h)
		defer c.Close()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := h.srv.Stats(); st.Regions != n {
		t.Fatalf("regions %d, want %d", st.Regions, n)
	}
}

func TestFDGate(t *testing.T) {
	var mu sync.Mutex
	refuse := true
	h := newHarness(t, Options{Capacity: 1 << 20, FDGate: func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return errors.New("refused by the test")
		}
		return nil
	}})
	m := newMemfd(t, 4096)
	if err := h.handoff(t, "c", m, m.base, 4096); !errors.Is(err, fdpass.ErrRejected) {
		t.Fatalf("gated handoff: %v", err)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	if err := h.handoff(t, "c", m, m.base, 4096); err != nil {
		t.Fatal(err)
	}
}

// TestCloseReleasesStalledHandoff: Close ends a gate waiting on its context
// and a connection waiting for its message, without waiting for the
// receive timeout.
func TestCloseReleasesStalledHandoff(t *testing.T) {
	gated := make(chan struct{}, 1)
	srv, err := New(Options{
		Endpoint: shortDir(t) + "/g.sock", Capacity: 1 << 20, Logger: testLogger(),
		FDReceiveTimeout: time.Minute,
		FDGate: func(ctx context.Context) error {
			gated <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: srv.FDSocketPath(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-gated
	start := time.Now()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
}

// TestCloseReleasesSilentHandoff: Close does not wait for the receive
// timeout of a connection that sends nothing.
func TestCloseReleasesSilentHandoff(t *testing.T) {
	srv, err := New(Options{Endpoint: shortDir(t) + "/s.sock", Capacity: 1 << 20, Logger: testLogger(), FDReceiveTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: srv.FDSocketPath(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !waitFor(5*time.Second, func() bool { return srv.Stats().FDHandoffs == 1 }) {
		t.Fatal("connection not served")
	}
	start := time.Now()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
}

// vmRSS is this process's resident memory in bytes (/proc/self/status).
func vmRSS(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("cannot read resident memory: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Skip("no VmRSS in /proc/self/status")
	return 0
}

// TestLargeRegistrationNotPopulated: registering an 8 GiB memfd (sparse: no
// page of it written) answers within the handoff's default bound and leaves
// the server's resident memory where it was; a data op then faults in only
// the pages it copies.
func TestLargeRegistrationNotPopulated(t *testing.T) {
	const size = 8 << 30
	h := newHarness(t, Options{Capacity: 4 << 20})
	fd, err := unix.MemfdCreate("umbp-sparse", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Skipf("cannot size a sparse memfd: %v", err)
	}
	const base = 0x7f0000000000
	before := vmRSS(t)
	// No deadline of its own: fdpass.DefaultTimeout bounds it.
	if err := fdpass.Send(context.Background(), h.srv.FDSocketPath(), fd, fdpass.Registration{ClientID: "big", WorkerBase: base, Size: size}, nil); err != nil {
		t.Fatalf("handoff of %d bytes: %v", size, err)
	}
	after := vmRSS(t)
	const slack = 64 << 20 // goroutines, buffers: anything but the region
	if after > before+slack {
		t.Fatalf("registering a sparse %d-byte memfd raised resident memory from %d to %d bytes", size, before, after)
	}
	r, err := h.c.RegisterMemory(ctxT(t), &umbppb.RegisterMemoryRequest{ClientId: "big", WorkerBase: base, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, "RegisterMemory", r)

	// A put from the far end of the region copies 1 MiB: resident memory
	// grows by about that (the region's pages and the pool's), no more.
	const n = 1 << 20
	wantOK(t, "put", h.put(t, "big", "k", base, size-n, n))
	if got := vmRSS(t); got > after+slack {
		t.Fatalf("a %d-byte put raised resident memory from %d to %d bytes", n, after, got)
	}
	if _, err := h.c.DeregisterMemory(ctxT(t), &umbppb.DeregisterMemoryRequest{ClientId: "big"}); err != nil {
		t.Fatal(err)
	}
}

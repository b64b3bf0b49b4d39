package umbp_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// seen is a slog handler that closes a channel the first time a record
// whose message contains a text is logged, at any level.
type seen struct {
	text string
	once *sync.Once
	ch   chan struct{}
}

func newSeen(text string) *seen {
	return &seen{text: text, once: new(sync.Once), ch: make(chan struct{})}
}

func (s *seen) Enabled(context.Context, slog.Level) bool { return true }
func (s *seen) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, s.text) {
		s.once.Do(func() { close(s.ch) })
	}
	return nil
}
func (s *seen) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *seen) WithGroup(string) slog.Handler      { return s }

// A handle waits for a server that is not up yet, up to StartupTimeout:
// one that starts while it waits is attached to.
func TestAttachWaitsForTheServer(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	// The server's sockets, moved aside: nothing at the endpoint until
	// they are moved back (a server still starting).
	aside := shortDir(t)
	grpcPath := strings.TrimPrefix(srv.Endpoint(), "unix://")
	paths := []string{grpcPath, srv.FDSocketPath()}
	for _, p := range paths {
		if err := os.Rename(p, filepath.Join(aside, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(t, srv.Endpoint())
	waiting := newSeen("waiting for the UMBP standalone server")
	cfg.Logger = slog.New(waiting)
	cfg.StartupTimeout = time.Minute
	rt := newRuntime(t, cfg)
	type result struct {
		h   *umbp.SchedulerHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := rt.NewSchedulerHandle(context.Background())
		done <- result{h, err}
	}()
	select {
	case <-waiting.ch: // an attempt found nothing
	case r := <-done:
		t.Fatalf("attached with no server: %v", r.err)
	}
	for _, p := range paths {
		if err := os.Rename(filepath.Join(aside, filepath.Base(p)), p); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("NewSchedulerHandle: %v", r.err)
		}
		defer r.h.Close()
		if r.h.State() != umbp.StateConnected {
			t.Fatalf("state %v", r.h.State())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handle did not attach within 30 s of the server starting")
	}
}

// A socket that fails the trust check, appearing while a handle waits for
// its server, ends the wait at once with the refusal.
func TestAttachRefusesBadSocketAppearingLate(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	dir := shortDir(t)
	late := filepath.Join(dir, "n.grpc.sock")
	cfg := testConfig(t, late)
	waiting := newSeen("waiting for the UMBP standalone server")
	cfg.Logger = slog.New(waiting)
	cfg.StartupTimeout = time.Minute
	rt := newRuntime(t, cfg)
	done := make(chan error, 1)
	go func() {
		h, err := rt.NewSchedulerHandle(context.Background())
		if err == nil {
			h.Close()
		}
		done <- err
	}()
	<-waiting.ch
	// The server's socket, made writable by others, appears at the path
	// the handle waits on.
	grpcPath := strings.TrimPrefix(srv.Endpoint(), "unix://")
	if err := os.Chmod(grpcPath, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(grpcPath, late); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		wantUntrustedServer(t, "NewSchedulerHandle", err, late, "writable by others")
	case <-time.After(30 * time.Second):
		t.Fatal("the refusal did not end the wait")
	}
}

// A master that is down is redialled at the handle's pace, not gRPC's
// default backoff (1 s growing by 1.6): a master that comes back is used
// again within about a second however long it was down.
func TestClusterMasterRedialledAtOurPace(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	h := newClusterHandle(t, clusterConfig(t, m.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m.Kill()
	if !h.WaitForStateChange(ctx, umbp.StateConnected) {
		t.Fatal("no state change after the kill")
	}
	// While it is down, something at its address counts the redials and
	// hangs up on each.
	l, err := net.Listen("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			c.Close()
		}
	}()
	const down = 3 * time.Second
	time.Sleep(down) // the master is down this long
	l.Close()
	// gRPC's default would have redialled about 3 times; at most every
	// 500 ms, 6 or more.
	if n := dials.Load(); n < 5 {
		t.Errorf("%d redials in %v", n, down)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for h.State() != umbp.StateConnected {
		if !h.WaitForStateChange(ctx, h.State()) {
			t.Fatal("never reconnected")
		}
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("the master was used again %v after it came back, want within about a second", d)
	}
}

// Attempts that fail give back what they took: a handle waiting for a
// stopped server process connects again and again, and each connection's
// socket and pidfd are closed when its attempt fails.
func TestFailedAttachLeaksNothing(t *testing.T) {
	ep := filepath.Join(shortDir(t), "n.grpc.sock")
	srv := startServerProcess(t, ep)
	before := countFDs(t)
	srv.signal(syscall.SIGSTOP) // accepts connections, answers nothing
	defer srv.signal(syscall.SIGCONT)
	cfg := testConfig(t, ep)
	cfg.StartupTimeout = 1500 * time.Millisecond
	_, err := newRuntime(t, cfg).NewSchedulerHandle(context.Background())
	if !errors.Is(err, umbp.ErrUnavailable) || !strings.Contains(err.Error(), "never answered") {
		t.Fatalf("attach to a stopped server: %v", err)
	}
	// A transport gRPC was still making when its attempt failed closes a
	// moment later: wait for that, not for a leak.
	var after fdCounts
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if after = countFDs(t); after.pidfds <= before.pidfds && after.sockets <= before.sockets {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a failed attach: %d pidfds and %d sockets open, %d and %d before", after.pidfds, after.sockets, before.pidfds, before.sockets)
		}
	}
}

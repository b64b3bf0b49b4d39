package conn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestWaitPeersGone: a connection waits for the server process behind its
// transports to exit, and not before.
func TestWaitPeersGone(t *testing.T) {
	requireRoot(t) // the server process runs as another uid
	f := startForeign(t, worldDir(t))
	c := dial(t, f.endpoint, quiet, func(o *Options) { o.Trust = mustTrust(t, foreignUID) })
	if c.Transports() != 1 {
		t.Fatalf("Transports = %d after Dial, want 1", c.Transports())
	}
	if c.ServedInProcess() {
		t.Fatal("ServedInProcess for a server in another process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.WaitPeersGone(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitPeersGone with the server alive = %v", err)
	}
	if err := syscall.Kill(f.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before, stdin := openFDs(t), fdIdentity(t, 0)
	if err := c.WaitPeersGone(ctx); err != nil {
		t.Fatalf("WaitPeersGone after the server died = %v", err)
	}
	// The wait closes the descriptors it opened (pidfds), and no other.
	// (The transport's own may close meanwhile, the server having died,
	// and gRPC may open a socket to dial again.)
	for _, fd := range openFDs(t) {
		if slices.Contains(before, fd) {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + fd); err == nil && strings.Contains(target, "pidfd") {
			t.Errorf("descriptor %s (%s) opened by the wait is still open", fd, target)
		}
	}
	if got := fdIdentity(t, 0); got != stdin {
		t.Errorf("descriptor 0 was %s before the wait, %s after", stdin, got)
	}
}

// fdIdentity names the file behind fd, or says it is closed.
func fdIdentity(t *testing.T, fd int) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("dev %d ino %d", st.Dev, st.Ino)
}

// openFDs lists this process's open descriptors.
func openFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	var fds []string
	for _, e := range ents {
		fds = append(fds, e.Name())
	}
	return fds
}

// TestWaitPeersGoneInProcess: a server in this very process cannot be
// waited for; the wait returns at once.
func TestWaitPeersGoneInProcess(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint, quiet)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.WaitPeersGone(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWaitPeersGoneUnknown: a server that could not be pinned can never be
// proven gone; the wait says so at once instead of pretending.
func TestWaitPeersGoneUnknown(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint, quiet)
	c.peers.mu.Lock()
	c.peers.unknown = true
	c.peers.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	if err := c.WaitPeersGone(ctx); !errors.Is(err, ErrPeerUnknown) {
		t.Fatalf("WaitPeersGone with an unknown peer = %v, want ErrPeerUnknown", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("WaitPeersGone took %v", d)
	}
}

// TestServedInProcess: a server in this process is not waited for, and the
// connection says so.
func TestServedInProcess(t *testing.T) {
	c := dial(t, startFake(t).endpoint)
	if !c.ServedInProcess() {
		t.Fatal("ServedInProcess = false for a server in this process")
	}
	if err := c.WaitPeersGone(context.Background()); err != nil {
		t.Fatalf("WaitPeersGone = %v, want nil at once", err)
	}
}

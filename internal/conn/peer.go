package conn

import (
	"context"
	"net"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// peers holds a pidfd for the server process behind each transport the
// connection opened. A transfer whose transport failed may still be running
// in a server process that lives on; only that process's exit proves it is
// not.
type peers struct {
	mu      sync.Mutex
	fds     []int
	pids    []int // fds[i] is process pids[i]'s (0: not known)
	unknown bool  // a transport whose server could not be pinned
	self    bool  // a transport whose server is this process
	closed  bool
}

// peerPID is the pid of the process at c's other end, as SO_PEERCRED
// tells it: 0 when not known (another pid namespace).
func peerPID(c *net.UnixConn) int {
	pid := 0
	if raw, err := c.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid = int(cred.Pid)
			}
		})
	}
	return pid
}

// add pins the process behind a freshly dialled transport: by
// SO_PEERPIDFD where the kernel has it (Linux 6.5; it works across pid
// namespaces), else by its pid from SO_PEERCRED. A server in this very
// process (tests) is not pinned; one that cannot be pinned otherwise (in
// another pid namespace on an older kernel) is remembered as unknown.
func (p *peers) add(c *net.UnixConn) {
	pidfd, pid, gone := -1, 0, false
	if raw, err := c.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid = int(cred.Pid)
			}
			if pid != os.Getpid() {
				if f, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
					pidfd = f
				}
			}
		})
	}
	if pid == os.Getpid() {
		p.mu.Lock()
		p.self = true
		p.mu.Unlock()
		return
	}
	if pidfd < 0 && pid > 0 {
		f, err := unix.PidfdOpen(pid, 0)
		pidfd, gone = f, err == unix.ESRCH // already exited: nothing to wait for
		if err != nil {
			pidfd = -1
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		if pidfd >= 0 {
			_ = unix.Close(pidfd)
		}
		return
	}
	switch {
	case pidfd >= 0 && pid > 0 && slices.Contains(p.pids, pid):
		// A process already watched (another transport to the same
		// server: the lock-step lookups' connections): one pidfd does.
		_ = unix.Close(pidfd)
	case pidfd >= 0:
		p.fds = append(p.fds, pidfd)
		p.pids = append(p.pids, pid)
	case !gone:
		p.unknown = true
	}
}

func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, fd := range p.fds {
		_ = unix.Close(fd)
	}
	p.fds, p.pids = nil, nil
}

// ServedInProcess reports whether a server in this very process served one
// of the connection's transports: WaitPeersGone does not wait for it, so
// its return proves nothing of that server's copies.
func (c *Conn) ServedInProcess() bool {
	c.peers.mu.Lock()
	defer c.peers.mu.Unlock()
	return c.peers.self
}

// WaitPeersGone waits until every server process this connection has had a
// transport to has exited, or ctx ends. A transfer that failed with
// ErrUnavailable holds its buffers until then: the server may still be
// copying. A server in this process is not waited for. When a server could
// not be pinned, or the Conn is closed (its peers no longer watched), it
// returns ErrPeerUnknown at once: nothing can prove that server gone, and
// the buffers must never be released.
func (c *Conn) WaitPeersGone(ctx context.Context) error {
	// Duplicates, so that a concurrent Close cannot pull them away.
	c.peers.mu.Lock()
	unknown := c.peers.unknown
	if c.peers.closed {
		unknown = true
	}
	var left []unix.PollFd
	for _, fd := range c.peers.fds {
		d, err := unix.Dup(fd)
		if err != nil {
			unknown = true // a process not watched is not proven gone
			continue
		}
		left = append(left, unix.PollFd{Fd: int32(d), Events: unix.POLLIN})
	}
	c.peers.mu.Unlock()
	defer func() {
		for _, p := range left {
			_ = unix.Close(int(p.Fd))
		}
	}()
	if unknown {
		return ErrPeerUnknown
	}
	// One poll over every pidfd still open; an exited process's pidfd
	// reads ready. A timeout, or an interrupted poll, proves nothing.
	for len(left) > 0 {
		if n, err := unix.Poll(left, 100); err == nil && n > 0 {
			open := left[:0]
			for _, p := range left {
				if p.Revents&(unix.POLLIN|unix.POLLHUP) != 0 {
					_ = unix.Close(int(p.Fd)) // exited
					continue
				}
				p.Revents = 0
				open = append(open, p)
			}
			left = open
		}
		if err := ctx.Err(); err != nil && len(left) > 0 {
			return err
		}
	}
	return nil
}

package conn

import (
	"context"
	"net"
	"os"
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
	unknown bool // a transport whose peer could not be pinned
	closed  bool
}

// add pins the process behind a freshly dialled transport: by
// SO_PEERPIDFD where the kernel has it (Linux 6.5; it works across pid
// namespaces), else by its pid from SO_PEERCRED.
func (p *peers) add(c *net.UnixConn) {
	pidfd, pid := -1, 0
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
	if pidfd < 0 && pid > 0 && pid != os.Getpid() {
		if f, err := unix.PidfdOpen(pid, 0); err == nil {
			pidfd = f
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
	if pidfd < 0 {
		// A server in this very process (tests), or one that cannot be
		// pinned: nothing to wait on.
		p.unknown = true
		return
	}
	p.fds = append(p.fds, pidfd)
}

func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, fd := range p.fds {
		_ = unix.Close(fd)
	}
	p.fds = nil
}

// WaitPeersGone waits until every server process this connection has had a
// transport to has exited, or ctx ends. A transfer that failed with
// ErrUnavailable holds its buffers until then: the server may still be
// copying. Peers that cannot be pinned (a server in another pid namespace,
// or in this process) are not waited for.
func (c *Conn) WaitPeersGone(ctx context.Context) error {
	// Duplicates, so that a concurrent Close cannot pull them away.
	c.peers.mu.Lock()
	var fds []int
	for _, fd := range c.peers.fds {
		if d, err := unix.Dup(fd); err == nil {
			fds = append(fds, d)
		}
	}
	c.peers.mu.Unlock()
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}()
	for _, fd := range fds {
		for {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, 100)
			if err == nil && n > 0 && pfd[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0 {
				break // exited
			}
			// Anything else proves nothing: look again until ctx ends.
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

package conn

import (
	"context"
	"errors"
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

// add pins the process behind a freshly dialled transport.
func (p *peers) add(c *net.UnixConn) {
	pid := 0
	if raw, err := c.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid = int(cred.Pid)
			}
		})
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if pid <= 0 || pid == os.Getpid() {
		// Another pid namespace, or a server in this very process (tests):
		// nothing to wait on.
		p.unknown = true
		return
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		p.unknown = true
		return
	}
	p.fds = append(p.fds, fd)
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
	c.peers.mu.Lock()
	fds := append([]int(nil), c.peers.fds...)
	c.peers.mu.Unlock()
	for _, fd := range fds {
		for {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, 100)
			if err != nil && !errors.Is(err, unix.EINTR) {
				return err
			}
			if n > 0 {
				break
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

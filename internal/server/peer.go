package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/umbp-go/umbp-go/internal/sockio"
)

// peerCred returns the credentials (SO_PEERCRED) of the process at the other
// end of c, as they were when the connection was made.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	return cred, nil
}

// proc is a client process as a registration names it: its pid and a pidfd
// (non-blocking, owned by whoever holds the proc) that tells when it exits.
type proc struct {
	pid   int32
	pidfd *os.File
}

func (p *proc) close() {
	if p != nil {
		_ = p.pidfd.Close()
	}
}

// peerProc returns the process at the other end of c: the pidfd the kernel
// took at connect time (SO_PEERPIDFD, Linux 6.5), else one opened from the
// SO_PEERCRED pid (which names the same process unless it exited and its pid
// was reused since it connected).
func peerProc(c *net.UnixConn) (*proc, error) {
	cred, err := peerCred(c)
	if err != nil {
		return nil, err
	}
	if cred.Pid <= 0 {
		return nil, errPidHidden
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var serr error
	if err := rc.Control(func(s uintptr) {
		fd, serr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return nil, err
	}
	switch {
	case serr == nil:
		return newProc(cred.Pid, fd)
	case errors.Is(serr, unix.ESRCH):
		return nil, fmt.Errorf("process %d: %w", cred.Pid, errPeerGone)
	}
	return openProc(cred.Pid) // before Linux 6.5
}

// errPeerGone: the process that sent a registration has exited already.
var errPeerGone = errors.New("the registering process has exited")

// errPidHidden: the peer runs in a pid namespace this process cannot see.
var errPidHidden = errors.New("the peer's pid is not visible from this pid namespace")

// openProc opens a pidfd for pid.
func openProc(pid int32) (*proc, error) {
	if pid <= 0 {
		return nil, errPidHidden
	}
	fd, err := unix.PidfdOpen(int(pid), 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("process %d: %w", pid, errPeerGone)
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	return newProc(pid, fd)
}

// newProc takes over pidfd fd, made non-blocking so that the runtime's poller
// waits on it (a pidfd is readable once its process has exited). A process
// that has exited already is errPeerGone.
func newProc(pid int32, fd int) (*proc, error) {
	if pidfdExited(fd) {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("process %d: %w", pid, errPeerGone)
	}
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("pidfd of %d: %w", pid, err)
	}
	return &proc{pid: pid, pidfd: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))}, nil
}

// pidfdExited reports whether the process of pidfd fd has exited, without
// waiting.
func pidfdExited(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && p[0].Revents != 0
	}
}

// peerAuth is what peerCreds learn of a gRPC connection: its peer's
// credentials when it came over a Unix socket.
type peerAuth struct {
	credentials.CommonAuthInfo
	cred *unix.Ucred // nil when unknown
}

func (peerAuth) AuthType() string { return "unix-peercred" }

// peerCreds are transport credentials that change nothing on the wire (the
// connection stays plaintext, as with insecure credentials, so every client
// that speaks to MORI's server speaks to this one) and record the peer's
// SO_PEERCRED, so that a GPU registration can name the process it belongs to.
type peerCreds struct {
	wrap func(net.Conn) net.Conn // Options.WrapConn
}

func (peerCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerAuth{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (p peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	a := peerAuth{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	if uc, ok := c.(*net.UnixConn); ok {
		if cred, err := peerCred(uc); err == nil {
			a.cred = cred
		}
	}
	// Read and written with raw system calls, as the client's connections
	// are: net.Conn's Read and Write enter the runtime's system-call state,
	// and the first entry after the server was idle wakes the runtime's
	// monitor thread, which then checks every 20 µs for a millisecond,
	// each check displacing a copy on a host whose CPUs all copy (see
	// docs/PERFORMANCE.md).
	c = sockio.Wrap(c)
	if p.wrap != nil {
		c = p.wrap(c)
	}
	return c, a, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (p peerCreds) Clone() credentials.TransportCredentials { return p }

func (peerCreds) OverrideServerName(string) error { return nil }

// callerPid is the pid of the process that made the call in ctx, or 0 when
// unknown.
func callerPid(ctx context.Context) int32 {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return 0
	}
	if a, ok := p.AuthInfo.(peerAuth); ok && a.cred != nil {
		return a.cred.Pid
	}
	return 0
}

package conn

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// How far the latest dial of a connection got, until a server first
// answered (Conn.handshake).
const (
	noDial     int32 = iota // nothing tried yet
	noSocket                // no socket file at the path
	noListener              // a socket file, but nobody listening (a server that died)
	noAccess                // the socket file may not be connected to
	silent                  // connected; not a byte back yet
	hungUp                  // connected; closed without a byte
	answered                // the server sent something
)

// firstRead watches a transport until its first byte: a socket that
// accepts and hangs up without a byte is no gRPC server; one that sends
// nothing is stopped or stuck. Past the first byte it only passes reads on.
type firstRead struct {
	net.Conn
	c    *Conn
	seen atomic.Bool
}

func (f *firstRead) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	if !f.seen.Load() {
		switch {
		case n > 0:
			f.seen.Store(true)
			f.c.handshake.Store(answered)
		case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			f.c.handshake.CompareAndSwap(silent, hungUp)
		}
	}
	return n, err
}

// diagnose says why a server never answered Dial's pings within waited,
// from how far the dials got and the last attempt's error, in words an
// operator acts on.
func (c *Conn) diagnose(last error, waited time.Duration) string {
	what := "no answer"
	if last != nil {
		what = "last attempt: " + last.Error()
	}
	switch c.handshake.Load() {
	case noSocket:
		return fmt.Sprintf("no socket file there; start umbp_standalone_server on this host first (waited %v)", waited)
	case noListener:
		return "its socket file is there but no server listens on it (a server that exited without removing it?); start umbp_standalone_server again"
	case noAccess:
		return "its socket file may not be connected to by this user: " + what
	case silent:
		return fmt.Sprintf("a process accepted the connection but never answered within %v (a stopped or overloaded server?)", waited)
	case hungUp:
		return "the socket hung up without speaking gRPC (the server's fd-handoff socket, or another program's?)"
	case answered:
		return fmt.Sprintf("the server was not ready within %v (stalled, or still starting?); %s", waited, what)
	}
	return fmt.Sprintf("not ready within %v; %s", waited, what)
}

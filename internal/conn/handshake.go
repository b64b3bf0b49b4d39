package conn

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// Write notices a peer that hung up before gRPC could even send its
// preface: the write fails where no read has been tried yet.
func (f *firstRead) Write(p []byte) (int, error) {
	n, err := f.Conn.Write(p)
	if err != nil && !f.seen.Load() && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		f.c.handshake.CompareAndSwap(silent, hungUp)
	}
	return n, err
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

// diagnose says why a server did not answer Dial's Ping, from how far the
// dial got and the call's error, in words an operator acts on.
func (c *Conn) diagnose(err error) string {
	switch c.handshake.Load() {
	case noSocket:
		// The endpoint is named by the caller; whether its directory is
		// there tells a typo in the directory from a server not started.
		if _, err := os.Stat(filepath.Dir(c.grpcPath)); errors.Is(err, fs.ErrNotExist) {
			return "no socket file there, nor its directory: check Endpoint for a typo, or start umbp_standalone_server on this host first"
		}
		return "no socket file there: check Endpoint for a typo, or start umbp_standalone_server on this host first"
	case noListener:
		return "its socket file is there but no server listens on it (a server that exited without removing it?); start umbp_standalone_server again"
	case noAccess:
		return "its socket file may not be connected to by this user: " + err.Error()
	case silent:
		return "a process accepted the connection but never answered (a stopped or overloaded server?)"
	case hungUp:
		return "the socket hung up without speaking gRPC (the server's fd-handoff socket, or another program's?)"
	case answered:
		if c := status.Code(err); c == codes.DeadlineExceeded || c == codes.Canceled {
			return "the server was not ready (stalled, or still starting?)"
		}
		return "the server was not ready (stalled, or still starting?): " + err.Error()
	}
	return err.Error()
}

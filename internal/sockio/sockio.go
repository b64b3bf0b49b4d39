// Package sockio reads and writes the net package's own Unix and TCP
// sockets with raw system calls.
//
// net.Conn's Read and Write enter the runtime's system-call state, and in
// a process that was idle (a client waiting for its server, a server for
// its clients) each entry wakes the runtime's monitor thread: a thread
// switch a call, and in a server a millisecond of checks every 20 µs that
// displace its copies where they use every CPU. A read or
// write of a non-blocking socket never blocks in the kernel, so it needs
// no such entry; waiting for the socket stays the runtime's
// (syscall.RawConn's), with the connection's deadlines and Close. Under
// the race detector the calls are syscall's Read and Write, which tell it
// what the kernel read and wrote.
package sockio

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// IO reads and writes one socket. One goroutine may read and one write
// at a time (Wrap's connection takes any number): each keeps its buffer
// and its result in the IO, so that a read or a write allocates nothing.
type IO struct {
	network string   // "unix" or "tcp", for errors
	addr    net.Addr // the peer, for errors; nil if unknown
	r, w    half
}

// half is one direction of an IO: the buffer of the read or write in
// progress, what it did, and the callback its RawConn method runs.
type half struct {
	mu   *sync.Mutex                       // held by run when the IO is shared (Wrap)
	wait func(func(fd uintptr) bool) error // RawConn's Read or Write
	once func(fd uintptr) bool             // IO's read or write
	b    []byte
	n    int
	err  error
}

// run hands b to the half's callback through its RawConn method, and
// returns the bytes moved and the error of the callback or of the wait.
func (h *half) run(b []byte) (int, error) {
	if h.mu != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
	}
	h.b, h.n, h.err = b, 0, nil
	err := h.wait(h.once)
	if err == nil {
		err = h.err
	}
	n := h.n
	h.b, h.err = nil, nil
	return n, err
}

// New returns c's raw reader and writer, or nil when c is not the
// net package's own Unix or TCP connection (a connection of another type
// may do more in its Read and Write than the socket's), or its socket is
// not non-blocking (a raw read would then block the runtime's processor).
func New(c net.Conn) *IO {
	var sc syscall.Conn
	var network string
	switch c := c.(type) {
	case *net.UnixConn:
		sc, network = c, "unix"
	case *net.TCPConn:
		sc, network = c, "tcp"
	default:
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	nonBlocking := false
	if err := rc.Control(func(fd uintptr) {
		fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		nonBlocking = err == nil && fl&unix.O_NONBLOCK != 0
	}); err != nil || !nonBlocking {
		return nil
	}
	s := &IO{network: network, addr: c.RemoteAddr()}
	s.r = half{wait: rc.Read, once: s.read}
	s.w = half{wait: rc.Write, once: s.write}
	return s
}

// Read is net.Conn's Read.
func (s *IO) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, err := s.r.run(b)
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read is one read of the socket into r.b; false: wait until it is readable.
func (s *IO) read(fd uintptr) bool {
	for {
		r, e := sysRead(fd, s.r.b)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			s.r.n = r
		default:
			s.r.err = os.NewSyscallError("read", e)
		}
		return true
	}
}

// Write is net.Conn's Write: all of b, or an error.
func (s *IO) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, err := s.w.run(b)
	if err != nil {
		return n, s.opError("write", err)
	}
	return n, nil
}

// write writes what is left of w.b; false: wait until the socket is writable.
func (s *IO) write(fd uintptr) bool {
	for s.w.n < len(s.w.b) {
		r, e := sysWrite(fd, s.w.b[s.w.n:])
		switch {
		case e == unix.EINTR:
		case e == unix.EAGAIN:
			return false
		case e != 0:
			s.w.err = os.NewSyscallError("write", e)
			return true
		case r <= 0 || r > len(s.w.b)-s.w.n: // as poll.FD's Write
			s.w.err = io.ErrUnexpectedEOF
			return true
		default:
			s.w.n += r
		}
	}
	return true
}

// opError is err as net.Conn's Read and Write return it: RawConn's own
// error (the connection closed, a deadline) renamed, the others wrapped.
func (s *IO) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		e := *oe
		e.Op = op
		return &e
	}
	e := &net.OpError{Op: op, Net: s.network, Err: err}
	if s.addr != nil {
		e.Addr = s.addr
	}
	return e
}

// Wrap returns c with its Read and Write made as an IO's, safe for
// concurrent use as a net.Conn is (for a transport that reads and writes
// from goroutines of its own, grpc-go's); c itself when New refuses it.
// The result is no longer one of the net package's types: grpc-go then
// reads it through a buffer of its own rather than its pooled one, shows
// no socket options in channelz, and could not set TCP_USER_TIMEOUT on a
// TCP connection (its keepalive; a Unix socket has none).
func Wrap(c net.Conn) net.Conn {
	s := New(c)
	if s == nil {
		return c
	}
	s.r.mu, s.w.mu = new(sync.Mutex), new(sync.Mutex)
	return &conn{Conn: c, s: s}
}

// conn is a net.Conn read and written through a shared IO.
type conn struct {
	net.Conn
	s *IO
}

func (c *conn) Read(b []byte) (int, error)  { return c.s.Read(b) }
func (c *conn) Write(b []byte) (int, error) { return c.s.Write(b) }

package h2call

import (
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// sockIO reads and writes a non-blocking socket with raw system calls.
// net.Conn's own reads and writes enter the runtime's system-call state,
// and in a process that was idle (a call waiting for its server) each
// entry wakes the runtime's monitor thread: a thread switch a call. A
// read or write of a non-blocking socket never blocks in the kernel, so
// it needs no such entry; waiting for the socket stays the runtime's
// (syscall.RawConn's), with the connection's deadlines and Close.
//
// One goroutine reads and one writes at a time, as a connection's call
// does: each keeps its buffer and its result in the sockIO, so that a
// read or a write allocates nothing.
type sockIO struct {
	rc   syscall.RawConn
	addr net.Addr // for errors

	rb        []byte
	rn        int
	rerr      error
	readOnce  func(fd uintptr) bool
	wb        []byte
	wn        int
	werr      error
	writeSome func(fd uintptr) bool
}

// newSockIO returns c's raw reader and writer, or nil when c is not the
// net package's own Unix or TCP connection (a connection of another type
// may do more in its Read and Write than the socket's), or its socket is
// not non-blocking (a raw read would then block the runtime's processor).
func newSockIO(c net.Conn) *sockIO {
	var sc syscall.Conn
	switch c := c.(type) {
	case *net.UnixConn:
		sc = c
	case *net.TCPConn:
		sc = c
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
	s := &sockIO{rc: rc, addr: c.RemoteAddr()}
	s.readOnce, s.writeSome = s.read, s.write
	return s
}

// Read is net.Conn's Read.
func (s *sockIO) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s.rb, s.rn, s.rerr = b, 0, nil
	err := s.rc.Read(s.readOnce)
	n := s.rn
	if err == nil {
		err = s.rerr
	}
	s.rb, s.rerr = nil, nil
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read is one read of the socket into rb; false: wait until it is readable.
func (s *sockIO) read(fd uintptr) bool {
	for {
		r, e := sysRead(fd, s.rb)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			s.rn = r
		default:
			s.rerr = os.NewSyscallError("read", e)
		}
		return true
	}
}

// Write is net.Conn's Write: all of b, or an error.
func (s *sockIO) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s.wb, s.wn, s.werr = b, 0, nil
	err := s.rc.Write(s.writeSome)
	n := s.wn
	if err == nil {
		err = s.werr
	}
	s.wb, s.werr = nil, nil
	if err != nil {
		return n, s.opError("write", err)
	}
	return n, nil
}

// write writes what is left of wb; false: wait until the socket is writable.
func (s *sockIO) write(fd uintptr) bool {
	for s.wn < len(s.wb) {
		r, e := sysWrite(fd, s.wb[s.wn:])
		switch {
		case e == unix.EINTR:
		case e == unix.EAGAIN:
			return false
		case e != 0:
			s.werr = os.NewSyscallError("write", e)
			return true
		case r <= 0 || r > len(s.wb)-s.wn: // as poll.FD's Write
			s.werr = io.ErrUnexpectedEOF
			return true
		default:
			s.wn += r
		}
	}
	return true
}

// opError is err as net.Conn's Read and Write return it: RawConn's own
// error (the connection closed, a deadline) renamed, the others wrapped.
func (s *sockIO) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		e := *oe
		e.Op = op
		return &e
	}
	e := &net.OpError{Op: op, Net: "unix", Err: err}
	if s.addr != nil {
		e.Net, e.Addr = s.addr.Network(), s.addr
	}
	return e
}

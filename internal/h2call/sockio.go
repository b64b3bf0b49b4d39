package h2call

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

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
	rerr      syscall.Errno
	readOnce  func(fd uintptr) bool
	wb        []byte
	wn        int
	werr      syscall.Errno
	writeSome func(fd uintptr) bool
}

// newSockIO returns c's raw reader and writer, or nil when c is not the
// net package's own Unix or TCP connection (a connection of another type
// may do more in its Read and Write than the socket's).
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
	s := &sockIO{rc: rc, addr: c.RemoteAddr()}
	s.readOnce, s.writeSome = s.read, s.write
	return s
}

// Read is net.Conn's Read.
func (s *sockIO) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s.rb, s.rn, s.rerr = b, 0, 0
	err := s.rc.Read(s.readOnce)
	n, errno := s.rn, s.rerr
	s.rb = nil
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case errno != 0:
		return 0, s.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read is one read of the socket into rb; false: wait until it is readable.
func (s *sockIO) read(fd uintptr) bool {
	for {
		r, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&s.rb[0])), uintptr(len(s.rb)))
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			s.rn = int(r)
		default:
			s.rerr = e
		}
		return true
	}
}

// Write is net.Conn's Write: all of b, or an error.
func (s *sockIO) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s.wb, s.wn, s.werr = b, 0, 0
	err := s.rc.Write(s.writeSome)
	n, errno := s.wn, s.werr
	s.wb = nil
	switch {
	case err != nil:
		return n, s.opError("write", err)
	case errno != 0:
		return n, s.opError("write", errno)
	}
	return n, nil
}

// write writes what is left of wb; false: wait until the socket is writable.
func (s *sockIO) write(fd uintptr) bool {
	for s.wn < len(s.wb) {
		r, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&s.wb[s.wn])), uintptr(len(s.wb)-s.wn))
		switch e {
		case 0:
			s.wn += int(r)
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			s.werr = e
			return true
		}
	}
	return true
}

// opError is err as net.Conn's Read and Write return it.
func (s *sockIO) opError(op string, err error) error {
	if errno, ok := err.(syscall.Errno); ok {
		err = os.NewSyscallError(op, errno)
	}
	return &net.OpError{Op: op, Net: s.addr.Network(), Addr: s.addr, Err: err}
}

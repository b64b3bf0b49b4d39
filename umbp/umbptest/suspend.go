package umbptest

import (
	"net"
	"sync"
)

// suspendableListener hands gRPC connections that stop while their process
// is suspended (Master.Suspend): a stopped process neither reads nor
// writes, though the kernel still completes TCP connections for it.
type suspendableListener struct {
	net.Listener
	faults *faults
	done   <-chan struct{} // the generation's: closed when it is killed
}

func (l *suspendableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &suspendableConn{Conn: c, faults: l.faults, done: l.done, closed: make(chan struct{})}, nil
}

// suspendableConn holds every Read and Write while its process is
// suspended. Bytes that a Read already waiting took from the kernel during
// a suspension are held too, until it ends: nothing reaches gRPC meanwhile.
// Closing the connection or killing the process releases what it holds.
type suspendableConn struct {
	net.Conn
	faults *faults
	done   <-chan struct{}

	once   sync.Once
	closed chan struct{}
}

// hold waits while the process is suspended.
func (c *suspendableConn) hold() error {
	ch := c.faults.suspension()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-c.closed:
	case <-c.done:
	}
	return net.ErrClosed
}

func (c *suspendableConn) Read(b []byte) (int, error) {
	if err := c.hold(); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		if herr := c.hold(); herr != nil {
			return 0, herr
		}
	}
	return n, err
}

func (c *suspendableConn) Write(b []byte) (int, error) {
	if err := c.hold(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *suspendableConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

package sockio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// connected is a connected Unix socket pair (a *net.UnixConn each),
// closed when the test ends.
func connected(t *testing.T) (client, server net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	t.Cleanup(func() { conns[0].Close(); conns[1].Close() })
	return conns[0], conns[1]
}

var longAgo = time.Unix(1, 0)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMovesEveryByte(t *testing.T) {
	client, server := connected(t)
	s := New(client)
	if s == nil {
		t.Fatal("no IO for a *net.UnixConn")
	}
	// More than the socket's buffers: the write waits for the reader, in
	// pieces, and must resume where it stopped.
	want := make([]byte, 8<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(server, int64(len(want))))
		got <- b
	}()
	if n, err := s.Write(want); err != nil || n != len(want) {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(want))
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the server read %d bytes, not what was written", len(b))
	}

	// Back the other way, then the server's close is io.EOF.
	go func() {
		server.Write(want[:1<<20])
		server.Close()
	}()
	b, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(b, want[:1<<20]) {
		t.Fatalf("read %d bytes, %v; want %d, nil", len(b), err, 1<<20)
	}
	if n, err := s.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("Read after the peer closed = %d, %v; want 0, io.EOF", n, err)
	}
}

func TestErrorsAsNetConn(t *testing.T) {
	client, _ := connected(t)
	s := New(client)

	// A read waiting on a silent peer ends at the deadline (how a call's
	// context interrupts it), as a timeout.
	client.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, err := s.Read(make([]byte, 1))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past the deadline: %v; want a timeout", err)
	}
	client.SetReadDeadline(time.Time{})

	client.Close()
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close: %v; want net.ErrClosed", err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v; want net.ErrClosed", err)
	}
}

func TestWriteToAGonePeer(t *testing.T) {
	client, server := connected(t)
	s := New(client)
	server.Close()
	var err error
	for range 100 { // the first writes may still be buffered
		if _, err = s.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	var oe *net.OpError
	if err == nil || !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("Write to a closed peer: %v; want a write *net.OpError", err)
	}
}

// wrapped is a connection whose Read does more than the socket's.
type wrapped struct {
	*net.UnixConn
	reads int
}

func (w *wrapped) Read(b []byte) (int, error) { w.reads++; return w.UnixConn.Read(b) }

func TestOnlyForTheNetPackagesConns(t *testing.T) {
	client, _ := connected(t)
	if s := New(&wrapped{UnixConn: client.(*net.UnixConn)}); s != nil {
		t.Fatal("a wrapping connection's Read would be bypassed")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if s := New(a); s != nil {
		t.Fatal("an IO for a net.Pipe")
	}
}

func TestAllocatesNothing(t *testing.T) {
	client, server := connected(t)
	s := New(client)
	msg, buf := []byte("0123456789"), make([]byte, 10)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := server.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("a write and a read allocate %v objects, want 0", allocs)
	}
}

// tcpConnected is a connected loopback TCP pair, closed when the test ends.
func tcpConnected(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		client.Close()
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestInterruptedWhileWaiting is what a call's context does
// (conn.interrupt): a deadline in the past set from another goroutine
// while a write waits on a full socket, or a read on a silent peer.
func TestInterruptedWhileWaiting(t *testing.T) {
	for name, pair := range map[string]func(*testing.T) (net.Conn, net.Conn){"unix": connected, "tcp": tcpConnected} {
		t.Run(name, func(t *testing.T) {
			client, _ := pair(t)
			s := New(client)
			if s == nil {
				t.Fatalf("no IO for %T", client)
			}
			// The deadline is set once, from outside the call: if the
			// call was not waiting yet it fails as it starts, as it would
			// have on waking.
			interrupt := func(waiting func() (int, error)) (int, error) {
				type result struct {
					n   int
					err error
				}
				done := make(chan result, 1)
				go func() {
					n, err := waiting()
					done <- result{n, err}
				}()
				client.SetDeadline(longAgo)
				r := <-done
				client.SetDeadline(time.Time{})
				return r.n, r.err
			}
			big := make([]byte, 64<<20) // more than the socket's buffers: the peer reads nothing
			n, err := interrupt(func() (int, error) { return s.Write(big) })
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() || n >= len(big) {
				t.Fatalf("interrupted Write = %d, %v; want fewer than %d bytes and a timeout", n, err, len(big))
			}
			if _, err := interrupt(func() (int, error) { return s.Read(make([]byte, 1)) }); !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("interrupted Read: %v; want a timeout", err)
			}
		})
	}
}

func TestErrorsNameTheirOp(t *testing.T) {
	client, _ := connected(t)
	s := New(client)
	client.Close()
	_, err := s.Read(make([]byte, 1))
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("Read after Close: %v; want a read *net.OpError", err)
	}
	if errors.As(oe.Err, new(*net.OpError)) {
		t.Fatalf("Read after Close: %v: an OpError wrapped in another", err)
	}
}

// TestWrap: the wrapped connection is written by several goroutines at
// once, as grpc-go's transport may, each write whole; and a read waiting
// on it is ended by Close, which takes none of its locks.
func TestWrap(t *testing.T) {
	client, server := connected(t)
	w := Wrap(client)
	if _, ok := w.(*conn); !ok {
		t.Fatalf("Wrap(%T) = %T, want the connection read through an IO", client, w)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Wrap(a) != a {
		t.Fatal("Wrap of a net.Pipe is not the pipe itself")
	}

	// Each writer its own 64 KiB message (more than one write of the
	// socket): a write cut by another's would show in the stream.
	const writers, each, size = 4, 50, 64 << 10
	done := make(chan error, writers)
	for g := range writers {
		msg := bytes.Repeat([]byte{byte('a' + g)}, size)
		go func() {
			for range each {
				if _, err := w.Write(msg); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range writers * each {
			if _, err := io.ReadFull(server, buf); err != nil {
				got <- err
				return
			}
			if bytes.Count(buf, buf[:1]) != size {
				got <- errors.New("a message interleaved with another")
				return
			}
		}
		got <- nil
	}()
	for range writers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}

	// A read waiting on a silent peer, holding the read lock, ends when
	// the connection is closed (or fails at once, closed before it began).
	read := make(chan error, 1)
	go func() {
		_, err := w.Read(make([]byte, 1))
		read <- err
	}()
	w.Close()
	if err := <-read; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a read ended by Close: %v; want net.ErrClosed", err)
	}
}

package h2call

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// connected is a connected Unix socket pair (a *net.UnixConn each),
// closed when the test ends.
func connected(t *testing.T) (client, server net.Conn) {
	t.Helper()
	client, server, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestSockIOMovesEveryByte(t *testing.T) {
	client, server := connected(t)
	s := newSockIO(client)
	if s == nil {
		t.Fatal("no sockIO for a *net.UnixConn")
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

func TestSockIOErrorsAsNetConn(t *testing.T) {
	client, _ := connected(t)
	s := newSockIO(client)

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

func TestSockIOWriteToAGonePeer(t *testing.T) {
	client, server := connected(t)
	s := newSockIO(client)
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

func TestSockIOOnlyForTheNetPackagesConns(t *testing.T) {
	client, _ := connected(t)
	if s := newSockIO(&wrapped{UnixConn: client.(*net.UnixConn)}); s != nil {
		t.Fatal("a wrapping connection's Read would be bypassed")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if s := newSockIO(a); s != nil {
		t.Fatal("sockIO for a net.Pipe")
	}
}

func TestSockIOAllocatesNothing(t *testing.T) {
	client, server := connected(t)
	s := newSockIO(client)
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

// TestSockIOInterruptedWhileWaiting is what a call's context does
// (conn.interrupt): a deadline in the past set from another goroutine
// while a write waits on a full socket, or a read on a silent peer.
func TestSockIOInterruptedWhileWaiting(t *testing.T) {
	for name, pair := range map[string]func(*testing.T) (net.Conn, net.Conn){"unix": connected, "tcp": tcpConnected} {
		t.Run(name, func(t *testing.T) {
			client, _ := pair(t)
			s := newSockIO(client)
			if s == nil {
				t.Fatalf("no sockIO for %T", client)
			}
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
				for {
					// Set again until the call returns: the first may come
					// before it waits, and a deadline is cleared by nobody.
					client.SetDeadline(longAgo)
					select {
					case r := <-done:
						client.SetDeadline(time.Time{})
						return r.n, r.err
					case <-time.After(10 * time.Millisecond):
					}
				}
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

func TestSockIOErrorsNameTheirOp(t *testing.T) {
	client, _ := connected(t)
	s := newSockIO(client)
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

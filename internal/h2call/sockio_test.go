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

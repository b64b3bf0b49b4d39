package server

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// acceptedPair returns both ends of a Unix socket connection: the one the
// server accepted and the one the client dialled.
func acceptedPair(t *testing.T) (accepted *net.UnixConn, dialled net.Conn) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(shortDir(t), "p.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialled, err = net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dialled.Close() })
	accepted, err = ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = accepted.Close() })
	return accepted, dialled
}

// The handshake records the peer's credentials, then hands gRPC the
// connection read and written with raw system calls (internal/sockio),
// not the net package's own, and Options.WrapConn wraps that.
func TestServerHandshake(t *testing.T) {
	accepted, dialled := acceptedPair(t)
	var wrapped net.Conn
	creds := peerCreds{wrap: func(c net.Conn) net.Conn { wrapped = c; return c }}
	c, info, err := creds.ServerHandshake(accepted)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := info.(peerAuth)
	if !ok || a.cred == nil || a.cred.Pid != int32(os.Getpid()) {
		t.Fatalf("auth info %#v: want this process's credentials (pid %d)", info, os.Getpid())
	}
	if _, ok := c.(*net.UnixConn); ok {
		t.Fatal("the handshake returned the net package's own connection: its Read and Write enter the runtime's system-call state")
	}
	if wrapped != c {
		t.Fatalf("WrapConn saw %T, and the handshake returned %T: want WrapConn to wrap the raw connection", wrapped, c)
	}

	// Both ways through the returned connection.
	if _, err := dialled.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
		t.Fatalf("read %q, %v: want ping", got, err)
	}
	if _, err := c.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(dialled, got); err != nil || string(got) != "pong" {
		t.Fatalf("read %q, %v: want pong", got, err)
	}
	if a, d := c.RemoteAddr(), accepted.RemoteAddr(); a.String() != d.String() {
		t.Fatalf("remote address %v, want the socket's %v", a, d)
	}
}

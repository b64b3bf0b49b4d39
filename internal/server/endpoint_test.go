package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// TestRefusesLiveEndpoint: a second server on a live server's endpoint
// fails at once, naming the live one's pid, and the first keeps serving on
// both sockets; with Replace it starts.
func TestRefusesLiveEndpoint(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	_, err := New(Options{Endpoint: h.srv.Endpoint(), Capacity: 1 << 20, Logger: testLogger()})
	if !errors.Is(err, ErrEndpointInUse) {
		t.Fatalf("second server on a live endpoint: %v; want ErrEndpointInUse", err)
	}
	if want := fmt.Sprintf("pid %d", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the live server (%s)", err, want)
	}
	if r, err := h.c.Ping(ctxT(t), &umbppb.Empty{}); err != nil || !r.GetReady() {
		t.Fatalf("first server after the refusal: %v, %v", r, err)
	}
	m := newMemfd(t, 4096)
	h.register(t, "c", m) // its fd socket is still its own

	// Only the fd socket live (say, the gRPC one was removed by hand).
	grpcPath, fdPath, _ := fdpass.SocketPaths(h.srv.Endpoint())
	if err := os.Remove(grpcPath); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Endpoint: h.srv.Endpoint(), Capacity: 1 << 20, Logger: testLogger()}); !errors.Is(err, ErrEndpointInUse) || !strings.Contains(err.Error(), fdPath) {
		t.Fatalf("second server with the fd socket live: %v; want ErrEndpointInUse naming %s", err, fdPath)
	}

	s2, err := New(Options{Endpoint: h.srv.Endpoint(), Capacity: 1 << 20, Logger: testLogger(), Replace: true})
	if err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReplacesStaleEndpoint: sockets whose server is gone (nobody listens)
// are replaced without Replace.
func TestReplacesStaleEndpoint(t *testing.T) {
	dir := shortDir(t)
	grpcPath := filepath.Join(dir, "s.grpc.sock")
	_, fdPath, err := fdpass.SocketPaths(grpcPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{grpcPath, fdPath} {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		_ = ln.Close() // the socket file stays, with no listener
	}
	h := newHarness(t, Options{Endpoint: grpcPath, Capacity: 1 << 20})
	if r, err := h.c.Ping(ctxT(t), &umbppb.Empty{}); err != nil || !r.GetReady() {
		t.Fatalf("server on stale sockets: %v, %v", r, err)
	}
	h.register(t, "c", newMemfd(t, 4096))
}

package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestRefusesWhatIsNotASocket: a regular file, an empty directory, a
// directory with a file in it, a symbolic link or a named pipe at either
// socket path stops the server from starting, Replace or not: the error
// names the path and what is there, and nothing at either path changes.
func TestRefusesWhatIsNotASocket(t *testing.T) {
	kinds := []struct {
		name, want string
		make       func(t *testing.T, path string)
	}{
		{"file", "is a regular file of 10 bytes", func(t *testing.T, p string) {
			if err := os.WriteFile(p, []byte("important\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"empty dir", "is an empty directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"dir", "is a directory of 1 entry", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(p, "keep"), []byte("important\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink", "is a symbolic link to ", func(t *testing.T, p string) {
			if err := os.Symlink(p+".target", p); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo", "is a named pipe", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, k := range kinds {
		for _, which := range []string{"grpc", "fd"} {
			for _, replace := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s at the %s path, replace %v", k.name, which, replace), func(t *testing.T) {
					dir := shortDir(t)
					grpcPath := filepath.Join(dir, "n.grpc.sock")
					_, fdPath, err := fdpass.SocketPaths(grpcPath)
					if err != nil {
						t.Fatal(err)
					}
					path := grpcPath
					if which == "fd" {
						path = fdPath
					}
					k.make(t, path)
					before := snapshot(t, dir)
					srv, err := New(Options{Endpoint: "unix://" + grpcPath, Capacity: 1 << 20, Logger: testLogger(), Replace: replace})
					if srv != nil {
						_ = srv.Close()
					}
					var nse *NotSocketError
					if !errors.As(err, &nse) || nse.Path != path {
						t.Fatalf("New: %v; want a *NotSocketError for %s", err, path)
					}
					if want := path + " " + k.want; !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
					if after := snapshot(t, dir); after != before {
						t.Errorf("the directory changed:\nbefore:\n%s\nafter:\n%s", before, after)
					}
				})
			}
		}
	}
}

// snapshot describes every entry under dir: path, mode and, for a regular
// file, its content; for a link, its target.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v", p, fi.Mode())
		switch {
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %q", data)
		case fi.Mode()&os.ModeSymlink != 0:
			to, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " -> %s", to)
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

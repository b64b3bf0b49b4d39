package umbp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// impostorUID is the uid the impostor servers run as (nobody).
const impostorUID = 65534

// wantUntrustedServer fails unless err wraps umbp.ErrUntrustedServer and
// says each of parts.
func wantUntrustedServer(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if !errors.Is(err, umbp.ErrUntrustedServer) {
		t.Fatalf("%s: %v, want ErrUntrustedServer", what, err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: %q does not say %q", what, err, p)
		}
	}
}

// handlesRefused checks that neither a worker nor a scheduler handle can be
// had from rt, with errors that say each of parts.
func handlesRefused(t *testing.T, rt *umbp.StandaloneRuntime, parts ...string) {
	t.Helper()
	ctx := context.Background()
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err == nil {
		_ = w.Close()
	}
	wantUntrustedServer(t, "NewWorkerHandle", err, parts...)
	t.Logf("NewWorkerHandle: %v", err)
	s, err := rt.NewSchedulerHandle(ctx)
	if err == nil {
		_ = s.Close()
	}
	wantUntrustedServer(t, "NewSchedulerHandle", err, parts...)
}

func TestTrustRefusesWorldWritableSocket(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	path := strings.TrimPrefix(srv.Endpoint(), "unix://")
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	handlesRefused(t, rt, path, "writable by others (mode 0666)")
	if n := srv.Calls("Ping"); n != 0 {
		t.Fatalf("the server saw %d Pings", n)
	}
	if n := srv.Calls(umbptest.FDHandoff); n != 0 {
		t.Fatalf("the server saw %d fd handoffs", n)
	}
}

// TestTrustRegisterBuffersKeepsFD: a handle attached to a trusted server
// sends no descriptor once the fd socket turns world-writable.
func TestTrustRegisterBuffersKeepsFD(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	ctx := context.Background()
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			t.Errorf("close worker: %v", err)
		}
	}()
	buf, err := umbp.NewHostBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	if err := os.Chmod(srv.FDSocketPath(), 0o666); err != nil {
		t.Fatal(err)
	}
	err = w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()})
	wantUntrustedServer(t, "RegisterBuffers", err, srv.FDSocketPath(), "writable by others (mode 0666)")
	if n := srv.Calls(umbptest.FDHandoff); n != 0 {
		t.Fatalf("the server saw %d fd handoffs", n)
	}
	if n := srv.Calls("RegisterMemory"); n != 0 {
		t.Fatalf("the server saw %d RegisterMemory calls", n)
	}
}

// impostor is the standalone server running as impostorUID.
type impostor struct {
	endpoint         string
	grpcPath, fdPath string
	pid              int
}

// startImpostor runs the umbp-standalone-server binary as impostorUID in a fresh
// directory that uid may write, and waits until it listens.
func startImpostor(t *testing.T) *impostor {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: the test runs a server as another uid")
	}
	dir := shortDir(t)
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	// A copy the impostor may execute: the build directory is closed to it.
	bin := filepath.Join(dir, "standalone-server")
	if err := copyExecutable(serverBinary(t), bin); err != nil {
		t.Fatal(err)
	}
	im := &impostor{grpcPath: filepath.Join(dir, "n.grpc.sock"), fdPath: filepath.Join(dir, "n.fd.sock")}
	im.endpoint = "unix://" + im.grpcPath
	cmd := exec.Command(bin, "-endpoint", im.endpoint, "-capacity", "4MiB", "-prefault=false", "-log-level", "error")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: impostorUID, Gid: impostorUID}}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a server as uid %d: %v", impostorUID, err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(stop)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening") {
		stop()
		t.Fatalf("server as uid %d did not start: %q %v; stderr: %s", impostorUID, line, err, stderr.String())
	}
	im.pid = cmd.Process.Pid
	return im
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

func TestTrustRefusesServerOfAnotherUser(t *testing.T) {
	im := startImpostor(t)
	rt := newRuntime(t, testConfig(t, im.endpoint))

	// Its sockets are its own.
	handlesRefused(t, rt, fmt.Sprintf("socket %s is owned by uid %d, not this user", im.grpcPath, impostorUID))

	// Sockets that look like root's do not help: the process serving them
	// is checked too.
	for _, p := range []string{im.grpcPath, im.fdPath} {
		if err := os.Chown(p, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	handlesRefused(t, rt, fmt.Sprintf("peer process pid %d on socket %s runs as uid %d", im.pid, im.grpcPath, impostorUID))
}

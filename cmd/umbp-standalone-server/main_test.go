package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildServer compiles this command into a temporary directory.
func buildServer(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build with: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "umbp-standalone-server")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestRunAndSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildServer(t)
	dir, err := os.MkdirTemp("", "umbpx")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	grpcPath := filepath.Join(dir, "sock", "node7.grpc.sock")
	fdPath := filepath.Join(dir, "sock", "node7.fd.sock")
	endpoint := "unix://" + grpcPath

	for _, tc := range []struct {
		name   string
		args   []string
		ranged bool
	}{
		{"v2", []string{"-capacity", "64MiB"}, true},
		{"v1", []string{"-capacity", "1G", "-version", "1"}, false},
		{"no ranged io", []string{"-no-ranged-io"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, append([]string{"-endpoint", endpoint}, tc.args...)...)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			ready := make(chan string, 1)
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					if line := sc.Text(); strings.HasPrefix(line, "listening on ") {
						ready <- line
					}
				}
				_, _ = io.Copy(io.Discard, stdout)
				close(ready)
			}()
			select {
			case line, ok := <-ready:
				if !ok {
					_ = cmd.Wait()
					t.Fatalf("exited before ready; stderr:\n%s", stderr.String())
				}
				if line != "listening on "+endpoint {
					t.Errorf("ready line %q", line)
				}
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("not ready within 30s; stderr:\n%s", stderr.String())
			}

			cc, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			r, err := umbppb.NewUMBPStandaloneClient(cc).Ping(ctx, &umbppb.Empty{})
			_ = cc.Close()
			if err != nil || !r.Ready || r.SupportsRangedIo != tc.ranged {
				t.Fatalf("Ping = %v, %v", r, err)
			}
			for _, p := range []string{grpcPath, fdPath} {
				if st, err := os.Lstat(p); err != nil || st.Mode().Perm() != 0o600 {
					t.Fatalf("%s: %v %v", p, st, err)
				}
			}

			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			go func() { waited <- cmd.Wait() }()
			select {
			case err := <-waited:
				if err != nil {
					t.Fatalf("exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
				}
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-waited
				t.Fatal("did not exit within 20s of SIGTERM")
			}
			for range ready {
			}
			for _, p := range []string{grpcPath, fdPath} {
				if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left behind: %v", p, err)
				}
			}
		})
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-capacity", "lots"},
		{"-capacity", "0"},
		{"-version", "3"},
		{"-endpoint", "relative.sock"},
		{"-log-level", "loud"},
		{"-gpu", "maybe"},
		{"extra"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("run(%q) = %d, want 2 (a usage error)", args, code)
		}
		if out.Len() != 0 {
			t.Errorf("run(%q) printed %q", args, out.String())
		}
	}
}

func TestRunGPUOnWithoutRuntime(t *testing.T) {
	if hip.Available() {
		t.Skip("this host has a GPU runtime")
	}
	var out, errOut bytes.Buffer
	endpoint := filepath.Join(t.TempDir(), "g.sock")
	if code := run([]string{"-gpu", "on", "-endpoint", endpoint}, &out, &errOut); code != 1 {
		t.Fatalf("-gpu on without a GPU runtime: exit %d, want 1\n%s", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "no usable GPU runtime") || out.Len() != 0 {
		t.Errorf("-gpu on without a GPU runtime: stdout %q, stderr %q", out.String(), errOut.String())
	}
	if _, err := os.Stat(endpoint); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket was created: %v", err)
	}
}

// TestRunRefusesLiveEndpoint: started where a live server answers, the
// command exits 1 at once, naming that server's pid and -replace, and the
// live server keeps serving.
func TestRunRefusesLiveEndpoint(t *testing.T) {
	dir, err := os.MkdirTemp("", "umbpx")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	endpoint := "unix://" + filepath.Join(dir, "live.grpc.sock")
	live, err := server.New(server.Options{Endpoint: endpoint, Capacity: 1 << 20, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()

	var out, errOut bytes.Buffer
	code := run([]string{"-endpoint", endpoint, "-capacity", "1MiB", "-prefault=false", "-gpu", "off"}, &out, &errOut)
	if code != 1 {
		t.Fatalf("second server on a live endpoint: exit %d, want 1\n%s", code, errOut.String())
	}
	msg := errOut.String()
	if !strings.Contains(msg, fmt.Sprintf("pid %d", os.Getpid())) || !strings.Contains(msg, "-replace") || out.Len() != 0 {
		t.Errorf("second server on a live endpoint: stdout %q, stderr %q; want the live server's pid and -replace", out.String(), msg)
	}
	cc, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r, err := umbppb.NewUMBPStandaloneClient(cc).Ping(ctx, &umbppb.Empty{}); err != nil || !r.GetReady() {
		t.Fatalf("the live server after the refused start: %v, %v", r, err)
	}
}

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
	"slices"
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
			// The start-up says what it does while it prefaults the pool
			// (by default), and when it listens.
			var at []int
			for _, want := range []string{
				`msg="umbp server: prefaulting the DRAM pool: every page is mapped before the server listens (-prefault=false skips it)"`,
				`msg="umbp server: DRAM pool prefaulted" bytes=`,
				`msg=listening endpoint=` + endpoint,
			} {
				i := strings.Index(stderr.String(), want)
				if i < 0 {
					t.Errorf("the log does not say %s:\n%s", want, stderr.String())
				}
				at = append(at, i)
			}
			if !slices.IsSorted(at) {
				t.Errorf("the start-up's lines out of order:\n%s", stderr.String())
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
	// Said once, in the flag's words, not the Go option's.
	if strings.Contains(msg, "Options.") || strings.Count(msg, "live") > 1 || strings.Count(msg, "\n") != 1 {
		t.Errorf("second server on a live endpoint: stderr %q: want one line that names no Go field", msg)
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

// TestRunRefusesWhatIsNotASocket: a regular file, an empty directory or a
// directory with a file in it at the gRPC or the fd socket path: the
// command exits 1 naming the path, what is there and -endpoint, and leaves
// it as it was.
func TestRunRefusesWhatIsNotASocket(t *testing.T) {
	for _, k := range []struct {
		name, what string
		make       func(path string) error
	}{
		{"file", "a regular file of 10 bytes", func(p string) error { return os.WriteFile(p, []byte("important\n"), 0o644) }},
		{"empty dir", "an empty directory", func(p string) error { return os.Mkdir(p, 0o755) }},
		{"dir", "a directory of 1 entry", func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(p, "keep"), []byte("important\n"), 0o644)
		}},
	} {
		for _, which := range []string{"grpc", "fd"} {
			t.Run(k.name+" at the "+which+" path", func(t *testing.T) {
				dir := t.TempDir()
				grpcPath := filepath.Join(dir, "n.grpc.sock")
				path := grpcPath
				if which == "fd" {
					path = filepath.Join(dir, "n.fd.sock")
				}
				if err := k.make(path); err != nil {
					t.Fatal(err)
				}
				before := tree(t, dir)
				var out, errOut bytes.Buffer
				if code := run([]string{"-endpoint", "unix://" + grpcPath, "-capacity", "1MiB", "-prefault=false", "-gpu", "off"}, &out, &errOut); code != 1 {
					t.Fatalf("exit %d, want 1\n%s", code, errOut.String())
				}
				want := path + " is " + k.what + ", not a socket"
				if which == "fd" {
					want = path + " (the fd socket path, derived from -endpoint) is " + k.what + ", not a socket"
				}
				if msg := errOut.String(); !strings.Contains(msg, want) || !strings.Contains(msg, "give another -endpoint") || out.Len() != 0 {
					t.Errorf("stdout %q, stderr %q; want %q and -endpoint", out.String(), msg, want)
				}
				if after := tree(t, dir); after != before {
					t.Errorf("the directory changed:\nbefore:\n%s\nafter:\n%s", before, after)
				}
			})
		}
	}
}

// tree lists every entry under dir with its mode, and a regular file's
// content.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v", p, fi.Mode())
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %q", data)
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestRunGPUProbeOneLine: without a GPU runtime, the probe says what it
// found in one short line at info level; the libraries it tried are listed
// at debug level only.
func TestRunGPUProbeOneLine(t *testing.T) {
	if hip.Available() {
		t.Skip("this host has a GPU runtime")
	}
	for _, level := range []string{"info", "debug"} {
		dir := t.TempDir()
		grpcPath := filepath.Join(dir, "n.grpc.sock")
		// A file at the endpoint ends the start right after the probe.
		if err := os.WriteFile(grpcPath, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if code := run([]string{"-endpoint", grpcPath, "-capacity", "1MiB", "-prefault=false", "-log-level", level}, &out, &errOut); code != 1 {
			t.Fatalf("exit %d, want 1\n%s", code, errOut.String())
		}
		var info, debug []string
		for l := range strings.Lines(errOut.String()) {
			switch {
			case strings.Contains(l, "level=INFO"):
				info = append(info, l)
			case strings.Contains(l, "level=DEBUG") && strings.Contains(l, "GPU runtime probe"):
				debug = append(debug, l)
			}
		}
		if len(info) != 1 || !strings.Contains(info[0], "GPU IPC registration is refused") || len(info[0]) > 200 {
			t.Errorf("-log-level %s: info lines %q; want one short line about the GPU", level, info)
		}
		if level == "info" && len(debug) != 0 || level == "debug" && len(debug) < 2 {
			t.Errorf("-log-level %s: %d debug lines listing libraries", level, len(debug))
		}
	}
}

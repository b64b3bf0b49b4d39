package docs

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
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The scenarios: each does what a document did and returns what it
// printed, with this test's paths and users in the document's words.
var scenarios = map[string]func(t *testing.T, w *world) string{
	"service: ls -l": func(t *testing.T, w *world) string {
		s := w.service(t)
		out, _ := w.run(t, asRoot, "ls", "-l", s.dir)
		return s.words(out)
	},
	"service: ping": func(t *testing.T, w *world) string {
		s := w.service(t)
		out, _ := w.run(t, asRoot, w.bin(t, "umbp"), "ping", "-endpoint", s.endpoint())
		return s.words(out)
	},
	"service: ping -trust-uid": func(t *testing.T, w *world) string {
		s := w.service(t)
		out, _ := w.run(t, asRoot, w.bin(t, "umbp"), "ping", "-endpoint", s.endpoint(), "-trust-uid", strconv.Itoa(serviceUID))
		return s.words(out)
	},
	"service: ping as a third user": func(t *testing.T, w *world) string {
		s := w.service(t)
		out, _ := w.run(t, thirdUser, w.bin(t, "umbp"), "ping", "-endpoint", s.endpoint(), "-trust-uid", strconv.Itoa(serviceUID))
		return s.words(out)
	},
	"service: a second server": func(t *testing.T, w *world) string {
		s := w.service(t)
		out, _ := w.run(t, serviceUser, w.bin(t, "umbp-standalone-server"), "-endpoint", s.endpoint(), "-prefault=false", "-gpu", "off")
		return s.words(out)
	},
	"service: bench killed": func(t *testing.T, w *world) string {
		s := w.service(t)
		return s.words(s.benchKilled(t, w))
	},
	"systemd: MORI's unit": func(t *testing.T, w *world) string {
		if _, err := os.Stat("/opt/mori/bin/umbp_standalone_server"); err == nil {
			t.Skip("MORI's server is installed here: its unit's finding is gone")
		}
		return w.verifyUnit(t, "umbp-standalone-server-mori.service", nil)
	},
	"server: a file at the endpoint": func(t *testing.T, w *world) string {
		dir := w.tempDir(t)
		path := filepath.Join(dir, "notes.grpc.sock")
		if err := os.WriteFile(path, []byte("important\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, code := w.run(t, asRoot, w.bin(t, "umbp-standalone-server"), "-endpoint", "unix://"+path, "-prefault=false", "-gpu", "off")
		if b, err := os.ReadFile(path); err != nil || string(b) != "important\n" || code != 1 {
			t.Errorf("the server exited %d and left %q (%v); want 1 and the file as it was", code, b, err)
		}
		return strings.ReplaceAll(out, dir, "/tmp")
	},
	"library: a transfer after a blocked one": blockedTransfer,
	"first program": firstProgram,
	"library: plaintext to 10.1.2.3:50051": func(t *testing.T, w *world) string {
		_, err := umbp.NewClusterRuntime(umbp.ClusterConfig{Masters: []string{"10.1.2.3:50051"}})
		if err == nil {
			t.Fatal("plaintext to a master off loopback accepted")
		}
		return err.Error()
	},
	"server: reply texts": func(t *testing.T, w *world) string {
		return server.MsgFDRegistrationNotFound + "\n" + server.MsgShuttingDown
	},
}

// The users the service scenarios run as: the server's own (the
// document's umbp), and a third user who is neither it nor root.
const (
	serviceUID = 65534
	thirdUID   = 65533
)

// Who runs a command.
type runAs int

const (
	asRoot runAs = iota // this process's user
	serviceUser
	thirdUser
)

// tempDir is a directory every user may enter, removed at the end.
func (w *world) tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "umbpdoc")
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.dirs = append(w.dirs, dir)
	w.mu.Unlock()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// bin is the path of cmd/name, built once with the other command.
func (w *world) bin(t *testing.T, name string) string {
	t.Helper()
	w.mu.Lock()
	bins := w.bins
	w.mu.Unlock()
	if bins == "" {
		goTool, err := exec.LookPath("go")
		if err != nil {
			t.Skipf("no go command to build the commands with: %v", err)
		}
		bins = w.tempDir(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// The tool and the server are modules of their own: each built in
		// its directory.
		for _, dir := range []string{"cmd/umbp", "cmd/umbp-standalone-server"} {
			cmd := exec.CommandContext(ctx, goTool, "build", "-o", bins+"/", ".")
			cmd.Dir = filepath.Join(root, dir)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go build in %s: %v\n%s", dir, err, out)
			}
		}
		w.mu.Lock()
		w.bins = bins
		w.mu.Unlock()
	}
	return filepath.Join(bins, name)
}

// command is name with args, run as who.
func command(ctx context.Context, who runAs, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "UMBP_ENDPOINT=", "UMBP_NODE_ID=")
	switch who {
	case serviceUser:
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: serviceUID, Gid: serviceUID}}
	case thirdUser:
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: thirdUID, Gid: thirdUID}}
	}
	return cmd
}

// run runs name with args as who and returns what it printed, stdout and
// stderr together, and its exit status.
func (w *world) run(t *testing.T, who runAs, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := command(ctx, who, name, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	return "", 0
}

// service is the server a document runs as its own user, umbp, on
// /run/umbp/standalone/node0.grpc.sock: here uid 65534 in a directory of
// its own, mode 0700.
type service struct {
	dir   string // stands for /run/umbp/standalone
	names string // "user group" of uid 65534, as ls prints them
	cmd   *exec.Cmd
	log   *lockedBuffer
	exit  chan struct{}
}

func (s *service) endpoint() string { return "unix://" + filepath.Join(s.dir, "node0.grpc.sock") }

// words is out with this scenario's directory and user in the document's.
func (s *service) words(out string) string {
	out = strings.ReplaceAll(out, s.dir, "/run/umbp/standalone")
	return strings.ReplaceAll(out, s.names, "umbp umbp")
}

// service starts the service user's server, once: the document's
//
//	runuser -u umbp -- umbp-standalone-server -endpoint unix:///run/umbp/standalone/node0.grpc.sock -capacity 256MiB -prefault=false -gpu off &
func (w *world) service(t *testing.T) *service {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runs the server as a user of its own: needs root")
	}
	w.mu.Lock()
	s := w.svc
	w.mu.Unlock()
	if s != nil {
		return s
	}
	bin := w.bin(t, "umbp-standalone-server")
	dir := filepath.Join(w.tempDir(t), "standalone")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, serviceUID, serviceUID); err != nil {
		t.Fatal(err)
	}
	s = &service{dir: dir, names: fmt.Sprintf("%d %d", serviceUID, serviceUID), log: &lockedBuffer{}, exit: make(chan struct{})}
	if u, err := user.LookupId(strconv.Itoa(serviceUID)); err == nil {
		if g, err := user.LookupGroupId(strconv.Itoa(serviceUID)); err == nil {
			s.names = u.Username + " " + g.Name
		}
	}
	s.cmd = command(context.Background(), serviceUser, bin, "-endpoint", s.endpoint(), "-capacity", "256MiB", "-prefault=false", "-gpu", "off")
	s.cmd.Stderr = s.log
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := false
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "listening on ") && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		_ = s.cmd.Wait()
		close(s.exit)
	}()
	// Stopped at the end, as the unit's SIGTERM stops it.
	w.atEnd(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exit:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exit
		}
	})
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("the service user's server did not start:\n%s", s.log.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the service user's server not ready within 30s:\n%s", s.log.String())
	}
	w.mu.Lock()
	w.svc = s
	w.mu.Unlock()
	return s
}

// benchKilled is the document's memfd count: none, the bench's two
// buffers while it runs, none once it is killed; it returns the server's
// log, which says what it released.
func (s *service) benchKilled(t *testing.T, w *world) string {
	t.Helper()
	maps := fmt.Sprintf("/proc/%d/maps", s.cmd.Process.Pid)
	memfds := func() int {
		b, err := os.ReadFile(maps)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Count(b, []byte("memfd"))
	}
	// until waits, within a generous bound, for the count to reach n.
	until := func(n int, what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for memfds() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d memfd mappings in the server after 30s, want %d", what, memfds(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	until(0, "before the bench")
	bench := command(context.Background(), asRoot, w.bin(t, "umbp"), "bench", "-endpoint", s.endpoint(), "-trust-uid", strconv.Itoa(serviceUID), "-rounds", "200", "-progress", "off")
	if err := bench.Start(); err != nil {
		t.Fatal(err)
	}
	until(2, "while the bench runs")
	_ = bench.Process.Kill()
	_ = bench.Wait()
	until(0, "once the bench is killed")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(s.log.String(), "client process exited") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return s.log.String()
}

// lockedBuffer is a buffer a command writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// unit is the systemd unit DEPLOYMENT.md shows for /etc/systemd/system/name.
func unit(t *testing.T, name string) string {
	t.Helper()
	doc := readDoc(t, "docs/DEPLOYMENT.md")
	_, after, ok := strings.Cut(doc, "`/etc/systemd/system/"+name+"`:\n\n```ini\n")
	if !ok {
		t.Fatalf("DEPLOYMENT.md shows no unit %s", name)
	}
	text, _, _ := strings.Cut(after, "```")
	return text
}

// verifyUnit writes the document's unit name, with each of replace's old
// texts by the new, and returns what systemd-analyze verify prints of it.
func (w *world) verifyUnit(t *testing.T, name string, replace []string) string {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skipf("no systemd-analyze: %v", err)
	}
	text := strings.NewReplacer(replace...).Replace(unit(t, name))
	path := filepath.Join(w.tempDir(t), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := w.run(t, asRoot, analyze, "verify", path)
	return out
}

// The document's unit for the Go server passes systemd-analyze verify with
// no finding once its ExecStart binary is installed (here: built, where
// the unit is pointed).
func TestGoUnitVerifies(t *testing.T) {
	w := newWorld(t)
	bin := w.bin(t, "umbp-standalone-server")
	const installed = "/usr/local/bin/umbp-standalone-server"
	if !strings.Contains(unit(t, "umbp-standalone-server.service"), "ExecStart="+installed+" ") {
		t.Fatalf("the unit does not start %s, which the page installs", installed)
	}
	if out := w.verifyUnit(t, "umbp-standalone-server.service", []string{installed, bin}); strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify: %s", out)
	}
}

// blockedTransfer stores through a worker handle while the server stalls
// (its transfer blocked past Timeout), then stores again: the second
// store's error.
func blockedTransfer(t *testing.T, _ *world) string {
	t.Helper()
	ctx := t.Context()
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: srv.Endpoint(), Timeout: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := umbp.NewHostBuffer(8192)
	if err != nil {
		t.Fatal(err)
	}
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	plan := func(key string) []umbp.BlockTransferPlan {
		return []umbp.BlockTransferPlan{{Key: key, Ranges: []umbp.KVRange{{BaseAddress: buf.Buffer().Ptr, Length: 4096}}}}
	}
	srv.Stall("BatchPut", "BatchPutRanges")
	first := w.Store(plan("a"))
	if err := w.Wait(ctx, first); !errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("a store the server stalls: %v, want ErrBuffersInUse", err)
	}
	werr := w.Wait(ctx, w.Store(plan("b")))
	srv.Resume()
	select {
	case <-first.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the blocked store did not end within 30s of the server's resumption")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := buf.Close(); err != nil {
		t.Fatal(err)
	}
	if werr == nil {
		t.Fatal("a store while another is blocked succeeded")
	}
	return werr.Error()
}

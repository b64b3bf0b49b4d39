package umbp_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/umbp"
)

// gpuEnv is where a GPU scenario runs: a runtime, the device it uses, and
// a server with a GPU backend. The TestGPU tests run the scenarios on the
// real GPU; TestFakeRuntimeGPUScenarios and
// TestFakeRuntimeTwoProcessScenarios run them on the fake runtime, at a
// smaller scale, to check the scenarios themselves on hosts without a GPU.
type gpuEnv struct {
	rt     *hip.Runtime
	dev    int
	small  bool                                       // the fake: smaller sizes
	server func(t *testing.T, capacity string) string // endpoint
	// process starts a server process of the scenario's own, on endpoint
	// (a new one when empty), for the scenarios that stop, kill and
	// restart it; nil where the server runs in the test's process.
	process func(t *testing.T, endpoint, capacity string) *gpuProc
	// childEnv is added to the environment of a client process the
	// scenario starts (TestChildGPUClient).
	childEnv []string
}

// realGPU returns the environment of the process's GPU runtime, or skips.
func realGPU(t *testing.T) gpuEnv {
	t.Helper()
	rt, err := hip.Load()
	if errors.Is(err, hip.ErrNotSupported) {
		t.Skipf("no usable GPU runtime on this host: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return gpuEnv{rt: rt, dev: 0, server: gpuServer, process: func(t *testing.T, endpoint, capacity string) *gpuProc {
		t.Helper()
		return startGPUProc(t, gpuServerBin(t), endpoint, capacity)
	}}
}

// needProcess returns e.process, or skips a scenario that stops, kills or
// restarts its server where it cannot start one of its own.
func (e gpuEnv) needProcess(t *testing.T) func(t *testing.T, endpoint, capacity string) *gpuProc {
	t.Helper()
	if e.process == nil {
		t.Skip("needs a server process of its own")
	}
	return e.process
}

// gpuPathNotRun marks the GPU check's path named what as one the GPU
// runtime or its driver refused, with why, and fails the test: the check
// reports the path by name as not run, for that reason.
func gpuPathNotRun(t *testing.T, what string, why error) {
	t.Helper()
	t.Logf("GPU PATH NOT RUN: %s: %s: %v", t.Name(), what, why)
	t.FailNow()
}

// driverRefusal reports whether err is the GPU runtime's refusal of an
// operation rather than the library's or the server's fault: an IPC handle
// that cannot be made or opened, pointer queries the runtime answers with
// an error.
func driverRefusal(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	for _, frag := range []string{"hipIpcOpenMemHandle failed", "IPC handle of the allocation", "pointer attributes of", "allocation that holds"} {
		if strings.Contains(s, frag) {
			return true
		}
	}
	return false
}

// gpuRegister registers bufs with w; a refusal by the GPU runtime marks the
// test's path as not run (gpuPathNotRun), any other error fails it.
func gpuRegister(t *testing.T, w *umbp.WorkerHandle, bufs map[string]umbp.Buffer) {
	t.Helper()
	err := w.RegisterBuffers(context.Background(), bufs)
	if driverRefusal(err) {
		gpuPathNotRun(t, "GPU memory registered by IPC handle", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// syncBuffer collects a child process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// gpuServerBin returns the server binary the GPU tests start: the one
// UMBP_GPU_SERVER_BIN names, else one built with the go command.
func gpuServerBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv(envGPUServerBin); bin != "" {
		return bin
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("set %s or %s: no go command to build the server with", envGPUServerBin, envGPUEndpoint)
	}
	return serverBinary(t)
}

// gpuServer returns the endpoint of a server with a GPU backend: the shared
// one named by UMBP_GPU_ENDPOINT, or a process started for this test with a
// pool of capacity. Its log is shown when the test fails, or with -v.
func gpuServer(t *testing.T, capacity string) string {
	t.Helper()
	if ep := os.Getenv(envGPUEndpoint); ep != "" {
		return ep
	}
	return startGPUProc(t, gpuServerBin(t), "", capacity).endpoint
}

// gpuServerProcess starts the server binary bin with -gpu on and a pool of
// capacity, its environment extended by env, and returns its endpoint.
func gpuServerProcess(t *testing.T, bin, capacity string, env ...string) string {
	t.Helper()
	return startGPUProc(t, bin, "", capacity, env...).endpoint
}

// gpuProc is a server process with a GPU backend (-gpu on) that a test
// started: its endpoint, its metrics, its log line by line.
type gpuProc struct {
	cmd      *exec.Cmd
	endpoint string
	metrics  string // host:port of its -metrics
	exited   chan struct{}

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed, and replaced, at each new line
	killed  bool
}

// startGPUProc starts the server binary bin with -gpu on, a pool of
// capacity and its metrics on a loopback port, on endpoint (a new one when
// empty), its environment extended by env; it returns once the server
// listens. At the test's end the server is stopped with SIGTERM and must
// exit 0 (unless the test killed it), and a GPU IPC handle it failed to
// close fails the test.
func startGPUProc(t *testing.T, bin, endpoint, capacity string, env ...string) *gpuProc {
	t.Helper()
	if endpoint == "" {
		endpoint = "unix://" + filepath.Join(shortDir(t), "gpu.grpc.sock")
	}
	cmd := exec.Command(bin, "-endpoint", endpoint, "-gpu", "on", "-capacity", capacity, "-metrics", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), env...)
	// A test binary killed at its time limit takes its server along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	p := &gpuProc{cmd: cmd, endpoint: endpoint, exited: make(chan struct{}), changed: make(chan struct{})}
	var readers sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				p.addLine(sc.Text())
			}
		}()
	}
	go func() {
		readers.Wait() // both pipes read to their end before Wait closes them
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // in case the test stopped it
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
			t.Errorf("the server did not exit on SIGTERM")
		}
		p.mu.Lock()
		killed := p.killed
		p.mu.Unlock()
		if code := cmd.ProcessState.ExitCode(); code != 0 && !killed {
			t.Errorf("the server exited with status %d", code)
		}
		if l := p.find(0, "close IPC handle"); l >= 0 {
			t.Errorf("the server could not close a GPU IPC handle: %s", p.line(l))
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("server log (%s):\n%s", endpoint, p.log())
		}
	})
	if !p.waitLine(t, 60*time.Second, "listening on") {
		t.Fatalf("the server did not listen within 60s:\n%s", p.log())
	}
	// Said on stderr before "listening on" on stdout: two pipes, read apart.
	p.waitLine(t, 10*time.Second, "serving metrics")
	l := p.find(0, "serving metrics")
	_, url, ok := strings.Cut(p.line(l), "url=http://")
	if l < 0 || !ok {
		t.Fatalf("the server does not say where its metrics are:\n%s", p.log())
	}
	p.metrics, _, _ = strings.Cut(url, "/")
	return p
}

func (p *gpuProc) addLine(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lines = append(p.lines, s)
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *gpuProc) line(i int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i < 0 || i >= len(p.lines) {
		return ""
	}
	return p.lines[i]
}

func (p *gpuProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// find returns the index of the first line from the from'th that contains
// substr, or -1.
func (p *gpuProc) find(from int, substr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := from; i < len(p.lines); i++ {
		if strings.Contains(p.lines[i], substr) {
			return i
		}
	}
	return -1
}

// waitLine waits until the server has written a line containing substr,
// and reports whether it did before it exited or d passed.
func (p *gpuProc) waitLine(t *testing.T, d time.Duration, substr string) bool {
	t.Helper()
	timeout := time.After(d)
	for from := 0; ; {
		p.mu.Lock()
		n, changed := len(p.lines), p.changed
		p.mu.Unlock()
		if p.find(from, substr) >= 0 {
			return true
		}
		from = n
		select {
		case <-changed:
		case <-p.exited:
			return p.find(from, substr) >= 0
		case <-timeout:
			return false
		}
	}
}

// stop stops the server (SIGSTOP) and returns once every thread of it has
// stopped: it answers nothing until cont.
func (p *gpuProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WSTOPPED, nil)
		if err == nil {
			return
		}
		if !errors.Is(err, unix.EINTR) {
			t.Fatalf("waiting for the server to stop: %v", err)
		}
	}
}

// cont continues the server after stop.
func (p *gpuProc) cont(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// kill kills the server (SIGKILL) and returns once it has exited.
func (p *gpuProc) kill(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the killed server did not exit within 30s")
	}
}

// metric returns the value of the server's metric name (a gauge or counter
// without labels), read from its -metrics.
func (p *gpuProc) metric(t *testing.T, name string) float64 {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.metrics, 10*time.Second)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", p.metrics); err != nil {
		t.Fatalf("metrics: %v", err)
	}
	body, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", name, l, err)
			}
			return f
		}
	}
	t.Fatalf("the server reports no metric %s", name)
	return 0
}

// waitMetric waits until the server's metric name reads want: the server
// is another process, and what it releases in the background shows only
// there.
func (p *gpuProc) waitMetric(t *testing.T, name string, want float64, why string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for pause := time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		got := p.metric(t, name)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the server's %s is %v after 30s, want %v", why, name, got, want)
		}
		time.Sleep(pause)
	}
}

// gpuConfig is testConfig with room for large transfers, logging at info
// level with -v.
func gpuConfig(t *testing.T, endpoint string) umbp.Config {
	cfg := testConfig(t, endpoint)
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	cfg.Timeout = 30 * time.Second
	cfg.LookupTimeout = 10 * time.Second
	cfg.StartupTimeout = 30 * time.Second
	return cfg
}

// uniqueKeys prefixes keys so that tests sharing one server do not meet.
func uniqueKeys(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
}

// clearPlans zeroes the plans' ranges on the device.
func clearPlans(t *testing.T, rt *hip.Runtime, dev int, plans []umbp.BlockTransferPlan) {
	t.Helper()
	for _, p := range plans {
		for _, r := range p.Ranges {
			if err := rt.CopyToDevice(dev, r.BaseAddress, make([]byte, r.Length)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkPlans compares every plan's ranges on the device with its object.
func checkPlans(t *testing.T, rt *hip.Runtime, dev int, plans []umbp.BlockTransferPlan, objs map[string][]byte) {
	t.Helper()
	for _, p := range plans {
		if got := gpuReadPlan(t, rt, dev, p); !bytes.Equal(got, objs[p.Key]) {
			i := 0
			for i < len(got) && got[i] == objs[p.Key][i] {
				i++
			}
			t.Fatalf("%s: loaded bytes differ from the stored ones, first at object offset %d", p.Key, i)
		}
	}
}

package umbp_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/umbp"
)

// gpuEnv is where a GPU scenario runs: a runtime, the device it uses, and
// a server with a GPU backend. The TestGPU tests run the scenarios on the
// real GPU; TestFakeRuntimeGPUScenarios runs them on the fake runtime, at a
// smaller scale, to check the scenarios themselves on hosts without a GPU.
type gpuEnv struct {
	rt     *hip.Runtime
	dev    int
	small  bool                                       // the fake: smaller sizes
	server func(t *testing.T, capacity string) string // endpoint
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
	return gpuEnv{rt: rt, dev: 0, server: gpuServer}
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

// gpuServer returns the endpoint of a server with a GPU backend: the shared
// one named by UMBP_GPU_ENDPOINT, or a process started for this test with a
// pool of capacity. Its log is shown when the test fails, or with -v.
func gpuServer(t *testing.T, capacity string) string {
	t.Helper()
	if ep := os.Getenv(envGPUEndpoint); ep != "" {
		return ep
	}
	bin := os.Getenv(envGPUServerBin)
	if bin == "" {
		if _, err := exec.LookPath("go"); err != nil {
			t.Skipf("set %s or %s: no go command to build the server with", envGPUServerBin, envGPUEndpoint)
		}
		bin = serverBinary(t)
	}
	return gpuServerProcess(t, bin, capacity)
}

// gpuServerProcess starts the server binary bin with -gpu on and a pool of
// capacity, its environment extended by env, and returns its endpoint.
func gpuServerProcess(t *testing.T, bin, capacity string, env ...string) string {
	t.Helper()
	endpoint := "unix://" + filepath.Join(shortDir(t), "gpu.grpc.sock")
	cmd := exec.Command(bin, "-endpoint", endpoint, "-gpu", "on", "-capacity", capacity)
	cmd.Env = append(os.Environ(), env...)
	// A test binary killed at its time limit takes its server along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	logs := &syncBuffer{}
	cmd.Stderr = logs
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	listening := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			fmt.Fprintln(logs, sc.Text())
			if strings.HasPrefix(sc.Text(), "listening on") {
				once.Do(func() { close(listening) })
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("the server did not exit on SIGTERM")
		}
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("the server exited with status %d", code)
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("server log:\n%s", logs)
		}
	})
	select {
	case <-listening:
	case <-exited:
		t.Fatalf("the server exited before listening:\n%s", logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("the server did not listen within 60s:\n%s", logs)
	}
	return endpoint
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

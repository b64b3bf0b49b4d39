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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// testConfig is a config for endpoint whose logs go nowhere unless -v.
// With UMBP_TEST_GRPC_LOOKUPS=1 its lookups go through grpc-go's call path
// (make test runs the scheduler's tests both ways).
func testConfig(t testing.TB, endpoint string) umbp.Config {
	return umbp.Config{
		Endpoint:       endpoint,
		Timeout:        2 * time.Second,
		LookupTimeout:  200 * time.Millisecond,
		StartupTimeout: 5 * time.Second,
		Logger:         testLogger(t),
		GRPCLookups:    grpcLookups,
	}
}

// grpcLookups is UMBP_TEST_GRPC_LOOKUPS=1.
var grpcLookups = os.Getenv("UMBP_TEST_GRPC_LOOKUPS") == "1"

func newRuntime(t testing.TB, cfg umbp.Config) *umbp.StandaloneRuntime {
	t.Helper()
	rt, err := umbp.NewStandaloneRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func newServer(t testing.TB, opts umbptest.Options) *umbptest.Server {
	opts.Logger = testLogger(t)
	return umbptest.NewServer(t, opts)
}

// engine is one worker handle with a HostBuffer holding a KV layout of
// layers regions, each of blocks blocks of blockBytes (stride = blockBytes).
type engine struct {
	w      *umbp.WorkerHandle
	buf    *umbp.HostBuffer
	layout *umbp.KVLayoutDescriptor
	plan   *umbp.LayoutPlanner
}

func newEngine(t testing.TB, rt *umbp.StandaloneRuntime, layers, blocks int, blockBytes uint64) *engine {
	t.Helper()
	buf, err := umbp.NewHostBuffer(layers * blocks * int(blockBytes))
	if err != nil {
		t.Fatal(err)
	}
	base := buf.Buffer().Ptr
	layout := &umbp.KVLayoutDescriptor{}
	for l := range layers {
		layout.Regions = append(layout.Regions, umbp.KVRegion{
			LayerName:   fmt.Sprintf("layer.%d", l),
			BaseAddress: base + uintptr(l*blocks)*uintptr(blockBytes),
			NumBlocks:   blocks,
			BlockBytes:  blockBytes,
			Stride:      blockBytes,
		})
	}
	ctx := context.Background()
	w, err := rt.NewWorkerHandle(ctx, layout)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	plan, err := umbp.NewLayoutPlanner(layout)
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{w: w, buf: buf, layout: layout, plan: plan}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Logf("close worker: %v", err)
		}
		if err := buf.Close(); err != nil {
			t.Logf("close buffer: %v", err)
		}
	})
	return e
}

// plans returns one plan per block id, keyed prefix-<id>.
func (e *engine) plans(t testing.TB, prefix string, ids ...int) []umbp.BlockTransferPlan {
	t.Helper()
	out := make([]umbp.BlockTransferPlan, len(ids))
	for i, id := range ids {
		p, err := e.plan.PlanForBlock(fmt.Sprintf("%s-%d", prefix, id), 0, id)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = p
	}
	return out
}

// fill writes a pattern derived from seed into every range of the plans.
func (e *engine) fill(plans []umbp.BlockTransferPlan, seed byte) {
	mem := e.buf.Bytes()
	base := e.buf.Buffer().Ptr
	for _, p := range plans {
		for _, r := range p.Ranges {
			off := int(r.BaseAddress - base)
			for i := range int(r.Length) {
				mem[off+i] = seed ^ byte(i*7+int(r.ObjectOffset)) ^ byte(p.BlockID)
			}
		}
	}
}

// check verifies the pattern fill wrote, as seen through another engine's
// plans for the same blocks.
func (e *engine) check(t testing.TB, plans []umbp.BlockTransferPlan, seed byte, srcIDs []int) {
	t.Helper()
	mem := e.buf.Bytes()
	base := e.buf.Buffer().Ptr
	for k, p := range plans {
		for _, r := range p.Ranges {
			off := int(r.BaseAddress - base)
			for i := range int(r.Length) {
				want := seed ^ byte(i*7+int(r.ObjectOffset)) ^ byte(srcIDs[k])
				if mem[off+i] != want {
					t.Fatalf("key %s range at object offset %d byte %d: got %#x want %#x", p.Key, r.ObjectOffset, i, mem[off+i], want)
				}
			}
		}
	}
}

// waitJob waits for job to end; Wait's answer must agree with its status.
func waitJob(t testing.TB, w *umbp.WorkerHandle, job *umbp.TransferJob) {
	t.Helper()
	err := w.Wait(context.Background(), job)
	if errors.Is(err, umbp.ErrBuffersInUse) {
		t.Fatalf("wait: %v", err)
	}
	if (err == nil) != (job.Status() == umbp.JobCompleted) {
		t.Fatalf("Wait = %v for a %s job", err, job.Status())
	}
}

// awaitEnd waits for a job the server has been let go on to end, within a
// bound that only a hang exceeds.
func awaitEnd(t testing.TB, job *umbp.TransferJob) {
	t.Helper()
	select {
	case <-job.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the job did not end within 30 s of the server answering: %s", job.Status())
	}
}

// serverProcess runs cmd/umbp-standalone-server as a child process.
type serverProcess struct {
	cmd      *exec.Cmd
	endpoint string
	done     chan struct{}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

func serverBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "umbpbin")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "umbp-standalone-server")
		// A module of its own: built in its directory.
		out, err := exec.Command("go", "build", "-C", "../cmd/umbp-standalone-server", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build umbp-standalone-server: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "umbp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startServerProcess starts the server binary on endpoint and waits until it
// listens.
func startServerProcess(t testing.TB, endpoint string, args ...string) *serverProcess {
	t.Helper()
	cmd := exec.Command(serverBinary(t), append([]string{"-endpoint", endpoint}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProcess{cmd: cmd, endpoint: endpoint, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening") {
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(p.done)
	}()
	select {
	case <-ready:
	case <-p.done:
		t.Fatal("server process exited before listening")
	case <-time.After(20 * time.Second):
		p.kill()
		t.Fatal("server process did not start listening")
	}
	t.Cleanup(p.kill)
	return p
}

// signal sends sig; for SIGSTOP and SIGCONT it waits until the process is
// stopped or running again, since delivery is asynchronous.
func (p *serverProcess) signal(sig os.Signal) {
	_ = p.cmd.Process.Signal(sig)
	var want func(state byte) bool
	switch sig {
	case syscall.SIGSTOP:
		want = func(s byte) bool { return s == 'T' }
	case syscall.SIGCONT:
		want = func(s byte) bool { return s != 'T' }
	default:
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return
		}
		// pid (comm) state ...
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && want(b[i+2]) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func (p *serverProcess) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// waitFor waits (bounded) until cond holds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitCalls waits until the server has seen n calls of method.
func waitCalls(t testing.TB, srv *umbptest.Server, method string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for srv.Calls(method) < n {
		if time.Now().After(deadline) {
			t.Fatalf("server saw %d %s calls, want %d", srv.Calls(method), method, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// jobEnded reports whether job has ended.
func jobEnded(job *umbp.TransferJob) bool {
	select {
	case <-job.Done():
		return true
	default:
		return false
	}
}

package umbp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/umbp"
)

// The paths a GPU block can take besides those of gpu_test.go: a job its
// Wait runs (lock-step, and paused at its bound), a job on the transfer
// goroutines, a server restart, and a client process killed with its GPU
// memory registered. Each runs on the real GPU as TestGPU… and on the fake
// runtime in TestFakeRuntimeGPUScenarios or TestFakeRuntimeTwoProcessScenarios.

// Metrics of the server process the scenarios read.
const (
	metricGPUHandles = "umbp_server_gpu_ipc_handles"
	metricRegions    = "umbp_server_registered_regions"
	metricReclaimed  = "umbp_server_reclaimed_processes_total"
)

// layerPlans makes n plans, keys prefix-0 onwards, of ranges ranges each,
// laid out as an engine's layers are: range r of block b at
// base + (r*n + b) * 8 KiB, of uneven lengths up to 8 KiB. They span
// ranges*n*8 KiB from base.
func layerPlans(prefix string, base uintptr, n, ranges int) []umbp.BlockTransferPlan {
	ps := make([]umbp.BlockTransferPlan, n)
	for b := range ps {
		spans := make([]gpuSpan, ranges)
		for r := range spans {
			spans[r] = gpuSpan{base + uintptr((r*n+b)*8192), uint64(1024 + (b*ranges+r)*37%7000)}
		}
		ps[b] = gpuPlan(fmt.Sprintf("%s-%d", prefix, b), spans...)
	}
	return ps
}

// planObjects returns the object of each plan by key: gpuPattern of seed
// plus the plan's index.
func planObjects(ps []umbp.BlockTransferPlan, seed byte) map[string][]byte {
	objs := make(map[string][]byte, len(ps))
	for i, p := range ps {
		objs[p.Key] = gpuPattern(int(p.ObjectSize()), seed+byte(i))
	}
	return objs
}

// fillPlans writes planObjects(ps, seed) into the plans' ranges on the
// device and returns them.
func fillPlans(t *testing.T, rt *hip.Runtime, dev int, ps []umbp.BlockTransferPlan, seed byte) map[string][]byte {
	t.Helper()
	objs := planObjects(ps, seed)
	for _, p := range ps {
		gpuWritePlan(t, rt, dev, p, objs[p.Key])
	}
	return objs
}

// gpuWarmUp stores one small block through w and waits for it to end, so
// that w has a transfer connection, idle from then on.
func gpuWarmUp(t *testing.T, w *umbp.WorkerHandle, at uintptr, key string) {
	t.Helper()
	job := w.Store([]umbp.BlockTransferPlan{gpuPlan(key, gpuSpan{at, 4096})})
	awaitEnd(t, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("warm-up store: %s %v", job.Status(), job.Err())
	}
}

// TestGPUWaitRunsTheJob: a Wait that finds the handle's one job queued
// runs its request itself, lock-step on its own goroutine, store and load
// of ranged GPU blocks, byte-exact.
func TestGPUWaitRunsTheJob(t *testing.T) { scenarioWaitRunsTheJob(t, realGPU(t)) }

func scenarioWaitRunsTheJob(t *testing.T, e gpuEnv) {
	rt, dev := e.rt, e.dev
	ep := e.server(t, "256MiB")
	const size = 4 << 20
	a := gpuMalloc(t, rt, dev, size)
	w := gpuWorker(t, newRuntime(t, gpuConfig(t, ep)))
	gpuRegister(t, w, map[string]umbp.Buffer{"kv": {Ptr: a, Size: size}})
	prefix := uniqueKeys(t)
	gpuWarmUp(t, w, a+size-8192, prefix+"-warm")
	ran := waitedRuns(t)
	release := holdPool()
	t.Cleanup(release) // if the test stops before it releases the pool
	const rounds = 3
	for i := range rounds {
		tag := fmt.Sprintf("%s-%d", prefix, i)
		src, dst := layerPlans(tag, a, 8, 8), layerPlans(tag, a+1<<20, 8, 8)
		objs := fillPlans(t, rt, dev, src, byte(16*i))
		gpuWantCompleted(t, w, w.Store(src), "store")
		clearPlans(t, rt, dev, dst)
		gpuWantCompleted(t, w, w.Load(dst), "load")
		checkPlans(t, rt, dev, dst, objs)
	}
	release()
	if n := ran.Load(); n != 2*rounds {
		t.Fatalf("a Wait ran %d of the %d GPU jobs itself", n, 2*rounds)
	}
}

// TestGPUWaitPaused: a Wait that runs a GPU job's request itself while the
// server answers nothing (stopped) returns at its bound, the end of its
// context or the job's deadline, with the job running and its memory in
// use; the rest of the request goes on on a goroutine of its own, and the
// job completes, byte-exact, once the server answers.
func TestGPUWaitPaused(t *testing.T) { scenarioWaitPaused(t, realGPU(t)) }

func scenarioWaitPaused(t *testing.T, e gpuEnv) {
	start := e.needProcess(t)
	rt, dev := e.rt, e.dev
	p := start(t, "", "256MiB")
	const size = 4 << 20
	a := gpuMalloc(t, rt, dev, size)
	prefix := uniqueKeys(t)
	var ran atomic.Int64
	claims := make(chan struct{}, 1)
	t.Cleanup(umbp.SetWaitedRunHook(func() {
		ran.Add(1)
		select {
		case claims <- struct{}{}:
		default:
		}
	}))
	for _, byCtx := range []bool{true, false} {
		cfg := gpuConfig(t, p.endpoint)
		bound := "its context"
		if !byCtx {
			cfg.Timeout = 500 * time.Millisecond
			bound = "the job's deadline"
		}
		w := gpuWorker(t, newRuntime(t, cfg))
		// Should the test stop while the server is stopped, the handle's
		// Close (a cleanup that runs before this one) must not wait on it.
		t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })
		gpuRegister(t, w, map[string]umbp.Buffer{"kv": {Ptr: a, Size: size}})
		tag := fmt.Sprintf("%s-%v", prefix, byCtx)
		gpuWarmUp(t, w, a+size-8192, tag+"-warm")
		release := holdPool()
		src, dst := layerPlans(tag, a, 8, 8), layerPlans(tag, a+1<<20, 8, 8)
		objs := fillPlans(t, rt, dev, src, 0x21)
		for _, load := range []bool{false, true} {
			what := fmt.Sprintf("store paused at %s", bound)
			if load {
				what = fmt.Sprintf("load paused at %s", bound)
				clearPlans(t, rt, dev, dst)
			}
			select {
			case <-claims:
			default:
			}
			before := ran.Load()
			p.stop(t)
			var job *umbp.TransferJob
			if load {
				job = w.Load(dst)
			} else {
				job = w.Store(src)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if byCtx {
				go func() {
					select {
					case <-claims: // the Wait has claimed the job: end its context
						cancel()
					case <-job.Done():
					}
				}()
			}
			err := w.Wait(ctx, job)
			cancel()
			if !errors.Is(err, umbp.ErrBuffersInUse) || byCtx != errors.Is(err, context.Canceled) {
				t.Fatalf("%s: Wait = %v", what, err)
			}
			if n := ran.Load() - before; n != 1 {
				t.Fatalf("%s: a Wait ran %d jobs itself, want this one", what, n)
			}
			if job.Status() != umbp.JobRunning {
				t.Fatalf("%s: the job is %s (%v) while the server has not answered", what, job.Status(), job.Err())
			}
			if !byCtx && !load {
				if j := w.Store(layerPlans(tag+"-refused", a+2<<20, 1, 1)); !errors.Is(j.Err(), umbp.ErrNotAttempted) {
					t.Fatalf("%s: a store while it is blocked: %s %v, want refused at once", what, j.Status(), j.Err())
				}
			}
			p.cont(t)
			awaitEnd(t, job)
			if job.Status() != umbp.JobCompleted {
				t.Fatalf("%s: once the server answered the job ended %s: %v", what, job.Status(), job.Err())
			}
			if load {
				checkPlans(t, rt, dev, dst, objs)
			}
		}
		release()
		if st := w.Stats(); st.Transfers.Blocked != 0 {
			t.Fatalf("%d transfers still counted blocked", st.Transfers.Blocked)
		}
	}
}

// TestGPUTransferGoroutines: GPU jobs on the handle's transfer goroutines:
// several submitted at once, and single ones a Wait finds queued and
// leaves to them (the transfer goroutine claims them first).
func TestGPUTransferGoroutines(t *testing.T) { scenarioTransferGoroutines(t, realGPU(t)) }

func scenarioTransferGoroutines(t *testing.T, e gpuEnv) {
	rt, dev := e.rt, e.dev
	ep := e.server(t, "256MiB")
	const size = 4 << 20
	a := gpuMalloc(t, rt, dev, size)
	w := gpuWorker(t, newRuntime(t, gpuConfig(t, ep)))
	gpuRegister(t, w, map[string]umbp.Buffer{"kv": {Ptr: a, Size: size}})
	ran := waitedRuns(t)
	t.Cleanup(umbp.SetWaitClaimsHook(func(j *umbp.TransferJob) {
		select {
		case <-j.Done():
		case <-time.After(30 * time.Second):
			t.Error("the transfer goroutines did not run the job")
		}
	}))
	prefix := uniqueKeys(t)
	const jobs = 4
	var srcs, dsts [][]umbp.BlockTransferPlan
	objs := map[string][]byte{}
	for j := range jobs {
		tag := fmt.Sprintf("%s-%d", prefix, j)
		src := layerPlans(tag, a+uintptr(j)*256<<10, 4, 8)
		for k, v := range fillPlans(t, rt, dev, src, byte(32*j)) {
			objs[k] = v
		}
		srcs = append(srcs, src)
		dsts = append(dsts, layerPlans(tag, a+2<<20+uintptr(j)*256<<10, 4, 8))
	}
	for round := range 2 {
		submitted := make([]*umbp.TransferJob, 0, jobs)
		for _, src := range srcs {
			submitted = append(submitted, w.Store(src))
		}
		for _, j := range submitted {
			gpuWantCompleted(t, w, j, fmt.Sprintf("round %d: store among %d at once", round, jobs))
		}
		for _, dst := range dsts {
			clearPlans(t, rt, dev, dst)
		}
		submitted = submitted[:0]
		for _, dst := range dsts {
			submitted = append(submitted, w.Load(dst))
		}
		for i, j := range submitted {
			gpuWantCompleted(t, w, j, fmt.Sprintf("round %d: load among %d at once", round, jobs))
			checkPlans(t, rt, dev, dsts[i], objs)
		}
	}
	// One job at a time: each Wait finds it queued and loses it.
	for i := range srcs {
		gpuWantCompleted(t, w, w.Store(srcs[i]), "store alone")
		clearPlans(t, rt, dev, dsts[i])
		gpuWantCompleted(t, w, w.Load(dsts[i]), "load alone")
		checkPlans(t, rt, dev, dsts[i], objs)
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("a Wait ran %d jobs itself; want every one on the transfer goroutines", n)
	}
}

// waitAway waits until each handle has noticed that its server went away.
func waitAway(t *testing.T, ws ...*umbp.WorkerHandle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, w := range ws {
		for w.State() == umbp.StateConnected {
			if !w.WaitForStateChange(ctx, umbp.StateConnected) {
				t.Fatalf("the handle did not notice within 30s that its server was killed")
			}
		}
	}
}

// waitBack waits until each handle is connected again.
func waitBack(t *testing.T, ws ...*umbp.WorkerHandle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, w := range ws {
		for st := w.State(); st != umbp.StateConnected; st = w.State() {
			if st == umbp.StateClosed || !w.WaitForStateChange(ctx, st) {
				t.Fatalf("the handle did not attach to the new server within 60s: %s", w.State())
			}
		}
	}
}

// TestGPUServerRestart: two handles register one allocation; the server is
// stopped with a store in flight, killed, and a new one started on the
// same endpoint. The store, running (its memory in use) while the stopped
// server holds it, fails once the server is killed; both handles register
// the allocation again with the new server by themselves; blocks the old
// server held are misses that leave the memory untouched; new blocks move
// byte-exactly between the handles. Closed, the handles leave the server
// no mapping of the memory before it is freed.
func TestGPUServerRestart(t *testing.T) { scenarioServerRestart(t, realGPU(t)) }

func scenarioServerRestart(t *testing.T, e gpuEnv) {
	start := e.needProcess(t)
	rt, dev := e.rt, e.dev
	p1 := start(t, "", "256MiB")
	const size = 8 << 20
	a := gpuMalloc(t, rt, dev, size)
	urt := newRuntime(t, gpuConfig(t, p1.endpoint))
	w1, w2 := gpuWorker(t, urt), gpuWorker(t, urt)
	t.Cleanup(func() { _ = p1.cmd.Process.Signal(syscall.SIGCONT) }) // before the handles' Close
	gpuRegister(t, w1, map[string]umbp.Buffer{"k": {Ptr: a, Size: 4 << 20}})
	gpuRegister(t, w2, map[string]umbp.Buffer{"v": {Ptr: a + 4<<20, Size: 4 << 20}})
	if n := p1.metric(t, metricGPUHandles); n != 2 {
		t.Fatalf("two handles on one allocation: the server has %v GPU IPC handles open, want 2", n)
	}
	prefix := uniqueKeys(t)
	move := func(from, to *umbp.WorkerHandle, tag string, seed byte) {
		t.Helper()
		src, dst := layerPlans(prefix+tag, a, 8, 8), layerPlans(prefix+tag, a+4<<20, 8, 8)
		objs := fillPlans(t, rt, dev, src, seed)
		gpuWantCompleted(t, from, from.Store(src), tag+": store")
		clearPlans(t, rt, dev, dst)
		gpuWantCompleted(t, to, to.Load(dst), tag+": load by the other handle")
		checkPlans(t, rt, dev, dst, objs)
	}
	move(w1, w2, "-before", 1)

	// A store in flight: the server stops, then dies.
	p1.stop(t)
	inflight := w1.Store(layerPlans(prefix+"-inflight", a+1<<20, 8, 8))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err := w1.Wait(ctx, inflight)
	cancel()
	if !errors.Is(err, umbp.ErrBuffersInUse) || inflight.Status() != umbp.JobRunning {
		t.Fatalf("a store the stopped server has not answered: Wait = %v, %s", err, inflight.Status())
	}
	p1.kill(t)
	awaitEnd(t, inflight)
	if inflight.Status() != umbp.JobFailed {
		t.Fatalf("a store the killed server never answered ended %s", inflight.Status())
	}
	waitAway(t, w1, w2)

	p2 := start(t, p1.endpoint, "256MiB")
	waitBack(t, w1, w2)
	if n := p2.metric(t, metricGPUHandles); n != 2 {
		t.Fatalf("after the restart the server has %v GPU IPC handles open, want the allocation registered again by both handles", n)
	}
	for _, w := range []*umbp.WorkerHandle{w1, w2} {
		if st := w.Stats(); st.Transfers.Blocked != 0 {
			t.Fatalf("%d transfers still counted blocked after the restart", st.Transfers.Blocked)
		}
	}
	// The new pool is empty: the blocks stored before are misses, and
	// leave their destination as it was.
	old := layerPlans(prefix+"-before", a+6<<20, 8, 8)
	objs := fillPlans(t, rt, dev, old, 0x77)
	miss := w2.Load(old)
	awaitEnd(t, miss)
	if miss.Status() != umbp.JobFailed || !errors.Is(miss.Err(), umbp.ErrNotInPool) {
		t.Fatalf("a load of blocks the old server held: %s %v, want a miss", miss.Status(), miss.Err())
	}
	checkPlans(t, rt, dev, old, objs)
	move(w2, w1, "-after", 2)
	move(w1, w2, "-after-2", 3)

	// Closed, the handles leave the server no mapping of the memory, which
	// the test frees after.
	for _, w := range []*umbp.WorkerHandle{w1, w2} {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	p2.waitMetric(t, metricGPUHandles, 0, "both handles closed")
}

// gpuChildEnv gives TestChildGPUClient its server's endpoint, its device
// and its keys' prefix, separated by "|".
const gpuChildEnv = "UMBP_GPU_TEST_CHILD"

// The crashed client's blocks: that many, of that many ranges each.
const crashBlocks, crashRanges, crashSeed = 8, 8, 0x42

// TestGPUCrashedClient: a client process registers GPU memory, stores
// blocks from it, and is killed (SIGKILL) without deregistering: the server
// sees it exit and closes its GPU mapping, keeps the blocks it stored, and
// serves the next client's GPU memory byte-exactly.
func TestGPUCrashedClient(t *testing.T) { scenarioCrashedClient(t, realGPU(t)) }

func scenarioCrashedClient(t *testing.T, e gpuEnv) {
	start := e.needProcess(t)
	rt, dev := e.rt, e.dev
	p := start(t, "", "256MiB")
	prefix := uniqueKeys(t)

	child := exec.Command(os.Args[0], "-test.run=^TestChildGPUClient$", "-test.count=1")
	child.Env = append(append(os.Environ(), e.childEnv...), fmt.Sprintf("%s=%s|%d|%s", gpuChildEnv, p.endpoint, dev, prefix))
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := child.StdinPipe() // the child waits for its end
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	child.Stderr = out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	ready, exited := make(chan struct{}), make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(out, sc.Text())
			if sc.Text() == "umbp-gpu-child: ready" {
				close(ready)
			}
		}
		_ = child.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = child.Process.Kill()
		<-exited
		stdin.Close()
		if t.Failed() || testing.Verbose() {
			t.Logf("client process output:\n%s", out)
		}
	})
	select {
	case <-ready:
	case <-exited:
		if _, line, ok := strings.Cut(out.String(), "GPU PATH NOT RUN: "); ok {
			line, _, _ = strings.Cut(line, "\n")
			gpuPathNotRun(t, "GPU memory of a client process", errors.New(line))
		}
		t.Fatalf("the client process exited before it had stored its blocks:\n%s", out)
	case <-time.After(90 * time.Second):
		t.Fatalf("the client process had not stored its blocks after 90s:\n%s", out)
	}
	if n := p.metric(t, metricGPUHandles); n != 1 {
		t.Fatalf("the client process registered its GPU memory: the server has %v GPU IPC handles open, want 1", n)
	}

	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	if !p.waitLine(t, 30*time.Second, "client process exited without deregistering") {
		t.Fatal("the server did not say within 30s that the killed client's regions were released")
	}
	p.waitMetric(t, metricGPUHandles, 0, "the killed client's GPU mapping")
	if n := p.metric(t, metricReclaimed); n != 1 {
		t.Fatalf("the server counts %v client processes reclaimed, want 1", n)
	}
	if n := p.metric(t, metricRegions); n != 0 {
		t.Fatalf("the server holds %v regions after the only client was killed", n)
	}

	// What the killed client stored is still in the pool, and the next
	// client's GPU memory is served.
	const size = crashBlocks * crashRanges * 8192
	a := gpuMalloc(t, rt, dev, size)
	w := gpuWorker(t, newRuntime(t, gpuConfig(t, p.endpoint)))
	gpuRegister(t, w, map[string]umbp.Buffer{"kv": {Ptr: a, Size: size}})
	dst := layerPlans(prefix, a, crashBlocks, crashRanges)
	gpuWantCompleted(t, w, w.Load(dst), "load of the killed client's blocks")
	checkPlans(t, rt, dev, dst, planObjects(dst, crashSeed))
	if n := p.metric(t, metricGPUHandles); n != 1 {
		t.Fatalf("the next client: the server has %v GPU IPC handles open, want 1", n)
	}
}

// TestChildGPUClient is the client process TestGPUCrashedClient kills: it
// registers GPU memory, stores blocks from it, says so, and waits for its
// standard input to end.
func TestChildGPUClient(t *testing.T) {
	arg := os.Getenv(gpuChildEnv)
	if arg == "" {
		t.Skip("runs only as the client process TestGPUCrashedClient kills")
	}
	parts := strings.Split(arg, "|")
	if len(parts) != 3 {
		t.Fatalf("bad %s=%q", gpuChildEnv, arg)
	}
	dev, err := strconv.Atoi(parts[1])
	if err != nil {
		t.Fatalf("bad device in %s=%q", gpuChildEnv, arg)
	}
	rt, err := hip.Load()
	if err != nil {
		t.Fatalf("the client process has no GPU runtime: %v", err)
	}
	const size = crashBlocks * crashRanges * 8192
	a, err := rt.Malloc(dev, size) // the process is killed holding it
	if err != nil {
		t.Fatal(err)
	}
	w := gpuWorker(t, newRuntime(t, gpuConfig(t, parts[0])))
	gpuRegister(t, w, map[string]umbp.Buffer{"kv": {Ptr: a, Size: size}})
	src := layerPlans(parts[2], a, crashBlocks, crashRanges)
	fillPlans(t, rt, dev, src, crashSeed)
	gpuWantCompleted(t, w, w.Store(src), "the client process's store")
	fmt.Println("umbp-gpu-child: ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

package umbp_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/umbp"
)

// The TestGPU tests need a GPU. The server runs as a separate process, since
// a process cannot open its own IPC handles:
//
//   - UMBP_GPU_ENDPOINT names a server already running with -gpu on, which
//     every test then shares;
//   - else UMBP_GPU_SERVER_BIN names the umbp-standalone-server binary, which
//     each test starts with -gpu on;
//   - else the binary is built with the go command.
//
// Without a GPU runtime they skip.
const (
	envGPUEndpoint  = "UMBP_GPU_ENDPOINT"
	envGPUServerBin = "UMBP_GPU_SERVER_BIN"
)

// TestGPUInteriorBuffersManyRanges registers interior buffers of one large
// allocation and moves blocks of 32 ranges each, of uneven lengths, into
// other places of the same allocation.
func TestGPUInteriorBuffersManyRanges(t *testing.T) { scenarioInteriorManyRanges(t, realGPU(t)) }

func scenarioInteriorManyRanges(t *testing.T, e gpuEnv) {
	rt, dev := e.rt, e.dev
	ep := e.server(t, "512MiB")
	const size = 64 << 20
	a := gpuMalloc(t, rt, dev, size)
	w := gpuWorker(t, newRuntime(t, gpuConfig(t, ep)))
	err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{
		"k": {Ptr: a + 4096, Size: 16 << 20},
		"v": {Ptr: a + 32<<20, Size: 16 << 20, Location: umbp.LocationGPU, Device: dev},
		"s": {Ptr: a + 60<<20 + 17, Size: 1000},
	})
	if err != nil {
		t.Fatal(err)
	}
	prefix := uniqueKeys(t)
	const blocks, ranges = 16, 32
	var src, dst []umbp.BlockTransferPlan
	objs := map[string][]byte{}
	for b := range blocks {
		key := fmt.Sprintf("%s-%d", prefix, b)
		var s, d []gpuSpan
		for r := range ranges {
			n := uint64(1024 + (b*ranges+r)*37%7000) // 1 KiB .. 8 KiB, odd lengths
			layer := uintptr(r) * 1 << 20            // one "layer" per MiB
			if r%2 == 1 {
				layer += 32 << 20 // values
			}
			s = append(s, gpuSpan{a + layer + uintptr(b)*8192 + 4096, n})
			d = append(d, gpuSpan{a + 16<<20 + 4096 + uintptr(b*ranges+r)*8192 + 3, n})
		}
		src = append(src, gpuPlan(key, s...))
		dst = append(dst, gpuPlan(key, d...))
		objs[key] = gpuPattern(int(src[b].ObjectSize()), byte(b+1))
		gpuWritePlan(t, rt, dev, src[b], objs[key])
	}
	gpuWantCompleted(t, w, w.Store(src), "store")
	clearPlans(t, rt, dev, dst)
	gpuWantCompleted(t, w, w.Load(dst), "load")
	checkPlans(t, rt, dev, dst, objs)
	// And back over the sources, cleared first.
	clearPlans(t, rt, dev, src)
	gpuWantCompleted(t, w, w.Load(src), "load into the sources")
	checkPlans(t, rt, dev, src, objs)
}

// TestGPUSeveralAllocations moves blocks whose ranges rotate over four
// allocations of different sizes, and one 32 MiB single-range block.
func TestGPUSeveralAllocations(t *testing.T) { scenarioSeveralAllocations(t, realGPU(t)) }

func scenarioSeveralAllocations(t *testing.T, e gpuEnv) {
	rt, dev := e.rt, e.dev
	ep := e.server(t, "512MiB")
	sizes := []uint64{1 << 20, 3<<20 + 123, 72 << 20, 512 << 10}
	allocs := make([]uintptr, len(sizes))
	bufs := map[string]umbp.Buffer{}
	for i, n := range sizes {
		allocs[i] = gpuMalloc(t, rt, dev, n)
		bufs[fmt.Sprintf("alloc%d", i)] = umbp.Buffer{Ptr: allocs[i], Size: n}
	}
	w := gpuWorker(t, newRuntime(t, gpuConfig(t, ep)))
	if err := w.RegisterBuffers(context.Background(), bufs); err != nil {
		t.Fatal(err)
	}
	prefix := uniqueKeys(t)
	var src, dst []umbp.BlockTransferPlan
	objs := map[string][]byte{}
	const rlen = 2048 + 11
	for b := range 16 {
		key := fmt.Sprintf("%s-%d", prefix, b)
		var s, d []gpuSpan
		for r := range 6 {
			s = append(s, gpuSpan{allocs[(b+r)%4] + uintptr(b*6+r)*rlen, rlen})
			d = append(d, gpuSpan{allocs[(b+r+1)%4] + 256<<10 + uintptr(b*6+r)*rlen, rlen})
		}
		src = append(src, gpuPlan(key, s...))
		dst = append(dst, gpuPlan(key, d...))
		objs[key] = gpuPattern(int(src[b].ObjectSize()), byte(b+7))
		gpuWritePlan(t, rt, dev, src[b], objs[key])
	}
	big := prefix + "-big"
	bigSize := uint64(32 << 20)
	if e.small {
		bigSize = 2 << 20
	}
	src = append(src, gpuPlan(big, gpuSpan{allocs[2] + 1<<20, bigSize}))
	dst = append(dst, gpuPlan(big, gpuSpan{allocs[2] + 36<<20 + 5, bigSize}))
	objs[big] = gpuPattern(int(bigSize), 0x3c)
	gpuWritePlan(t, rt, dev, src[len(src)-1], objs[big])

	gpuWantCompleted(t, w, w.Store(src), "store")
	clearPlans(t, rt, dev, dst)
	gpuWantCompleted(t, w, w.Load(dst), "load")
	checkPlans(t, rt, dev, dst, objs)
}

// TestGPUReregistration registers one allocation from several handles, one
// after another and at once, and closes and re-creates them.
func TestGPUReregistration(t *testing.T) { scenarioReregistration(t, realGPU(t)) }

func scenarioReregistration(t *testing.T, e gpuEnv) {
	rt, dev := e.rt, e.dev
	ep := e.server(t, "256MiB")
	urt := newRuntime(t, gpuConfig(t, ep))
	const size = 8 << 20
	a := gpuMalloc(t, rt, dev, size)
	register := func(w *umbp.WorkerHandle, off uintptr) {
		t.Helper()
		if err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{"kv": {Ptr: a + off, Size: 1 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	prefix := uniqueKeys(t)
	plansAt := func(round int, base uintptr) []umbp.BlockTransferPlan {
		var ps []umbp.BlockTransferPlan
		for b := range 4 {
			key := fmt.Sprintf("%s-%d-%d", prefix, round, b)
			ps = append(ps, gpuPlan(key, gpuSpan{base + uintptr(b)*64<<10, 32 << 10}, gpuSpan{base + uintptr(b)*64<<10 + 40<<10, 8 << 10}))
		}
		return ps
	}
	objs := map[string][]byte{}
	storeRound := func(w *umbp.WorkerHandle, round int) []umbp.BlockTransferPlan {
		t.Helper()
		ps := plansAt(round, a+uintptr(round)*(512<<10))
		for i, p := range ps {
			objs[p.Key] = gpuPattern(int(p.ObjectSize()), byte(round*16+i))
			gpuWritePlan(t, rt, dev, p, objs[p.Key])
		}
		gpuWantCompleted(t, w, w.Store(ps), fmt.Sprintf("store round %d", round))
		return ps
	}
	loadCheck := func(w *umbp.WorkerHandle, round int, what string) {
		t.Helper()
		dst := plansAt(round, a+4<<20+uintptr(round)*(256<<10))
		clearPlans(t, rt, dev, dst)
		gpuWantCompleted(t, w, w.Load(dst), what)
		checkPlans(t, rt, dev, dst, objs)
	}

	w1 := gpuWorker(t, urt)
	register(w1, 0)
	storeRound(w1, 0)
	// A second handle on the same allocation, while the first holds it.
	w2 := gpuWorker(t, urt)
	register(w2, 2<<20)
	loadCheck(w2, 0, "second handle loads the first's blocks")
	storeRound(w2, 1)
	loadCheck(w1, 1, "first handle loads the second's blocks")
	// The first handle goes; a new one registers the same allocation again.
	if err := w1.Close(); err != nil {
		t.Fatal(err)
	}
	w3 := gpuWorker(t, urt)
	register(w3, 0)
	loadCheck(w3, 0, "re-created handle")
	loadCheck(w2, 1, "the surviving handle")
	// Every handle goes, then one comes back.
	for _, w := range []*umbp.WorkerHandle{w2, w3} {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	w4 := gpuWorker(t, urt)
	register(w4, 3<<20)
	loadCheck(w4, 1, "handle after all were closed")
	storeRound(w4, 2)
	loadCheck(w4, 2, "store after all were closed")
	// Several handles register at once.
	var wg sync.WaitGroup
	ws := make([]*umbp.WorkerHandle, 4)
	for i := range ws {
		ws[i] = gpuWorker(t, urt)
	}
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{"kv": {Ptr: a, Size: size}}); err != nil {
				t.Errorf("concurrent registration: %v", err)
			}
		}()
	}
	wg.Wait()
	for i, w := range ws {
		loadCheck(w, i%3, fmt.Sprintf("concurrently registered handle %d", i))
	}
}

// pinnedHost maps size bytes outside the Go heap and pins them (pin=false
// leaves them pageable).
func pinnedHost(t *testing.T, rt *hip.Runtime, size int, pin bool) ([]byte, uintptr) {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	if pin {
		if err := rt.HostRegisterWithFlags(p, uint64(size), hip.HostRegisterPortable); err != nil {
			t.Fatalf("HostRegister: %v", err)
		}
	}
	t.Cleanup(func() {
		if pin {
			if err := rt.HostUnregister(p); err != nil {
				t.Errorf("HostUnregister: %v", err)
			}
		}
		_ = syscall.Munmap(b)
	})
	return b, p
}

// TestGPUAfterStream stores memory that an asynchronous copy on the
// engine's stream is still filling, and loads into memory that copies on
// the stream are still reading: AfterStream makes the store read its source
// only once the copy is done, and the load write its destination only once
// the reads are.
func TestGPUAfterStream(t *testing.T) { scenarioAfterStream(t, realGPU(t)) }

func scenarioAfterStream(t *testing.T, e gpuEnv) {
	rt, dev := e.rt, e.dev
	ep := e.server(t, "512MiB")
	size := uint64(128 << 20)
	if e.small {
		size = 1 << 20
	}
	a := gpuMalloc(t, rt, dev, 2*size)
	w := gpuWorker(t, newRuntime(t, gpuConfig(t, ep)))
	if err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{"kv": {Ptr: a, Size: 2 * size}}); err != nil {
		t.Fatal(err)
	}
	host, hp := pinnedHost(t, rt, int(size), true)
	copy(host, gpuPattern(int(size), 0x5a))
	seen, sp := pinnedHost(t, rt, int(size), true) // what the stream reads of the load's destination
	s, err := rt.StreamCreate(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.StreamDestroy(dev, s)
	key := uniqueKeys(t)
	for round := range 3 {
		k := fmt.Sprintf("%s-%d", key, round)
		// Queue the copy (and a slow tail: the same bytes four times over),
		// then the store at once.
		for range 4 {
			if err := rt.MemcpyAsync(dev, a, hp, size, hip.MemcpyHostToDevice, s); err != nil {
				t.Fatal(err)
			}
		}
		job := w.Store([]umbp.BlockTransferPlan{gpuPlan(k, gpuSpan{a, size})}, umbp.AfterStream(dev, uintptr(s)))
		gpuWantCompleted(t, w, job, "store after the stream")
		if err := rt.StreamSynchronize(dev, s); err != nil {
			t.Fatal(err)
		}
		// Queue copies out of the cleared destination (the same bytes four
		// times over), then the load into it at once: the copies must read
		// zeros, not the loaded bytes.
		dst := gpuPlan(k, gpuSpan{a + uintptr(size), size})
		clearPlans(t, rt, dev, []umbp.BlockTransferPlan{dst})
		copy(seen, gpuPattern(int(size), 0xa5))
		for range 4 {
			if err := rt.MemcpyAsync(dev, sp, a+uintptr(size), size, hip.MemcpyDeviceToHost, s); err != nil {
				t.Fatal(err)
			}
		}
		gpuWantCompleted(t, w, w.Load([]umbp.BlockTransferPlan{dst}, umbp.AfterStream(dev, uintptr(s))), "load after the stream")
		if err := rt.StreamSynchronize(dev, s); err != nil {
			t.Fatal(err)
		}
		if i := slices.IndexFunc(seen, func(b byte) bool { return b != 0 }); i >= 0 {
			t.Fatalf("round %d: the stream read the destination's byte %d as %#x: the load wrote it before the stream was done", round, i, seen[i])
		}
		checkPlans(t, rt, dev, []umbp.BlockTransferPlan{dst}, map[string][]byte{k: host})
		// Scramble the source for the next round.
		if err := rt.CopyToDevice(dev, a, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGPUBandwidth measures Store and Load of 64 objects of 4 MiB held in
// GPU memory, next to plain device-host copies of the same bytes, 4 MiB at
// a time, into pinned and pageable host memory. It reports medians of
// several repetitions.
func TestGPUBandwidth(t *testing.T) { scenarioBandwidth(t, realGPU(t)) }

func scenarioBandwidth(t *testing.T, e gpuEnv) {
	rt, dev := e.rt, e.dev
	ep := e.server(t, "1GiB")
	objects, objSize, reps := 64, 4<<20, 7
	if e.small {
		objects, objSize, reps = 8, 256<<10, 2
	}
	total := objects * objSize
	src := gpuMalloc(t, rt, dev, uint64(total))
	dst := gpuMalloc(t, rt, dev, uint64(total))
	want := gpuPattern(total, 0xa7)
	if err := rt.CopyToDevice(dev, src, want); err != nil {
		t.Fatal(err)
	}
	urt := newRuntime(t, gpuConfig(t, ep))
	w := gpuWorker(t, urt)
	if err := w.RegisterBuffers(context.Background(), map[string]umbp.Buffer{
		"src": {Ptr: src, Size: uint64(total)}, "dst": {Ptr: dst, Size: uint64(total)},
	}); err != nil {
		t.Fatal(err)
	}
	sched, err := urt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Close()

	type row struct {
		name string
		dur  []time.Duration
	}
	var rows []*row
	measure := func(name string, f func()) {
		r := &row{name: name}
		f() // warm-up
		for range reps {
			start := time.Now()
			f()
			r.dur = append(r.dur, time.Since(start))
		}
		rows = append(rows, r)
	}

	// Plain copies, 4 MiB at a time, as the server makes them.
	for _, pin := range []bool{true, false} {
		kind := "pageable"
		if pin {
			kind = "pinned"
		}
		_, hp := pinnedHost(t, rt, total, pin)
		measure("memcpy DtoH "+kind, func() {
			for i := range objects {
				off := uintptr(i * objSize)
				if err := rt.Memcpy(dev, hp+off, src+off, uint64(objSize), hip.MemcpyDeviceToHost); err != nil {
					t.Fatal(err)
				}
			}
		})
		measure("memcpy HtoD "+kind, func() {
			for i := range objects {
				off := uintptr(i * objSize)
				if err := rt.Memcpy(dev, dst+off, hp+off, uint64(objSize), hip.MemcpyHostToDevice); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	prefix := uniqueKeys(t)
	// plans splits each object into ranges: consecutive in memory (which the
	// worker merges into one), or laid out layer-major as an engine's KV
	// cache is, range r of every object in layer r's slab.
	plans := func(base uintptr, tag string, ranges int, layerMajor bool) []umbp.BlockTransferPlan {
		ps := make([]umbp.BlockTransferPlan, objects)
		n := uint64(objSize / ranges)
		for i := range ps {
			var spans []gpuSpan
			for r := range ranges {
				at := base + uintptr(i*objSize) + uintptr(r)*uintptr(n)
				if layerMajor {
					at = base + uintptr(r*objects*int(n)) + uintptr(i)*uintptr(n)
				}
				spans = append(spans, gpuSpan{at, n})
			}
			ps[i] = gpuPlan(fmt.Sprintf("%s-%s-%d", prefix, tag, i), spans...)
		}
		return ps
	}
	// run stores or loads ps as jobs of per plans each, all submitted at once.
	run := func(load bool, ps []umbp.BlockTransferPlan, per int) {
		var jobs []*umbp.TransferJob
		for c := range slices.Chunk(ps, per) {
			if load {
				jobs = append(jobs, w.Load(c))
			} else {
				jobs = append(jobs, w.Store(c))
			}
		}
		for _, j := range jobs {
			gpuWantCompleted(t, w, j, "transfer")
		}
	}
	got, zero := make([]byte, total), make([]byte, total)
	for _, v := range []struct {
		name       string
		per        int // plans per job
		ranges     int // ranges per object
		layerMajor bool
	}{
		{fmt.Sprintf("1 job of %d objects, 1 range", objects), objects, 1, false},
		{fmt.Sprintf("4 jobs of %d objects, 1 range", objects/4), objects / 4, 1, false},
		{fmt.Sprintf("1 job of %d objects, 16 ranges, merged", objects), objects, 16, false},
		{fmt.Sprintf("1 job of %d objects, 16 layers", objects), objects, 16, true},
		{fmt.Sprintf("1 job of %d objects, 128 layers", objects), objects, 128, true},
		{fmt.Sprintf("8 jobs of %d objects, 128 layers", objects/8), objects / 8, 128, true},
	} {
		store, load := &row{name: "Store, " + v.name}, &row{name: "Load,  " + v.name}
		for rep := -1; rep < reps; rep++ { // rep -1 warms up
			tag := fmt.Sprintf("%d-%d-%d", v.per, v.ranges, rep)
			srcPlans, dstPlans := plans(src, tag, v.ranges, v.layerMajor), plans(dst, tag, v.ranges, v.layerMajor)
			start := time.Now()
			run(false, srcPlans, v.per)
			mid := time.Now()
			run(true, dstPlans, v.per)
			end := time.Now()
			if rep >= 0 {
				store.dur = append(store.dur, mid.Sub(start))
				load.dur = append(load.dur, end.Sub(mid))
			}
			if sched.Clear(context.Background()) != nil {
				t.Fatal("Clear failed")
			}
			if rep == reps-1 {
				if err := rt.CopyFromDevice(dev, got, dst); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s: loaded bytes differ from the stored ones", v.name)
				}
			}
			if err := rt.CopyToDevice(dev, dst, zero); err != nil {
				t.Fatal(err)
			}
		}
		rows = append(rows, store, load)
	}

	median := func(r *row) (med, lo, hi float64) {
		gbps := make([]float64, len(r.dur))
		for i, d := range r.dur {
			gbps[i] = float64(total) / d.Seconds() / 1e9
		}
		slices.Sort(gbps)
		return gbps[len(gbps)/2], gbps[0], gbps[len(gbps)-1]
	}
	dtoh, _, _ := median(rows[0]) // memcpy DtoH pinned
	htod, _, _ := median(rows[1]) // memcpy HtoD pinned
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d objects of %d KiB (%d MiB a transfer) on device %d, %s\n", objects, objSize>>10, total>>20, dev, rt)
	fmt.Fprintf(&sb, "GB/s, median of %d repetitions (min-max); last column: against the pinned memcpy of the same direction\n", reps)
	for _, r := range rows {
		med, lo, hi := median(r)
		rel := ""
		switch {
		case strings.HasPrefix(r.name, "Store"):
			rel = fmt.Sprintf("%4.0f%%", 100*med/dtoh)
		case strings.HasPrefix(r.name, "Load"):
			rel = fmt.Sprintf("%4.0f%%", 100*med/htod)
		}
		fmt.Fprintf(&sb, "  %-48s %7.2f  (%6.2f-%6.2f)  %s\n", r.name, med, lo, hi, rel)
	}
	t.Log("\n" + sb.String())
	if dir := os.Getenv("OUT"); dir != "" && !e.small {
		if err := os.WriteFile(filepath.Join(dir, "gpu-bandwidth.txt"), []byte(sb.String()), 0o644); err != nil {
			t.Logf("write $OUT/gpu-bandwidth.txt: %v", err)
		}
	}
}

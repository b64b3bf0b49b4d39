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
	gpuRegister(t, w, map[string]umbp.Buffer{
		"k": {Ptr: a + 4096, Size: 16 << 20},
		"v": {Ptr: a + 32<<20, Size: 16 << 20, Location: umbp.LocationGPU, Device: dev},
		"s": {Ptr: a + 60<<20 + 17, Size: 1000},
	})
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
	gpuRegister(t, w, bufs)
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
		gpuRegister(t, w, map[string]umbp.Buffer{"kv": {Ptr: a + off, Size: 1 << 20}})
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
			_ = syscall.Munmap(b)
			gpuPathNotRun(t, "pinned host memory (HostRegister)", err)
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
	gpuRegister(t, w, map[string]umbp.Buffer{"kv": {Ptr: a, Size: 2 * size}})
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

// TestGPUBandwidth measures Store and Load from GPU memory of 64 objects of
// 4 MiB, one range each, and of 64 objects of 128 layers of 32 KiB laid
// out layer-major as an engine's KV cache is, next to plain copies of the
// same bytes between the same device memory and pinned, then pageable,
// host memory (4 MiB, then 32 KiB, at a time): one table, medians of
// several repetitions, each Load checked byte for byte at its end.
func TestGPUBandwidth(t *testing.T) { scenarioBandwidth(t, realGPU(t)) }

func scenarioBandwidth(t *testing.T, e gpuEnv) {
	rt, dev := e.rt, e.dev
	ep := e.server(t, "1GiB")
	objects, objSize, layers, reps := 64, 4<<20, 128, 7
	if e.small {
		objects, objSize, layers, reps = 8, 256<<10, 8, 2
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
	gpuRegister(t, w, map[string]umbp.Buffer{
		"src": {Ptr: src, Size: uint64(total)}, "dst": {Ptr: dst, Size: uint64(total)},
	})
	sched, err := urt.NewSchedulerHandle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Close()
	_, pinned := pinnedHost(t, rt, total, true)
	_, pageable := pinnedHost(t, rt, total, false)

	type row struct {
		name  string
		dtoh  bool // the direction: device to host (a Store), or host to device
		dur   []time.Duration
		first bool // the section's pinned copy, which the others are set against
	}
	type section struct {
		title string
		rows  []*row
	}
	var sections []*section
	timed := func(f func()) time.Duration {
		start := time.Now()
		f()
		return time.Since(start)
	}
	// at is where piece r of object i lies, in a transfer's memory from
	// base: the object's ranges in turn, or layer-major (piece r of every
	// object in layer r's slab).
	at := func(base uintptr, i, r, ranges int, layerMajor bool) uintptr {
		n := objSize / ranges
		if layerMajor {
			return base + uintptr(r*objects*n+i*n)
		}
		return base + uintptr(i*objSize+r*n)
	}
	prefix := uniqueKeys(t)
	plans := func(base uintptr, tag string, ranges int, layerMajor bool) []umbp.BlockTransferPlan {
		ps := make([]umbp.BlockTransferPlan, objects)
		n := uint64(objSize / ranges)
		for i := range ps {
			spans := make([]gpuSpan, ranges)
			for r := range spans {
				spans[r] = gpuSpan{at(base, i, r, ranges, layerMajor), n}
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
	type variant struct {
		name string
		per  int // plans a job
	}
	for _, sec := range []struct {
		title      string
		ranges     int
		layerMajor bool
		variants   []variant
		merged     int // also: this many adjacent ranges an object, which the worker merges into one
	}{
		{fmt.Sprintf("%d objects x %s, one range an object", objects, sizeText(objSize)), 1, false,
			[]variant{{fmt.Sprintf("1 job of %d objects", objects), objects}, {fmt.Sprintf("4 jobs of %d objects", objects/4), objects / 4}}, 16},
		{fmt.Sprintf("%d objects x %d layers x %s, layer-major", objects, layers, sizeText(objSize/layers)), layers, true,
			[]variant{{fmt.Sprintf("1 job of %d objects", objects), objects}, {fmt.Sprintf("8 jobs of %d objects", objects/8), objects / 8}}, 0},
	} {
		s := &section{title: sec.title}
		sections = append(sections, s)
		piece := objSize / sec.ranges
		// Plain copies of the same pieces, between the same device memory
		// and host memory laid out alike.
		for _, host := range []struct {
			kind string
			base uintptr
		}{{"pinned", pinned}, {"pageable", pageable}} {
			for _, dtoh := range []bool{true, false} {
				dir, kind := "host->device", hip.MemcpyHostToDevice
				if dtoh {
					dir, kind = "device->host", hip.MemcpyDeviceToHost
				}
				r := &row{name: fmt.Sprintf("memcpy %s, %s, %s at a time", dir, host.kind, sizeText(piece)), dtoh: dtoh, first: host.kind == "pinned"}
				copyAll := func() {
					for i := range objects {
						for p := range sec.ranges {
							off := at(0, i, p, sec.ranges, sec.layerMajor)
							d, h := dst+off, host.base+off
							from, to := h, d
							if dtoh {
								from, to = src+off, h
							}
							if err := rt.Memcpy(dev, to, from, uint64(piece), kind); err != nil {
								t.Fatal(err)
							}
						}
					}
				}
				copyAll() // warm-up
				for range reps {
					r.dur = append(r.dur, timed(copyAll))
				}
				s.rows = append(s.rows, r)
			}
		}
		vs := slices.Clone(sec.variants)
		if sec.merged > 0 {
			vs = append(vs, variant{fmt.Sprintf("1 job, %d adjacent ranges an object", sec.merged), objects})
		}
		for vi, v := range vs {
			ranges := sec.ranges
			if vi >= len(sec.variants) {
				ranges = sec.merged
			}
			store := &row{name: "Store, " + v.name, dtoh: true}
			load := &row{name: "Load,  " + v.name}
			for rep := -1; rep < reps; rep++ { // rep -1 warms up
				tag := fmt.Sprintf("%d-%d-%d-%v", v.per, ranges, rep, sec.layerMajor)
				srcPlans, dstPlans := plans(src, tag, ranges, sec.layerMajor), plans(dst, tag, ranges, sec.layerMajor)
				if err := rt.CopyToDevice(dev, dst, zero); err != nil {
					t.Fatal(err)
				}
				st := timed(func() { run(false, srcPlans, v.per) })
				ld := timed(func() { run(true, dstPlans, v.per) })
				if rep >= 0 {
					store.dur = append(store.dur, st)
					load.dur = append(load.dur, ld)
				}
				if sched.Clear(context.Background()) != nil {
					t.Fatal("Clear failed")
				}
				if rep == reps-1 {
					if err := rt.CopyFromDevice(dev, got, dst); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("%s, %s: loaded bytes differ from the stored ones", sec.title, v.name)
					}
				}
			}
			s.rows = append(s.rows, store, load)
		}
	}

	median := func(r *row) (med, lo, hi float64) {
		gbps := make([]float64, len(r.dur))
		for i, d := range r.dur {
			gbps[i] = float64(total) / d.Seconds() / 1e9
		}
		slices.Sort(gbps)
		return gbps[len(gbps)/2], gbps[0], gbps[len(gbps)-1]
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "GPU bandwidth on device %d, %s: GB/s of %d MiB a transfer, median of %d repetitions (min-max);\n", dev, rt, total>>20, reps)
	fmt.Fprintf(&sb, "last column: against the plain copy of the same pieces to or from pinned host memory, same direction\n")
	for _, s := range sections {
		base := map[bool]float64{} // by direction
		for _, r := range s.rows {
			if r.first {
				base[r.dtoh], _, _ = median(r)
			}
		}
		fmt.Fprintf(&sb, "%s\n", s.title)
		for _, r := range s.rows {
			med, lo, hi := median(r)
			fmt.Fprintf(&sb, "  %-52s %7.2f  (%6.2f-%6.2f)  %4.0f%%\n", r.name, med, lo, hi, 100*med/base[r.dtoh])
		}
	}
	t.Log("\n" + sb.String())
	if dir := os.Getenv("OUT"); dir != "" && !e.small {
		if err := os.WriteFile(filepath.Join(dir, "gpu-bandwidth.txt"), []byte(sb.String()), 0o644); err != nil {
			t.Logf("write $OUT/gpu-bandwidth.txt: %v", err)
		}
	}
}

// sizeText writes n bytes in MiB, or KiB below 1 MiB.
func sizeText(n int) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

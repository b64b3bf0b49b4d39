package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
)

// The standard suite: the workload of the C++ bench client umbp_bench
// that docs/PERFORMANCE.md measured (the same calls through MORI's
// StandaloneProcessClient; built outside this repository, not one of
// MORI's programs), through this module's public API, printed under the
// same names, so that one script can put the C++ client and this one side
// by side on one server process:
//
//   - exists_{1,64,1024}_us: the median of existsReps lookups of that many
//     keys, all held (1024 objects of 4 KiB stored first);
//     exists_{1,64,1024}_grpc_us the same through grpc-go's call path
//     (Config.GRPCLookups). The two paths run in turn, in blocks of
//     lookupBlock measured lookups after lookupWarm unmeasured, so that
//     both see the same machine and neither runs beside the other's
//     leftovers;
//   - put/get_64KiBx256_GBps, put/get_4MiBx64_GBps: the median of bwReps
//     jobs of that many objects of one range each (the pool is cleared,
//     unmeasured, before each store; the destination zeroed before each
//     load);
//   - put/get_ranges_256x32x2KiB_GBps: 256 objects of 32 ranges of 2 KiB,
//     range j of object i at slot j·256+i of the buffer, as a layer-major KV
//     cache;
//   - with jobs, each job's own figure after its row's median, as
//     put_64KiBx256_job3_GBps (the third job of that row), so that a
//     row's first jobs after the server starts can be told from the rest.
//
// Every loaded byte is checked ("verify ok"). A figure times the whole
// call, as umbp_bench does: Store (or Load) and Wait.

// The lookups' blocks (see above).
const (
	lookupBlock = 50
	lookupWarm  = 5
)

// suiteConfig sizes the suite; the zero scale is the standard workload.
type suiteConfig struct {
	existsReps int
	bwReps     int
	jobs       bool // each job's figure too
	scale      int  // divides every object size (tests); 0 means 1
}

// suiteLine is one figure of the suite.
type suiteLine struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
}

// suite runs the standard workload on rt and writes each figure to out as
// it is measured; grpcRT, rt's server with Config.GRPCLookups, looks up
// the same keys. The pool is cleared before and after.
func suite(ctx context.Context, rt, grpcRT *umbp.StandaloneRuntime, sc suiteConfig, out func(suiteLine)) error {
	scale := uint64(max(sc.scale, 1))
	half := uint64(256<<20) / scale
	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		return err
	}
	defer sched.Close()
	grpcSched, err := grpcRT.NewSchedulerHandle(ctx)
	if err != nil {
		return err
	}
	defer grpcSched.Close()
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		return err
	}
	hb, err := umbp.NewHostBuffer(int(2 * half))
	if err != nil {
		_ = w.Close()
		return err
	}
	defer func() {
		if w.Close() == nil { // memory the server may still use is kept
			_ = hb.Close()
		}
	}()
	mem := hb.Bytes()
	src, dst := mem[:half], mem[half:]
	for i := 0; i+8 <= len(src); i += 8 {
		binary.LittleEndian.PutUint64(src[i:], uint64(i)*0x9E3779B97F4A7C15^0x5bd1e995)
	}
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"bench": hb.Buffer()}); err != nil {
		return err
	}
	if err := sched.Clear(ctx); err != nil {
		return err
	}
	defer sched.Clear(context.WithoutCancel(ctx))
	base := hb.Buffer().Ptr
	plan := func(key string, ranges []umbp.KVRange) umbp.BlockTransferPlan {
		return umbp.BlockTransferPlan{Key: key, Ranges: ranges}
	}
	one := func(off, size uint64) []umbp.KVRange {
		return []umbp.KVRange{{LayerName: "bench", BaseAddress: base + uintptr(off), Length: size}}
	}
	do := func(what string, submit func() *umbp.TransferJob) (time.Duration, error) {
		start := time.Now()
		if err := w.Wait(ctx, submit()); err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		return time.Since(start), nil
	}

	// Lookups.
	const existsObjects = 1024
	existsSize := 4096 / scale
	keys := make([]string, existsObjects)
	plans := make([]umbp.BlockTransferPlan, existsObjects)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench-exists-%d", i)
		plans[i] = plan(keys[i], one(uint64(i)*existsSize, existsSize))
	}
	if _, err := do("store the keys to look up", func() *umbp.TransferJob { return w.Store(plans) }); err != nil {
		return err
	}
	for _, n := range []int{1, 64, 1024} {
		var us, grpcUS []float64
		// Blocks of each path in turn, the first of each pair alternating;
		// a block's first lookupWarm calls unmeasured: a grpc-go call
		// leaves its channel's goroutines busy after it returns, which
		// slows a lock-step call made right after it.
		for b := 0; len(us) < sc.existsReps || len(grpcUS) < sc.existsReps; b++ {
			for j := range 2 {
				h, into := sched, &us
				if (b+j)%2 == 1 {
					h, into = grpcSched, &grpcUS
				}
				for i := range lookupWarm + lookupBlock {
					if i >= lookupWarm && len(*into) >= sc.existsReps {
						break
					}
					start := time.Now()
					hits := h.Lookup(ctx, keys[:n])
					took := time.Since(start)
					if slices.Contains(hits, false) {
						return fmt.Errorf("exists_%d: a stored key missed (the server stalled or evicted it)", n)
					}
					if i >= lookupWarm {
						*into = append(*into, float64(took.Nanoseconds())/1e3)
					}
				}
			}
		}
		out(suiteLine{fmt.Sprintf("exists_%d_us", n), median(us)})
		out(suiteLine{fmt.Sprintf("exists_%d_grpc_us", n), median(grpcUS)})
	}

	// Bandwidth: store bwReps times (new keys each), then load as often.
	// settle makes lookupWarm lock-step lookups after the pool's Clear, a
	// call through grpc-go, so that the store timed next does not run
	// beside that call's leftovers (see the lookups above).
	settle := func() {
		for range lookupWarm {
			sched.Lookup(ctx, keys[:1])
		}
	}
	bandwidth := func(tag string, n int, size uint64, ranges func(i int, off uint64) []umbp.KVRange) error {
		total := uint64(n) * size
		storePlans := make([]umbp.BlockTransferPlan, n)
		loadPlans := make([]umbp.BlockTransferPlan, n)
		var put, get []float64
		for r := range sc.bwReps {
			if err := sched.Clear(ctx); err != nil {
				return fmt.Errorf("%s: %w", tag, err)
			}
			settle()
			for i := range n {
				key := fmt.Sprintf("bench-%s-%d-%d", tag, r, i)
				storePlans[i] = plan(key, ranges(i, 0))
				loadPlans[i] = plan(key, ranges(i, half))
			}
			took, err := do("put_"+tag, func() *umbp.TransferJob { return w.Store(storePlans) })
			if err != nil {
				return err
			}
			put = append(put, float64(total)/float64(took.Nanoseconds()))
		}
		for range sc.bwReps {
			clear(dst[:total])
			took, err := do("get_"+tag, func() *umbp.TransferJob { return w.Load(loadPlans) })
			if err != nil {
				return err
			}
			get = append(get, float64(total)/float64(took.Nanoseconds()))
		}
		if !bytes.Equal(src[:total], dst[:total]) {
			return fmt.Errorf("get_%s: the loaded bytes differ from the stored ones", tag)
		}
		for _, row := range []struct {
			name string
			v    []float64
		}{{"put_" + tag, put}, {"get_" + tag, get}} {
			out(suiteLine{row.name + "_GBps", median(row.v)})
			if sc.jobs {
				for j, v := range row.v {
					out(suiteLine{fmt.Sprintf("%s_job%d_GBps", row.name, j+1), v})
				}
			}
		}
		return nil
	}
	contiguous := func(size uint64) func(int, uint64) []umbp.KVRange {
		return func(i int, off uint64) []umbp.KVRange { return one(off+uint64(i)*size, size) }
	}
	if err := bandwidth("64KiBx256", 256, (64<<10)/scale, contiguous((64<<10)/scale)); err != nil {
		return err
	}
	if err := bandwidth("4MiBx64", 64, (4<<20)/scale, contiguous((4<<20)/scale)); err != nil {
		return err
	}
	const objects, layers = 256, 32
	rs := 2048 / scale
	scattered := func(i int, off uint64) []umbp.KVRange {
		rr := make([]umbp.KVRange, layers)
		for j := range rr {
			rr[j] = umbp.KVRange{LayerName: "bench", BaseAddress: base + uintptr(off+uint64(j*objects+i)*rs), Length: rs, ObjectOffset: uint64(j) * rs}
		}
		return rr
	}
	if err := bandwidth("ranges_256x32x2KiB", objects, layers*rs, scattered); err != nil {
		return err
	}
	out(suiteLine{"verify ok", 0})
	return nil
}

// printSuiteLine writes a figure as umbp_bench does: its name, a space and
// the value ("verify ok" alone).
func printSuiteLine(w io.Writer, l suiteLine) {
	if l.Name == "verify ok" {
		fmt.Fprintln(w, l.Name)
		return
	}
	fmt.Fprintf(w, "%s %.2f\n", l.Name, l.Value)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// runSuite runs the standard suite for bench -suite.
func runSuite(ctx context.Context, e env, c *common, sc suiteConfig, asJSON bool) error {
	if sc.existsReps <= 0 || sc.bwReps <= 0 {
		return fmt.Errorf("%w: -exists-reps and -bw-reps must be positive", errUsage)
	}
	rt, err := c.runtime()
	if err != nil {
		return err
	}
	grpcRT, err := c.runtime(func(cfg *umbp.Config) { cfg.GRPCLookups = true })
	if err != nil {
		return err
	}
	var lines []suiteLine
	err = suite(ctx, rt, grpcRT, sc, func(l suiteLine) {
		if asJSON {
			lines = append(lines, l)
		} else {
			printSuiteLine(e.stdout, l)
		}
	})
	if asJSON {
		if jerr := printJSON(e, lines); jerr != nil {
			return errors.Join(err, jerr)
		}
	}
	return err
}

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/umbp-go/umbp-go/internal/bytesize"
	"github.com/umbp-go/umbp-go/umbp"
)

// benchConfig is what bench measures.
type benchConfig struct {
	objects    int
	objectSize uint64
	ranges     int
	batch      int
	rounds     int
	workers    int
	verify     bool
	progress   string
}

// benchResult is what bench reports; -json prints it as is.
type benchResult struct {
	Endpoint   string `json:"endpoint"`
	Mode       string `json:"mode"`
	RangedIO   bool   `json:"ranged_io"`
	Namespace  string `json:"namespace"`
	Objects    int    `json:"objects"`
	ObjectSize uint64 `json:"object_size"`
	Ranges     int    `json:"ranges"`
	Batch      int    `json:"batch"`
	Workers    int    `json:"workers"`
	Rounds     int    `json:"rounds"`
	// Per round: GB/s (1e9 bytes a second) of object bytes, and the
	// seconds one Lookup of the round's keys took: lock-step (the
	// default), and through grpc-go (Config.GRPCLookups), the first of
	// the two in turn.
	StoreGBps         []float64 `json:"store_gbps"`
	LoadGBps          []float64 `json:"load_gbps"`
	LookupSeconds     []float64 `json:"lookup_seconds"`
	LookupGRPCSeconds []float64 `json:"lookup_grpc_seconds"`
	LookupHits        []int     `json:"lookup_hits"`
	Verified          bool      `json:"verified"`
}

func benchFlags(fs *flag.FlagSet, c *common) func(context.Context, env, []string) error {
	c.register(fs, 30*time.Second, "how long to wait for the server to answer at start, and each transfer's deadline")
	var bc benchConfig
	size := fs.String("object-size", "1MiB", "bytes per object (block); suffixes as 4MiB, 256KiB, 1GB")
	fs.IntVar(&bc.objects, "objects", 64, "objects stored and loaded per round")
	fs.IntVar(&bc.ranges, "ranges", 1, "ranges per object: each object gathers one chunk from each of this many layer regions, as a layer-major KV cache")
	fs.IntVar(&bc.batch, "batch", 0, "objects per job; 0 puts a round's objects in one job")
	fs.IntVar(&bc.rounds, "rounds", 5, "rounds: each stores new keys, looks them up, loads them back")
	fs.IntVar(&bc.workers, "workers", umbp.DefaultNumWorkers, "transfer goroutines of the worker handle")
	fs.BoolVar(&bc.verify, "verify", true, "check that every loaded byte is what was stored")
	fs.StringVar(&bc.progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), on or off")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	standard := fs.Bool("suite", false, "run the standard suite instead, the workload of the C++ umbp_bench client docs/PERFORMANCE.md compares with, printing the same figures under the same names (lookups of 1, 64 and 1024 keys; 256 × 64 KiB, 64 × 4 MiB and 256 × 32 × 2 KiB scattered ranges, stored and loaded)")
	var sc suiteConfig
	fs.IntVar(&sc.existsReps, "exists-reps", 200, "with -suite: lookups timed per key count")
	fs.IntVar(&sc.bwReps, "bw-reps", 7, "with -suite: stores and loads timed per workload")
	fs.BoolVar(&sc.jobs, "jobs", false, "with -suite: print each store's and load's figure too, after its row's median, as put_64KiBx256_job1_GBps (a row's first jobs on a server just started are slower)")
	yes := fs.Bool("yes", false, "with -suite: really run it: the suite clears the pool before each store, and every engine attached to the server loses its stored KV")
	return func(ctx context.Context, e env, args []string) error {
		if len(args) != 0 {
			return fmt.Errorf("%w: unexpected arguments %q", errUsage, args)
		}
		// Each mode has flags of its own; one given to the other would be
		// ignored.
		var other []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "objects", "object-size", "ranges", "batch", "rounds", "workers", "verify", "progress":
				if *standard {
					other = append(other, "-"+f.Name)
				}
			case "exists-reps", "bw-reps", "jobs", "yes":
				if !*standard {
					other = append(other, "-"+f.Name)
				}
			}
		})
		if len(other) > 0 {
			mode := "without -suite"
			if *standard {
				mode = "with -suite"
			}
			return fmt.Errorf("%w: %s has no effect %s", errUsage, strings.Join(other, ", "), mode)
		}
		if *standard {
			if !*yes {
				return fmt.Errorf("%w: the suite clears the pool before each store, dropping the KV of every engine on the server; pass -yes to run it", errUsage)
			}
			return runSuite(ctx, e, c, sc, *asJSON)
		}
		var err error
		if bc.objectSize, err = bytesize.Parse(*size); err != nil {
			return fmt.Errorf("%w: -object-size: %w", errUsage, err)
		}
		if err := bc.validate(); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		rt, err := c.runtime(func(cfg *umbp.Config) { cfg.NumWorkers = bc.workers })
		if err != nil {
			return err
		}
		grpcRT, err := c.runtime(func(cfg *umbp.Config) { cfg.GRPCLookups = true })
		if err != nil {
			return err
		}
		res, err := bench(ctx, e, c, rt, grpcRT, bc)
		if res != nil {
			if *asJSON {
				if jerr := printJSON(e, res); jerr != nil {
					return errors.Join(err, jerr)
				}
			} else {
				printBench(e.stdout, res)
			}
		}
		return err
	}
}

func (bc *benchConfig) validate() error {
	switch {
	case bc.objects <= 0:
		return fmt.Errorf("-objects must be positive")
	case bc.ranges <= 0:
		return fmt.Errorf("-ranges must be positive")
	case bc.objectSize%uint64(bc.ranges) != 0:
		return fmt.Errorf("-object-size %d is not a multiple of -ranges %d", bc.objectSize, bc.ranges)
	case bc.batch < 0:
		return fmt.Errorf("-batch must not be negative")
	case bc.rounds <= 0:
		return fmt.Errorf("-rounds must be positive")
	case bc.workers <= 0:
		return fmt.Errorf("-workers must be positive")
	case bc.objectSize > math.MaxInt/2/uint64(bc.objects):
		return fmt.Errorf("-objects %d of %d bytes do not fit in memory", bc.objects, bc.objectSize)
	}
	// A source and a destination buffer of a round's objects each.
	if need, have := 2*uint64(bc.objects)*bc.objectSize, hostMemory(); have > 0 && need > have {
		return fmt.Errorf("-objects %d of -object-size %s need %s of host memory (a source and a destination buffer), more than this host's memory and swap (%s)",
			bc.objects, formatBytes(bc.objectSize), humanBytes(need), humanBytes(have))
	}
	switch bc.progress {
	case "auto", "on", "off":
	default:
		return fmt.Errorf("-progress %q: want auto, on or off", bc.progress)
	}
	if bc.batch == 0 || bc.batch > bc.objects {
		bc.batch = bc.objects
	}
	return nil
}

// bench stores, looks up and loads bc.rounds rounds of new objects through
// one worker handle and one scheduler handle, and looks them up through a
// scheduler handle of grpcRT too. It returns what it measured so far, with
// an error when a round failed.
func bench(ctx context.Context, e env, c *common, rt, grpcRT *umbp.StandaloneRuntime, bc benchConfig) (res *benchResult, err error) {
	total := uint64(bc.objects) * bc.objectSize
	chunk := bc.objectSize / uint64(bc.ranges)
	src, err := umbp.NewHostBuffer(int(total))
	if err != nil {
		return nil, err
	}
	dst, err := umbp.NewHostBuffer(int(total))
	if err != nil {
		src.Close()
		return nil, err
	}
	// layout places object i's chunk k at region k's block i: regions of
	// objects*chunk bytes, one after another, in both buffers.
	layout := func(b *umbp.HostBuffer) *umbp.KVLayoutDescriptor {
		l := &umbp.KVLayoutDescriptor{}
		for k := range bc.ranges {
			l.Regions = append(l.Regions, umbp.KVRegion{
				LayerName:   fmt.Sprintf("layer%d", k),
				BaseAddress: b.Buffer().Ptr + uintptr(uint64(k)*uint64(bc.objects)*chunk),
				NumBlocks:   bc.objects,
				BlockBytes:  chunk,
				Stride:      chunk,
			})
		}
		return l
	}
	srcPlanner, err := umbp.NewLayoutPlanner(layout(src))
	if err == nil {
		var dstPlanner *umbp.LayoutPlanner
		if dstPlanner, err = umbp.NewLayoutPlanner(layout(dst)); err == nil {
			return benchWith(ctx, e, c, rt, grpcRT, bc, src, dst, srcPlanner, dstPlanner)
		}
	}
	src.Close()
	dst.Close()
	return nil, err
}

func benchWith(ctx context.Context, e env, c *common, rt, grpcRT *umbp.StandaloneRuntime, bc benchConfig, src, dst *umbp.HostBuffer, srcPlanner, dstPlanner *umbp.LayoutPlanner) (res *benchResult, err error) {
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	ns := "umbp-bench-" + hex.EncodeToString(tag[:])
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		src.Close()
		dst.Close()
		return nil, err
	}
	defer func() {
		// Buffers a closed handle could not give back stay mapped: the
		// server may still use them.
		if cerr := w.Close(); cerr != nil {
			err = errors.Join(err, cerr)
			return
		}
		err = errors.Join(err, src.Close(), dst.Close())
	}()
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"src": src.Buffer(), "dst": dst.Buffer()}); err != nil {
		return nil, err
	}
	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		return nil, err
	}
	defer sched.Close()
	grpcSched, err := grpcRT.NewSchedulerHandle(ctx)
	if err != nil {
		return nil, err
	}
	defer grpcSched.Close()
	codec, err := umbp.NewKeyCodec(ns, umbp.RankTopology{})
	if err != nil {
		return nil, err
	}
	caps := w.Stats().Capabilities
	res = &benchResult{
		Endpoint: rt.Endpoint(), Mode: caps.Mode, RangedIO: caps.RangedIO, Namespace: ns,
		Objects: bc.objects, ObjectSize: bc.objectSize, Ranges: bc.ranges, Batch: bc.batch,
		Workers: bc.workers, Rounds: bc.rounds, Verified: bc.verify,
		StoreGBps: []float64{}, LoadGBps: []float64{}, LookupSeconds: []float64{}, LookupGRPCSeconds: []float64{}, LookupHits: []int{},
	}
	roundBytes := uint64(bc.objects) * bc.objectSize
	bar := newBar(e.stderr, bc.progress, int64(roundBytes)*2*int64(bc.rounds))
	defer func() {
		if bar != nil {
			_ = bar.Finish()
		}
	}()

	keys := make([]string, bc.objects)
	stores := make([]umbp.BlockTransferPlan, bc.objects)
	loads := make([]umbp.BlockTransferPlan, bc.objects)
	for r := range bc.rounds {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("interrupted: %w", err)
		}
		// Every round stores new keys: the server keeps the first value
		// of a key, so storing an existing one would measure nothing.
		for i := range keys {
			var h [8]byte
			binary.BigEndian.PutUint64(h[:], uint64(r)<<32|uint64(i))
			keys[i] = codec.Key(0, h[:])
			if stores[i], err = srcPlanner.PlanForBlock(keys[i], 0, i); err != nil {
				return res, err
			}
			if loads[i], err = dstPlanner.PlanForBlock(keys[i], 0, i); err != nil {
				return res, err
			}
		}
		fill(src.Bytes(), r)
		describe(bar, fmt.Sprintf("round %d/%d store", r+1, bc.rounds))
		took, err := transfer(ctx, w, stores, bc.batch, w.Store, bar, bc.objectSize)
		if err != nil {
			return res, fmt.Errorf("round %d: store: %w", r+1, err)
		}
		res.StoreGBps = append(res.StoreGBps, float64(roundBytes)/took.Seconds()/1e9)

		held := 0
		for j := range 2 {
			h, into, path := sched, &res.LookupSeconds, "lookup"
			if (r+j)%2 == 1 {
				h, into, path = grpcSched, &res.LookupGRPCSeconds, "lookup through grpc-go"
			}
			before := h.Stats()
			start := time.Now()
			hits := h.Lookup(ctx, keys)
			took := time.Since(start)
			if err := answered(ctx, c, h, before); err != nil {
				return res, fmt.Errorf("round %d: %s: %w", r+1, path, err)
			}
			*into = append(*into, took.Seconds())
			if h == sched {
				for _, hit := range hits {
					if hit {
						held++
					}
				}
			}
		}
		res.LookupHits = append(res.LookupHits, held)
		if held < bc.objects {
			// Every object was stored: the pool evicted some to make room
			// for the others. Ping does not say the pool's capacity.
			return res, fmt.Errorf("round %d: the pool holds %d of the %d objects just stored: the working set (%s) exceeds what the pool keeps, so it evicted the rest; lower -objects or -object-size",
				r+1, held, bc.objects, humanBytes(roundBytes))
		}

		describe(bar, fmt.Sprintf("round %d/%d load", r+1, bc.rounds))
		took, err = transfer(ctx, w, loads, bc.batch, w.Load, bar, bc.objectSize)
		if err != nil {
			return res, fmt.Errorf("round %d: load: %w", r+1, err)
		}
		res.LoadGBps = append(res.LoadGBps, float64(roundBytes)/took.Seconds()/1e9)
		if bc.verify && !bytes.Equal(src.Bytes(), dst.Bytes()) {
			return res, fmt.Errorf("round %d: the loaded bytes differ from those stored", r+1)
		}
	}
	return res, nil
}

// transfer submits the plans in jobs of batch plans, waits for every job and
// returns the time from the first submission to the end of the last job.
func transfer(ctx context.Context, w *umbp.WorkerHandle, plans []umbp.BlockTransferPlan, batch int,
	submit func([]umbp.BlockTransferPlan, ...umbp.TransferOption) *umbp.TransferJob, bar *progressbar.ProgressBar, objectSize uint64) (time.Duration, error) {
	start := time.Now()
	var jobs []*umbp.TransferJob
	for i := 0; i < len(plans); i += batch {
		jobs = append(jobs, submit(plans[i:min(i+batch, len(plans))]))
	}
	// A job's buffers are in use until it ends: wait for each even when
	// ctx ends (Wait gives up at the job's own deadline).
	wctx := context.WithoutCancel(ctx)
	var errs []error
	var refused, notInPool, other int
	var firstOther error
	for _, j := range jobs {
		err := w.Wait(wctx, j)
		if err == nil {
			if bar != nil {
				_ = bar.Add64(int64(uint64(len(j.Keys())) * objectSize))
			}
			continue
		}
		if errors.Is(err, umbp.ErrBuffersInUse) {
			errs = append(errs, err)
			continue
		}
		// Said once for all the keys, by what happened to them.
		for i := range j.Keys() {
			switch kerr := j.KeyErr(i); {
			case kerr == nil:
			case errors.Is(kerr, umbp.ErrRefused):
				refused++
			case errors.Is(kerr, umbp.ErrNotInPool):
				notInPool++
			default:
				other++
				if firstOther == nil {
					firstOther = kerr
				}
			}
		}
	}
	if refused > 0 {
		errs = append(errs, fmt.Errorf("the pool refused %d of %d objects of %s: each is larger than the pool, or the pool is full of objects it cannot evict (Ping does not say its capacity); lower -object-size",
			refused, len(plans), formatBytes(objectSize)))
	}
	if notInPool > 0 {
		errs = append(errs, fmt.Errorf("%d of %d objects were not in the pool: evicted since they were stored (a working set larger than the pool?)", notInPool, len(plans)))
	}
	if other > 0 {
		errs = append(errs, fmt.Errorf("%d of %d objects failed, the first: %s", other, len(plans), said(firstOther.Error())))
	}
	return time.Since(start), errors.Join(errs...)
}

// hostMemory returns this host's memory and swap in bytes, 0 if unknown.
func hostMemory() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return (uint64(si.Totalram) + uint64(si.Totalswap)) * uint64(si.Unit)
}

// humanBytes writes n in binary units, to a tenth.
func humanBytes(n uint64) string {
	for _, u := range []struct {
		name string
		size uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size {
			return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/float64(u.size)), ".0") + " " + u.name
		}
	}
	return fmt.Sprintf("%d B", n)
}

// fill writes round r's pattern: every 8 bytes differ within a round and
// from every other round's.
func fill(b []byte, r int) {
	x := uint64(r+1) * 0x9e3779b97f4a7c15
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		b[i] = byte(r + i)
	}
}

// newBar returns a progress bar of max bytes on w, or nil when mode (or a w
// that is not a terminal, for auto) says none.
func newBar(w io.Writer, mode string, max int64) *progressbar.ProgressBar {
	if mode == "off" {
		return nil
	}
	if mode == "auto" {
		f, ok := w.(*os.File)
		if !ok || !term.IsTerminal(int(f.Fd())) {
			return nil
		}
	}
	return progressbar.NewOptions64(max,
		progressbar.OptionSetWriter(w),
		progressbar.OptionShowBytes(true),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
}

func describe(bar *progressbar.ProgressBar, s string) {
	if bar != nil {
		bar.Describe(s)
	}
}

func printBench(w io.Writer, r *benchResult) {
	p := func(k, format string, a ...any) { fmt.Fprintf(w, "%-9s %s\n", k, fmt.Sprintf(format, a...)) }
	ranged := "contiguous batches"
	if r.RangedIO {
		ranged = "ranged I/O"
	}
	p("server", "%s (%s, %s)", r.Endpoint, r.Mode, ranged)
	p("objects", "%d of %s, %d range(s) each, jobs of %d, %d transfer goroutines, %d round(s)",
		r.Objects, formatBytes(r.ObjectSize), r.Ranges, r.Batch, r.Workers, r.Rounds)
	if len(r.StoreGBps) > 0 {
		p("store", "%s", spread(r.StoreGBps, "GB/s", func(v float64) string { return fmt.Sprintf("%.2f", v) }))
		if first, later, ok := firstTouch(r.StoreGBps); ok {
			p("  note", "round 1 stored at %.2f GB/s, the later rounds at %.2f (median): round 1 paid for the server's first touch of its pool's pages (a server whose pool is not mapped at start, as the Go server's with -prefault=false); a long-running server's pool has paid it once", first, later)
		}
	}
	if len(r.LookupSeconds) > 0 {
		held, asked := 0, 0
		for _, h := range r.LookupHits {
			held += h
			asked += r.Objects
		}
		p("lookup", "%s, %d of %d keys held", spread(r.LookupSeconds, "", func(v float64) string { return dur(v).String() }), held, asked)
	}
	if len(r.LookupGRPCSeconds) > 0 {
		p("  grpc-go", "%s, the same keys through grpc-go's call path (Config.GRPCLookups)", spread(r.LookupGRPCSeconds, "", func(v float64) string { return dur(v).String() }))
	}
	if len(r.LoadGBps) > 0 {
		p("load", "%s", spread(r.LoadGBps, "GB/s", func(v float64) string { return fmt.Sprintf("%.2f", v) }))
	}
	if r.Verified && len(r.LoadGBps) == r.Rounds {
		p("verified", "every loaded byte matched what was stored")
	}
	p("note", "the stored objects stay in the pool (namespace %s) until evicted", r.Namespace)
}

// firstTouch reports whether the first round's store ran at under half the
// median of the later ones' (first and later are those two): what a pool's
// first touch of its pages costs, not a steady rate.
func firstTouch(storeGBps []float64) (first, later float64, ok bool) {
	if len(storeGBps) < 2 {
		return 0, 0, false
	}
	first, later = storeGBps[0], median(storeGBps[1:])
	return first, later, first < later/2
}

// spread formats the median, min and max of vs.
func spread(vs []float64, unit string, f func(float64) string) string {
	med := median(vs)
	s := slices.Sorted(slices.Values(vs))
	if unit != "" {
		unit = " " + unit
	}
	if len(s) == 1 {
		return f(med) + unit
	}
	return fmt.Sprintf("%s%s median (min %s, max %s, %d rounds)", f(med), unit, f(s[0]), f(s[len(s)-1]), len(s))
}

// formatBytes writes n in the largest binary unit that divides it, else in
// bytes.
func formatBytes(n uint64) string {
	for _, u := range []struct {
		name string
		size uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// Command offload shows the library's main job, and its promise, against a
// real server process: two engines share KV blocks through one UMBP
// standalone server, and a stopped, resumed, killed or restarted server
// costs them cache misses, never a hung step or a wrong byte.
//
// Engine A stores N blocks of a realistic layout (many layers, each block
// one range per layer), the scheduler looks them up, and engine B loads
// them into its own memory and verifies every byte. Then the server process
// is stopped with SIGSTOP: lookups answer misses within LookupTimeout, a
// store outlives its deadline and stays blocked, later transfers are
// refused at once. SIGCONT: the blocked store completes, lookups hit. Last
// the server is killed with SIGKILL and started again at the same path:
// the same handles notice, reattach, register their memory again, and a
// new store and load are byte-exact.
//
// With no flags it starts the project's server, umbp-standalone-server,
// as a child process (from -server, or beside this program, or on PATH;
// `make demo` builds both). With -endpoint and -pid it does the same to a
// server someone else started, MORI's included: it stops, continues and
// kills that process, and starts it again with the command line, working
// directory and environment it had.
//
//	make demo
//	go run ./examples/offload -server bin/umbp-standalone-server
//	go run ./examples/offload -endpoint unix:///run/umbp/standalone/node0.grpc.sock -pid 4242
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
)

func main() {
	var (
		endpoint   = flag.String("endpoint", "", "a running server's socket (unix:///abs/path), with -pid; empty starts one")
		pid        = flag.Int("pid", 0, "the process id of the server at -endpoint: the demo stops, continues, kills and restarts it")
		server     = flag.String("server", "", "the umbp-standalone-server binary to start (default: beside this program, else on PATH)")
		blocks     = flag.Int("blocks", 256, "blocks to store and load")
		layers     = flag.Int("layers", 32, "layers: each block is one range per layer")
		blockBytes = flag.Int("block-bytes", 16<<10, "bytes of one block in one layer")
		lookupTO   = flag.Duration("lookup-timeout", 200*time.Millisecond, "scheduler call deadline")
		timeout    = flag.Duration("timeout", time.Second, "transfer deadline")
		verbose    = flag.Bool("v", false, "log the library's warnings")
	)
	flag.Parse()
	level := slog.LevelError
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	d := demo{
		blocks: *blocks, layers: *layers, blockBytes: *blockBytes,
		lookupTO: *lookupTO, timeout: *timeout, log: log, out: os.Stdout,
	}
	var err error
	switch {
	case *endpoint != "" && *pid > 0:
		d.srv, err = attachProcess(*endpoint, *pid)
	case *endpoint != "" || *pid > 0:
		err = errors.New("-endpoint and -pid go together: the demo signals the server's process")
	default:
		d.srv, err = startProcess(*server, *blocks**layers**blockBytes)
	}
	if err == nil {
		// Interrupted, the demo leaves the server running, not stopped.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
		go func() {
			<-sigs
			d.srv.close()
			os.Exit(130)
		}()
		err = d.run(context.Background())
	}
	if d.srv != nil {
		d.srv.close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "offload:", err)
		os.Exit(1)
	}
}

// demo is one run of the demonstration.
type demo struct {
	blocks, layers, blockBytes int
	lookupTO, timeout          time.Duration
	log                        *slog.Logger
	out                        io.Writer
	srv                        *process

	a, b  *engine
	sched *umbp.SchedulerHandle
	keys  []string
	store []umbp.Block // A's blocks, each under its key
	load  []umbp.Block // the same keys into B's blocks, in reverse order
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, format+"\n", args...) }

func (d *demo) run(ctx context.Context) error {
	d.say("%s", d.srv.describe())
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{
		Endpoint:       d.srv.endpoint,
		Timeout:        d.timeout,
		LookupTimeout:  d.lookupTO,
		StartupTimeout: 20 * time.Second,
		Logger:         d.log,
	})
	if err != nil {
		return err
	}
	if d.a, err = newEngine(ctx, rt, "A", d.blocks, d.layers, d.blockBytes); err != nil {
		return err
	}
	defer d.a.close()
	if d.b, err = newEngine(ctx, rt, "B", d.blocks, d.layers, d.blockBytes); err != nil {
		return err
	}
	defer d.b.close()
	if d.sched, err = rt.NewSchedulerHandle(ctx); err != nil {
		return err
	}
	defer d.sched.Close()
	if err := d.share(ctx); err != nil {
		return err
	}
	if err := d.stopAndContinue(ctx); err != nil {
		return err
	}
	return d.killAndRestart(ctx)
}

// share stores A's blocks, looks them up and loads them into B.
func (d *demo) share(ctx context.Context) error {
	codec, err := umbp.NewKeyCodec("offload-demo", umbp.RankTopology{})
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i, ab := 0, d.a.buf.Bytes(); i < len(ab); i++ {
		ab[i] = byte(rng.Uint32())
	}
	clear(d.b.buf.Bytes()) // an engine's KV memory is in use, its pages present
	d.keys = make([]string, d.blocks)
	d.store = make([]umbp.Block, d.blocks)
	d.load = make([]umbp.Block, d.blocks)
	for i := range d.keys {
		var id [8]byte
		binary.LittleEndian.PutUint64(id[:], uint64(i))
		h := sha256.Sum256(id[:])
		d.keys[i] = codec.Key(0, h[:16])
		d.store[i] = umbp.Block{Key: d.keys[i], BlockID: i}
		d.load[i] = umbp.Block{Key: d.keys[i], BlockID: d.blocks - 1 - i}
	}
	objectBytes := float64(d.blocks * d.layers * d.blockBytes)
	start := time.Now()
	if err := d.a.w.Wait(ctx, d.a.w.StoreBlocks(d.store)); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	storeTime := time.Since(start)
	d.say("\nengine A stored %d blocks of %d layers: each block one object of %d ranges (one a layer), %d ranges in all, %s",
		d.blocks, d.layers, d.layers, d.blocks*d.layers, size(objectBytes))

	// The scheduler asks the server which blocks exist. The first lookup
	// of a process dials its connections: it is counted apart.
	first := time.Now()
	hits := count(d.sched.Lookup(ctx, d.keys))
	firstTime := time.Since(first)
	var lat []time.Duration
	for range 20 {
		t0 := time.Now()
		hits = count(d.sched.Lookup(ctx, d.keys))
		lat = append(lat, time.Since(t0))
	}
	if hits != d.blocks {
		return fmt.Errorf("lookup found %d of %d blocks", hits, d.blocks)
	}
	d.say("the scheduler looked them up: %d of %d hit", hits, d.blocks)

	start = time.Now()
	if err := d.b.w.Wait(ctx, d.b.w.LoadBlocks(d.load)); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	loadTime := time.Since(start)
	if err := d.verify(); err != nil {
		return err
	}
	d.say("engine B loaded them into its own memory, in reverse block order: every byte matches engine A's\n")
	tw := tabwriter.NewWriter(d.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\tblocks\tranges\tbytes\ttime\tGB/s\t")
	fmt.Fprintf(tw, "store (A)\t%d\t%d\t%s\t%v\t%.2f\t\n", d.blocks, d.blocks*d.layers, size(objectBytes), storeTime.Round(time.Microsecond), objectBytes/storeTime.Seconds()/1e9)
	fmt.Fprintf(tw, "load (B)\t%d\t%d\t%s\t%v\t%.2f\t\n", d.blocks, d.blocks*d.layers, size(objectBytes), loadTime.Round(time.Microsecond), objectBytes/loadTime.Seconds()/1e9)
	fmt.Fprintf(tw, "first lookup (dials)\t%d\t\t\t%v\t\t\n", d.blocks, firstTime.Round(time.Microsecond))
	fmt.Fprintf(tw, "lookup (median of 20)\t%d\t\t\t%v\t\t\n", d.blocks, median(lat).Round(time.Microsecond))
	return tw.Flush()
}

// stopAndContinue stops the server process and continues it.
func (d *demo) stopAndContinue(ctx context.Context) error {
	pid, _ := d.srv.current()
	d.say("\nSIGSTOP to the server (process %d): it is alive, its sockets open, and it answers nothing", pid)
	if err := d.srv.stop(); err != nil {
		return err
	}
	t0 := time.Now()
	hits := count(d.sched.Lookup(ctx, d.keys))
	d.say("  a lookup of %d keys answered %d hits after %v: at its LookupTimeout (%v) it is all misses, never a hang",
		d.blocks, hits, time.Since(t0).Round(time.Millisecond), d.lookupTO)
	t0 = time.Now()
	hits = count(d.sched.Lookup(ctx, d.keys))
	d.say("  the next lookup answered %d hits in %v without asking: lookups miss at once until the server answers the probe the first one left",
		hits, time.Since(t0).Round(time.Microsecond))
	stuck := d.a.w.StoreBlocks(d.store[:1])
	err := d.a.w.Wait(ctx, stuck)
	d.say("  a store of one block outlived its %v deadline: Wait says ErrBuffersInUse (%v), and the job stays %s: its memory is the server's until it answers",
		d.timeout, errors.Is(err, umbp.ErrBuffersInUse), stuck.Status())
	t0 = time.Now()
	refused := d.a.w.LoadBlocks(d.load)
	err = d.a.w.Wait(ctx, refused)
	d.say("  engine A's next transfer failed in %v, every key not attempted (ErrNotAttempted: %v), while that store is blocked:\n    %v",
		time.Since(t0).Round(time.Microsecond), errors.Is(err, umbp.ErrNotAttempted), refused.KeyErr(0))

	d.say("SIGCONT to the server:")
	if err := d.srv.cont(); err != nil {
		return err
	}
	resumed := time.Now()
	select {
	case <-stuck.Done():
	case <-time.After(30 * time.Second):
		return errors.New("the blocked store did not end once the server resumed")
	}
	d.say("  the blocked store ended %s, %v after the server resumed", stuck.Status(), time.Since(resumed).Round(10*time.Microsecond))
	if err := d.untilHits(ctx, d.blocks); err != nil {
		return err
	}
	clear(d.b.buf.Bytes())
	if err := d.b.w.Wait(ctx, d.b.w.LoadBlocks(d.load)); err != nil {
		return fmt.Errorf("load after SIGCONT: %w", err)
	}
	if err := d.verify(); err != nil {
		return err
	}
	d.say("  lookups hit again (%d of %d) and engine B's next load is byte-exact", d.blocks, d.blocks)
	return nil
}

// killAndRestart kills the server process and starts it again at the same
// path: the same handles notice, wait, register their memory again and
// resume.
func (d *demo) killAndRestart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	handles := []interface {
		State() umbp.HandleState
		WaitForStateChange(context.Context, umbp.HandleState) bool
	}{d.a.w, d.b.w, d.sched}
	states := func() string {
		return fmt.Sprintf("engine A %s, engine B %s, scheduler %s", d.a.w.State(), d.b.w.State(), d.sched.State())
	}

	pid, _ := d.srv.current()
	d.say("\nSIGKILL to the server (process %d): it is gone, its pool with it", pid)
	if err := d.srv.kill(); err != nil {
		return err
	}
	for _, h := range handles {
		if h.State() == umbp.StateConnected && !h.WaitForStateChange(ctx, umbp.StateConnected) {
			return errors.New("the handles did not notice the server's death")
		}
	}
	d.say("  the handles noticed (WaitForStateChange): %s", states())
	t0 := time.Now()
	hits := count(d.sched.Lookup(ctx, d.keys))
	d.say("  a lookup answered %d hits in %v, without asking", hits, time.Since(t0).Round(time.Microsecond))
	t0 = time.Now()
	refused := d.a.w.StoreBlocks(d.store)
	err := d.a.w.Wait(ctx, refused)
	d.say("  a store failed in %v, not attempted (ErrNotAttempted: %v)", time.Since(t0).Round(time.Microsecond), errors.Is(err, umbp.ErrNotAttempted))

	if err := d.srv.restart(); err != nil {
		return err
	}
	pid, _ = d.srv.current()
	d.say("the server starts again at the same path (process %d), with an empty pool:", pid)
	for _, h := range handles {
		for h.State() != umbp.StateConnected {
			if !h.WaitForStateChange(ctx, h.State()) {
				return errors.New("the handles did not reattach")
			}
		}
	}
	d.say("  WaitForStateChange: %s; their memory is registered again (Stats().Reconnects = %d)", states(), d.a.w.Stats().Reconnects)
	d.say("  a lookup: %d of %d blocks (the new pool is empty: misses, never stale bytes)", count(d.sched.Lookup(ctx, d.keys)), d.blocks)
	clear(d.b.buf.Bytes())
	if err := d.a.w.Wait(ctx, d.a.w.StoreBlocks(d.store)); err != nil {
		return fmt.Errorf("store after the restart: %w", err)
	}
	if err := d.b.w.Wait(ctx, d.b.w.LoadBlocks(d.load)); err != nil {
		return fmt.Errorf("load after the restart: %w", err)
	}
	if err := d.verify(); err != nil {
		return err
	}
	d.say("  the same handles stored %d blocks again and engine B's load is byte-exact", d.blocks)
	return nil
}

// untilHits waits, at most 30 s, until a lookup hits n keys.
func (d *demo) untilHits(ctx context.Context, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for count(d.sched.Lookup(ctx, d.keys)) != n {
		if time.Now().After(deadline) {
			return errors.New("lookups did not recover")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// engine is one worker with its KV memory: layers regions of blocks blocks.
type engine struct {
	w   *umbp.WorkerHandle
	buf *umbp.HostBuffer
}

func newEngine(ctx context.Context, rt *umbp.StandaloneRuntime, name string, blocks, layers, blockBytes int) (*engine, error) {
	buf, err := umbp.NewHostBuffer(blocks * layers * blockBytes)
	if err != nil {
		return nil, err
	}
	// An engine's KV cache is memory it has used: touch every page now, so
	// that the first transfer below is not charged for faulting it in.
	clear(buf.Bytes())
	base := buf.Buffer().Ptr
	layout := &umbp.KVLayoutDescriptor{}
	for l := range layers {
		layout.Regions = append(layout.Regions, umbp.KVRegion{
			LayerName:   fmt.Sprintf("model.layers.%d.kv", l),
			BaseAddress: base + uintptr(l*blocks*blockBytes),
			NumBlocks:   blocks,
			BlockBytes:  uint64(blockBytes),
			Stride:      uint64(blockBytes),
		})
	}
	w, err := rt.NewWorkerHandle(ctx, layout)
	if err != nil {
		_ = buf.Close()
		return nil, fmt.Errorf("engine %s: %w", name, err)
	}
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv-cache": buf.Buffer()}); err != nil {
		_ = w.Close()
		_ = buf.Close()
		return nil, fmt.Errorf("engine %s: %w", name, err)
	}
	return &engine{w: w, buf: buf}, nil
}

func (e *engine) close() {
	if err := e.w.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		return
	}
	_ = e.buf.Close()
}

// verify checks that B's block blocks-1-i holds A's block i in every layer.
func (d *demo) verify() error {
	am, bm, n := d.a.buf.Bytes(), d.b.buf.Bytes(), d.blockBytes
	for l := range d.layers {
		for i := range d.blocks {
			ao := (l*d.blocks + i) * n
			bo := (l*d.blocks + d.blocks - 1 - i) * n
			if !bytes.Equal(am[ao:ao+n], bm[bo:bo+n]) {
				return fmt.Errorf("layer %d block %d: engine B's bytes differ from engine A's", l, i)
			}
		}
	}
	return nil
}

func count(v []bool) int {
	n := 0
	for _, b := range v {
		if b {
			n++
		}
	}
	return n
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func size(n float64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", n/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	}
	return fmt.Sprintf("%.0f KiB", n/(1<<10))
}

// Command offload shows the library's main job: two engines share KV blocks
// through one UMBP standalone server, and a stalled server costs them cache
// misses, never a hung step.
//
// With no flags it starts the Go server in-process (in a temporary
// directory). Engine A stores N blocks of a realistic layout — many layers,
// each block one range per layer — the scheduler looks them up, and engine B
// loads them into its own memory and verifies every byte. Then the server is
// stalled: lookups answer misses within LookupTimeout, a store outlives its
// deadline and blocks, later transfers are refused as not attempted; after
// the server resumes, everything recovers. Last the server is killed and a
// new one started at the same path: the same handles watch their state go
// to reconnecting and back (WaitForStateChange), register their memory
// again, and a new store and load are byte-exact.
//
//	go run ./examples/offload
//	go run ./examples/offload -endpoint unix:///run/umbp/standalone/node0.grpc.sock
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func main() {
	var (
		endpoint   = flag.String("endpoint", "", "server socket (unix:///abs/path); empty starts the Go server in-process")
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
	if err := run(*endpoint, *blocks, *layers, *blockBytes, *lookupTO, *timeout, log); err != nil {
		fmt.Fprintln(os.Stderr, "offload:", err)
		os.Exit(1)
	}
}

func run(endpoint string, blocks, layers, blockBytes int, lookupTO, timeout time.Duration, log *slog.Logger) error {
	var srv *umbptest.Server
	if endpoint == "" {
		var err error
		srv, err = umbptest.Start(umbptest.Options{
			Capacity: uint64(2*blocks*layers*blockBytes) + 64<<20,
			Prefault: true, // as a running server's pool: no first-touch faults in the figures
			Logger:   log,
		})
		if err != nil {
			return err
		}
		defer srv.Close()
		endpoint = srv.Endpoint()
		fmt.Printf("started the Go server in-process at %s\n", endpoint)
	}

	rt, err := umbp.NewStandaloneRuntime(umbp.Config{
		Endpoint:       endpoint,
		Timeout:        timeout,
		LookupTimeout:  lookupTO,
		StartupTimeout: 10 * time.Second,
		Logger:         log,
	})
	if err != nil {
		return err
	}
	ctx := context.Background()
	topo := umbp.RankTopology{}
	codec, err := umbp.NewKeyCodec("offload-demo", topo)
	if err != nil {
		return err
	}
	a, err := newEngine(ctx, rt, "A", blocks, layers, blockBytes)
	if err != nil {
		return err
	}
	defer a.close()
	b, err := newEngine(ctx, rt, "B", blocks, layers, blockBytes)
	if err != nil {
		return err
	}
	defer b.close()
	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		return err
	}
	defer sched.Close()

	// Engine A fills its blocks and stores them under content keys.
	rng := rand.New(rand.NewPCG(1, 2))
	for i, ab := 0, a.buf.Bytes(); i < len(ab); i++ {
		ab[i] = byte(rng.Uint32())
	}
	clear(b.buf.Bytes()) // an engine's KV memory is in use, its pages present
	keys := make([]string, blocks)
	for i := range keys {
		var id [8]byte
		binary.LittleEndian.PutUint64(id[:], uint64(i))
		h := sha256.Sum256(id[:])
		keys[i] = codec.Key(0, h[:16])
	}
	objectBytes := float64(blocks * layers * blockBytes)
	plans := make([]umbp.Block, blocks)
	for i := range plans {
		plans[i] = umbp.Block{Key: keys[i], BlockID: i}
	}
	start := time.Now()
	job := a.w.StoreBlocks(plans)
	if err := a.w.Wait(ctx, job); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	storeTime := time.Since(start)

	// The scheduler asks the server which blocks exist.
	var lat []time.Duration
	var hits int
	for range 20 {
		t0 := time.Now()
		got := sched.Lookup(ctx, keys)
		lat = append(lat, time.Since(t0))
		hits = count(got)
	}
	if hits != blocks {
		return fmt.Errorf("lookup found %d of %d blocks", hits, blocks)
	}

	// Engine B loads them into its own memory, in reverse block order.
	batch := make([]umbp.Block, blocks)
	for i := range batch {
		batch[i] = umbp.Block{Key: keys[i], BlockID: blocks - 1 - i}
	}
	start = time.Now()
	lj := b.w.LoadBlocks(batch)
	if err := b.w.Wait(ctx, lj); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	loadTime := time.Since(start)
	if err := verify(a, b, blocks, layers, blockBytes); err != nil {
		return err
	}
	fmt.Printf("engine B loaded %d blocks and every byte matches engine A's\n\n", blocks)

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\tblocks\tranges\tbytes\ttime\tGB/s\t")
	fmt.Fprintf(tw, "store (A)\t%d\t%d\t%s\t%v\t%.2f\t\n", blocks, blocks*layers, size(objectBytes), storeTime.Round(time.Microsecond), objectBytes/storeTime.Seconds()/1e9)
	fmt.Fprintf(tw, "load (B)\t%d\t%d\t%s\t%v\t%.2f\t\n", blocks, blocks*layers, size(objectBytes), loadTime.Round(time.Microsecond), objectBytes/loadTime.Seconds()/1e9)
	fmt.Fprintf(tw, "lookup (median of 20)\t%d\t\t\t%v\t\t\n", blocks, median(lat).Round(time.Microsecond))
	tw.Flush()

	if srv == nil {
		fmt.Println("\n(an external server: skipping the stall demonstration)")
		return nil
	}

	// The server stalls.
	fmt.Println("\nthe server stalls:")
	srv.Stall()
	t0 := time.Now()
	got := sched.Lookup(ctx, keys)
	fmt.Printf("  lookup answered %d hits of %d in %v (LookupTimeout %v)\n", count(got), blocks, time.Since(t0).Round(time.Millisecond), lookupTO)
	t0 = time.Now()
	got = sched.Lookup(ctx, keys)
	fmt.Printf("  the next lookup answered %d hits in %v, without asking the server\n", count(got), time.Since(t0).Round(time.Microsecond))
	stuck := a.w.StoreBlocks(plans[:1])
	err = a.w.Wait(ctx, stuck)
	fmt.Printf("  a store outlived its %v deadline: Wait says %q; the job is still %s\n", timeout, errText(err), stuck.Status())
	refused := a.w.LoadBlocks(batch)
	err = a.w.Wait(ctx, refused)
	fmt.Printf("  engine A's next transfer fails at once, not attempted (%v): %s\n", errors.Is(err, umbp.ErrNotAttempted), refused.KeyErr(0))

	fmt.Println("the server resumes:")
	srv.Resume()
	select {
	case <-stuck.Done():
	case <-time.After(10 * time.Second):
		return errors.New("the blocked store did not end once the server resumed")
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Printf("  the blocked store ended %s\n", stuck.Status())
	deadline := time.Now().Add(10 * time.Second)
	for count(sched.Lookup(ctx, keys)) != blocks {
		if time.Now().After(deadline) {
			return errors.New("lookups did not recover")
		}
		time.Sleep(10 * time.Millisecond)
	}
	lj2 := b.w.LoadBlocks(batch)
	if err := b.w.Wait(ctx, lj2); err != nil {
		return fmt.Errorf("load after resume: %w", err)
	}
	if err := verify(a, b, blocks, layers, blockBytes); err != nil {
		return err
	}
	fmt.Printf("  lookups hit again and a new load of %d blocks is byte-exact\n", blocks)

	return restartAct(ctx, srv, a, b, sched, plans, batch, blocks, layers, blockBytes)
}

// restartAct kills the server and starts a new one at the same path: the
// same handles notice, wait, re-register their memory and resume.
func restartAct(ctx context.Context, srv *umbptest.Server, a, b *engine, sched *umbp.SchedulerHandle,
	plans, batch []umbp.Block, blocks, layers, blockBytes int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	handles := []interface {
		State() umbp.HandleState
		WaitForStateChange(context.Context, umbp.HandleState) bool
	}{a.w, b.w, sched}
	states := func() string {
		return fmt.Sprintf("engine A %s, engine B %s, scheduler %s", a.w.State(), b.w.State(), sched.State())
	}

	fmt.Println("\nthe server goes away, as if killed, and a new one starts at the same path with an empty pool:")
	srv.Stall("Ping") // the new server holds its first answers until it is "ready"
	if err := srv.Restart(); err != nil {
		return err
	}
	for _, h := range handles {
		if !h.WaitForStateChange(ctx, umbp.StateConnected) {
			return errors.New("the handles did not notice the restart")
		}
	}
	fmt.Printf("  WaitForStateChange: %s\n", states())
	t0 := time.Now()
	got := sched.Lookup(ctx, plansKeys(plans))
	fmt.Printf("  lookup answered %d hits in %v, without asking the server\n", count(got), time.Since(t0).Round(time.Microsecond))
	refused := a.w.StoreBlocks(plans)
	err := a.w.Wait(ctx, refused)
	fmt.Printf("  a store fails at once, not attempted (%v): %v\n", errors.Is(err, umbp.ErrNotAttempted), refused.KeyErr(0))

	fmt.Println("the new server is ready:")
	srv.Resume("Ping")
	for _, h := range handles {
		if !h.WaitForStateChange(ctx, umbp.StateReconnecting) {
			return errors.New("the handles did not reattach")
		}
	}
	fmt.Printf("  WaitForStateChange: %s (memory registered again; Stats().Reconnects = %d)\n", states(), a.w.Stats().Reconnects)
	fmt.Printf("  lookup: %d of %d blocks (the new pool is empty: misses, never stale bytes)\n", count(sched.Lookup(ctx, plansKeys(plans))), blocks)
	clear(b.buf.Bytes())
	job := a.w.StoreBlocks(plans)
	if err := a.w.Wait(ctx, job); err != nil {
		return fmt.Errorf("store after restart: %w", err)
	}
	lj := b.w.LoadBlocks(batch)
	if err := b.w.Wait(ctx, lj); err != nil {
		return fmt.Errorf("load after restart: %w", err)
	}
	if err := verify(a, b, blocks, layers, blockBytes); err != nil {
		return err
	}
	fmt.Printf("  the same handles store %d blocks again and engine B's load is byte-exact\n", blocks)
	return nil
}

func plansKeys(plans []umbp.Block) []string {
	keys := make([]string, len(plans))
	for i, p := range plans {
		keys[i] = p.Key
	}
	return keys
}

// engine is one worker with its KV memory: layers regions of blocks blocks.
type engine struct {
	w      *umbp.WorkerHandle
	buf    *umbp.HostBuffer
	layout *umbp.KVLayoutDescriptor
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
	return &engine{w: w, buf: buf, layout: layout}, nil
}

func (e *engine) close() {
	if err := e.w.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		return
	}
	_ = e.buf.Close()
}

// verify checks that B's block blocks-1-i holds A's block i in every layer.
func verify(a, b *engine, blocks, layers, blockBytes int) error {
	am, bm := a.buf.Bytes(), b.buf.Bytes()
	for l := range layers {
		for i := range blocks {
			ao := (l*blocks + i) * blockBytes
			bo := (l*blocks + blocks - 1 - i) * blockBytes
			if !bytes.Equal(am[ao:ao+blockBytes], bm[bo:bo+blockBytes]) {
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

func errText(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

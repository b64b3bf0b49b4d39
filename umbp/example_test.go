package umbp_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// startExampleServer runs the Go server in-process (umbptest.Start); a real
// deployment runs umbp_standalone_server once per host instead.
func startExampleServer() (endpoint string, stop func()) {
	srv, err := umbptest.Start(umbptest.Options{Capacity: 64 << 20})
	if err != nil {
		panic(err)
	}
	return srv.Endpoint(), func() { srv.Close() }
}

// Two engines share KV blocks through one server: engine A stores a block
// of a two-layer layout, the scheduler finds it, engine B loads it.
func Example() {
	endpoint, stop := startExampleServer()
	defer stop()
	ctx := context.Background()
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: endpoint, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}

	// Each engine's KV memory: 2 layers of 4 blocks of 1 KiB, shareable
	// with the server.
	newEngine := func() (*umbp.WorkerHandle, *umbp.HostBuffer) {
		buf, err := umbp.NewHostBuffer(2 * 4 * 1024)
		if err != nil {
			panic(err)
		}
		base := buf.Buffer().Ptr
		layout := &umbp.KVLayoutDescriptor{Regions: []umbp.KVRegion{
			{LayerName: "layer.0", BaseAddress: base, NumBlocks: 4, BlockBytes: 1024, Stride: 1024},
			{LayerName: "layer.1", BaseAddress: base + 4*1024, NumBlocks: 4, BlockBytes: 1024, Stride: 1024},
		}}
		w, err := rt.NewWorkerHandle(ctx, layout)
		if err != nil {
			panic(err)
		}
		if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
			panic(err)
		}
		return w, buf
	}
	a, abuf := newEngine()
	b, bbuf := newEngine()

	codec, _ := umbp.NewKeyCodec("demo", umbp.RankTopology{})
	key := codec.Key(0, []byte{0xca, 0xfe})
	copy(abuf.Bytes()[2*1024:], "block 2, layer 0")
	copy(abuf.Bytes()[6*1024:], "block 2, layer 1")

	store := a.StoreBlocks([]umbp.Block{{Key: key, BlockID: 2}})
	fmt.Println("store:", a.Wait(ctx, store), store.Status())

	sched, _ := rt.NewSchedulerHandle(ctx)
	fmt.Println("lookup:", sched.Lookup(ctx, []string{key, codec.Key(0, []byte{1})}))

	load := b.LoadBlocks([]umbp.Block{{Key: key, BlockID: 0}})
	fmt.Println("load:", b.Wait(ctx, load), load.Status())
	fmt.Printf("%s | %s\n", bbuf.Bytes()[:16], bbuf.Bytes()[4*1024:4*1024+16])

	sched.Close()
	for _, e := range []struct {
		w   *umbp.WorkerHandle
		buf *umbp.HostBuffer
	}{{a, abuf}, {b, bbuf}} {
		if e.w.Close() == nil { // deregistered: the memory may be freed
			e.buf.Close()
		}
	}
	// Output:
	// store: <nil> COMPLETED
	// lookup: [true false]
	// load: <nil> COMPLETED
	// block 2, layer 0 | block 2, layer 1
}

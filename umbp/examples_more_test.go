package umbp_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// quiet discards the library's logs in the examples.
var quiet = slog.New(slog.DiscardHandler)

// A runtime is a validated configuration: it dials nothing, so it can be
// made before the server runs. Unset fields take their defaults (those of
// vLLM's UMBP runtime).
func ExampleNewStandaloneRuntime() {
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: "/run/umbp/standalone/node0.grpc.sock"})
	if err != nil {
		panic(err)
	}
	cfg := rt.Config()
	fmt.Println(rt.Endpoint())
	fmt.Println(cfg.NumWorkers, cfg.Timeout, cfg.LookupTimeout, cfg.StartupTimeout)

	_, err = umbp.NewStandaloneRuntime(umbp.Config{Endpoint: "tcp://10.0.0.1:50051"})
	fmt.Println(errors.Is(err, umbp.ErrInvalidConfig))
	// Output:
	// unix:///run/umbp/standalone/node0.grpc.sock
	// 4 30s 1s 30s
	// true
}

// A KeyCodec makes the keys vLLM's UMBP connector stores, one rank's worth;
// ParseKey reads them back.
func ExampleKeyCodec() {
	codec, err := umbp.NewKeyCodec("llama-8b", umbp.RankTopology{TPRank: 1, TPSize: 2})
	if err != nil {
		panic(err)
	}
	key := codec.Key(0, []byte{0xca, 0xfe, 0x01})
	fmt.Println(key)
	same, _ := codec.KeyHex(0, "CAFE01")
	fmt.Println(same == key)

	p, err := umbp.ParseKey(key)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s tp%d group %d hash %x\n", p.Namespace, p.TPRank, p.Group, p.Hash)
	_, err = umbp.ParseKey("umbp:vllm:v1:llama-8b:tp01:pcp0:dcp0:pp0:g0:cafe")
	fmt.Println(errors.Is(err, umbp.ErrInvalidKey))
	// Output:
	// umbp:vllm:v1:llama-8b:tp1:pcp0:dcp0:pp0:g0:cafe01
	// true
	// llama-8b tp1 group 0 hash cafe01
	// true
}

// A LayoutPlanner turns a block of a KV layout into the ranges of one stored
// object: block b of every region of the group, in layout order. Here two
// layers, K and V each, of 8 blocks of 256 bytes.
func ExampleLayoutPlanner() {
	const base = 0x7f0000000000 // where the KV tensors live in this process
	var regions []umbp.KVRegion
	for i, name := range []string{"layer0.k", "layer0.v", "layer1.k", "layer1.v"} {
		regions = append(regions, umbp.KVRegion{
			LayerName:   name,
			BaseAddress: base + uintptr(i)*8*256,
			NumBlocks:   8,
			BlockBytes:  256,
			Stride:      256,
		})
	}
	layout := &umbp.KVLayoutDescriptor{Regions: regions}
	planner, err := umbp.NewLayoutPlanner(layout)
	if err != nil {
		panic(err)
	}
	fmt.Println("object bytes:", layout.ObjectSize(0))
	plan, err := planner.PlanForBlock("key-of-block-3", 0, 3)
	if err != nil {
		panic(err)
	}
	for _, r := range plan.Ranges {
		fmt.Printf("%s: %d bytes at base+%#x -> object offset %d\n", r.LayerName, r.Length, r.BaseAddress-base, r.ObjectOffset)
	}
	_, err = planner.PlanForBlock("k", 0, 8)
	fmt.Println(errors.Is(err, umbp.ErrInvalidPlan))
	// Output:
	// object bytes: 1024
	// layer0.k: 256 bytes at base+0x300 -> object offset 0
	// layer0.v: 256 bytes at base+0xb00 -> object offset 256
	// layer1.k: 256 bytes at base+0x1300 -> object offset 512
	// layer1.v: 256 bytes at base+0x1b00 -> object offset 768
	// true
}

// A HostBuffer is host memory the server can map. While a worker handle has
// it registered it cannot be closed: the server may still write into it.
func ExampleHostBuffer() {
	srv, err := umbptest.Start(umbptest.Options{Capacity: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx := context.Background()
	rt, _ := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: srv.Endpoint(), Logger: quiet})

	buf, err := umbp.NewHostBuffer(10000)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(buf.Bytes()), buf.Buffer().Location)

	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		panic(err)
	}
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		panic(err)
	}
	fmt.Println("close while registered:", errors.Is(buf.Close(), umbp.ErrBuffersInUse))
	if err := w.Close(); err != nil { // deregisters the buffer
		panic(err)
	}
	fmt.Println("close after the handle:", buf.Close())
	// Output:
	// 10000 host
	// close while registered: true
	// close after the handle: <nil>
}

// One engine's worker registers its KV memory, stores blocks by block ID
// through its layout, and loads them back elsewhere. Wait returns nil iff
// the job COMPLETED; a key the pool does not hold fails with ErrNotInPool.
func ExampleWorkerHandle_StoreBlocks() {
	srv, err := umbptest.Start(umbptest.Options{Capacity: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx := context.Background()
	rt, _ := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: srv.Endpoint(), Logger: quiet})

	// One layer of 4 blocks of 4 KiB.
	buf, err := umbp.NewHostBuffer(4 * 4096)
	if err != nil {
		panic(err)
	}
	layout := &umbp.KVLayoutDescriptor{Regions: []umbp.KVRegion{{
		LayerName: "kv", BaseAddress: buf.Buffer().Ptr, NumBlocks: 4, BlockBytes: 4096, Stride: 4096,
	}}}
	w, err := rt.NewWorkerHandle(ctx, layout)
	if err != nil {
		panic(err)
	}
	defer func() {
		if w.Close() == nil {
			buf.Close()
		}
	}()
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		panic(err)
	}
	codec, _ := umbp.NewKeyCodec("demo", umbp.RankTopology{})
	k0, k1, absent := codec.Key(0, []byte{0}), codec.Key(0, []byte{1}), codec.Key(0, []byte{2})
	copy(buf.Bytes()[0:], "block zero")
	copy(buf.Bytes()[4096:], "block one")

	store := w.StoreBlocks([]umbp.Block{{Key: k0, BlockID: 0}, {Key: k1, BlockID: 1}})
	fmt.Println("store:", w.Wait(ctx, store))

	// Load them swapped into blocks 3 and 2, and one key nobody stored.
	load := w.LoadBlocks([]umbp.Block{{Key: k0, BlockID: 3}, {Key: k1, BlockID: 2}, {Key: absent, BlockID: 1}})
	err = w.Wait(ctx, load)
	fmt.Println("load:", load.Status(), errors.Is(err, umbp.ErrNotInPool))
	fmt.Println("completed:", len(load.CompletedKeys()), "failed blocks:", load.FailedBlockIDs())
	fmt.Printf("%s | %s\n", buf.Bytes()[3*4096:3*4096+10], buf.Bytes()[2*4096:2*4096+9])
	// Output:
	// store: <nil>
	// load: FAILED true
	// completed: 2 failed blocks: [1]
	// block zero | block one
}

// A scheduler asks which blocks the pool holds. Lookup answers per key;
// LookupPrefix counts the leading keys held, which is what prefix reuse
// needs. Any failure, or no reply within LookupTimeout, answers misses.
func ExampleSchedulerHandle_Lookup() {
	srv, err := umbptest.Start(umbptest.Options{Capacity: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx := context.Background()
	rt, _ := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: srv.Endpoint(), Logger: quiet})
	codec, _ := umbp.NewKeyCodec("demo", umbp.RankTopology{})
	keys := []string{codec.Key(0, []byte{1}), codec.Key(0, []byte{2}), codec.Key(0, []byte{3}), codec.Key(0, []byte{4})}

	// An engine stored blocks 1, 2 and 4 of a prompt.
	buf, _ := umbp.NewHostBuffer(4096)
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		panic(err)
	}
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		panic(err)
	}
	var plans []umbp.BlockTransferPlan
	for _, k := range []string{keys[0], keys[1], keys[3]} {
		plans = append(plans, umbp.BlockTransferPlan{Key: k, Ranges: []umbp.KVRange{{BaseAddress: buf.Buffer().Ptr, Length: 4096}}})
	}
	// Plans with their own ranges go to Store (StoreBlocks plans from the
	// handle's layout).
	if err := w.Wait(ctx, w.Store(plans)); err != nil {
		panic(err)
	}
	if w.Close() == nil {
		buf.Close()
	}

	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		panic(err)
	}
	defer sched.Close()
	fmt.Println(sched.Lookup(ctx, keys))
	fmt.Println(sched.LookupPrefix(ctx, keys))
	// Output:
	// [true true false true]
	// 2
}

// LookupAnswers tells a router, for its own call, "not in the pool" from
// "not answered": a miss among the first Answered keys is a block the pool
// does not hold; a key from Answered on was not asked or not answered
// (the caller's context ended, no reply within LookupTimeout, a batch too
// large to ask within it) and Err says why.
func ExampleSchedulerHandle_LookupAnswers() {
	srv, err := umbptest.Start(umbptest.Options{Capacity: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	rt, _ := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: srv.Endpoint(), Logger: quiet})
	sched, err := rt.NewSchedulerHandle(context.Background())
	if err != nil {
		panic(err)
	}
	defer sched.Close()
	keys := []string{"block-1", "block-2", ""} // an empty key cannot be in the pool

	res := sched.LookupAnswers(context.Background(), keys)
	fmt.Println(res.Hits, res.Answered, res.Complete())

	// The request's client went away: its context is the caller's, and
	// ends this call alone.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res = sched.LookupAnswers(ctx, keys)
	fmt.Println(res.Hits, res.Answered, errors.Is(res.Err, context.Canceled), errors.Is(res.Err, umbp.ErrNoReply))
	fmt.Println(sched.Stats().Lookups.Cancelled)
	// Output:
	// [false false false] 3 true
	// [false false false] 0 true false
	// 1
}

// WaitForStateChange follows a handle through a server restart without
// polling: connected, reconnecting while the server is away, and connected
// again once the handle has attached to the new server.
func ExampleSchedulerHandle_WaitForStateChange() {
	srv, err := umbptest.Start(umbptest.Options{Capacity: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rt, _ := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: srv.Endpoint(), Logger: quiet})
	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(sched.State())

	srv.Stall("Ping") // the new server does not answer until resumed
	if err := srv.Restart(); err != nil {
		panic(err)
	}
	sched.WaitForStateChange(ctx, umbp.StateConnected)
	fmt.Println(sched.State())
	srv.Resume("Ping")
	sched.WaitForStateChange(ctx, umbp.StateReconnecting)
	fmt.Println(sched.State())

	sched.Close()
	fmt.Println(sched.State())
	// Output:
	// connected
	// reconnecting
	// connected
	// closed
}

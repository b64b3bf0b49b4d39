package umbptest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// A stalled server costs an engine misses and refused transfers within its
// deadlines, never a hung step. Stall holds the named methods' handlers
// until Resume; other methods run as usual.
func ExampleServer_Stall() {
	srv, err := umbptest.Start(umbptest.Options{Capacity: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx := context.Background()
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{
		Endpoint:      srv.Endpoint(),
		Timeout:       time.Second,
		LookupTimeout: 500 * time.Millisecond,
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	buf, err := umbp.NewHostBuffer(4096)
	if err != nil {
		panic(err)
	}
	w, err := rt.NewWorkerHandle(ctx, nil)
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
	plan := func(key string) []umbp.BlockTransferPlan {
		return []umbp.BlockTransferPlan{{Key: key, Ranges: []umbp.KVRange{{BaseAddress: buf.Buffer().Ptr, Length: 4096}}}}
	}
	if err := w.Wait(ctx, w.Store(plan("a"))); err != nil {
		panic(err)
	}
	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		panic(err)
	}
	defer sched.Close()
	fmt.Println("lookup:", sched.Lookup(ctx, []string{"a"}))

	srv.Stall("BatchExists", "BatchPut")
	fmt.Println("stalled lookup:", sched.Lookup(ctx, []string{"a"}), "timeouts:", sched.Stats().Lookups.Timeouts)
	store := w.Store(plan("b"))
	err = w.Wait(ctx, store)
	fmt.Println("stalled store:", errors.Is(err, umbp.ErrBuffersInUse), store.Status())

	srv.Resume()
	<-store.Done()
	fmt.Println("after Resume the store ended", store.Status())
	fresh, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		panic(err)
	}
	defer fresh.Close()
	fmt.Println("lookup:", fresh.Lookup(ctx, []string{"a", "b"}))
	// Output:
	// lookup: [true]
	// stalled lookup: [false] timeouts: 1
	// stalled store: true RUNNING
	// after Resume the store ended COMPLETED
	// lookup: [true true]
}

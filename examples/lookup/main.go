// Command lookup is a custom scheduler's view of the shared pool: it asks the
// server which KV blocks exist, and never waits on it longer than
// LookupTimeout.
//
// With no endpoint it starts the Go server in-process and stores a few
// blocks first, so there is something to find:
//
//	go run ./examples/lookup
//	go run ./examples/lookup -endpoint unix:///run/umbp/standalone/node0.grpc.sock -ns mymodel key1 key2
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

func main() {
	endpoint := flag.String("endpoint", "", "server socket (unix:///abs/path); empty starts the Go server in-process")
	timeout := flag.Duration("lookup-timeout", time.Second, "deadline of each lookup")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(*endpoint, *timeout, flag.Args(), log); err != nil {
		fmt.Fprintln(os.Stderr, "lookup:", err)
		os.Exit(1)
	}
}

func run(endpoint string, timeout time.Duration, keys []string, log *slog.Logger) error {
	ctx := context.Background()
	if endpoint == "" {
		srv, err := umbptest.Start(umbptest.Options{Capacity: 64 << 20, Logger: log})
		if err != nil {
			return err
		}
		defer srv.Close()
		endpoint = srv.Endpoint()
		stored, err := seed(ctx, endpoint, log)
		if err != nil {
			return err
		}
		keys = append(stored, "umbp:vllm:v1:demo:tp0:pcp0:dcp0:pp0:g0:ffff")
	}
	if len(keys) == 0 {
		return fmt.Errorf("name the keys to look up")
	}
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: endpoint, LookupTimeout: timeout, Logger: log})
	if err != nil {
		return err
	}
	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		return err
	}
	defer sched.Close()

	start := time.Now()
	hits := sched.Lookup(ctx, keys)
	took := time.Since(start)
	for i, k := range keys {
		state := "miss"
		if hits[i] {
			state = "hit"
		}
		fmt.Printf("%-4s %s\n", state, k)
	}
	fmt.Printf("%d keys looked up in %v; the leading %d are all present\n", len(keys), took.Round(time.Microsecond), sched.LookupPrefix(ctx, keys))
	return nil
}

// seed stores three one-layer blocks through a worker handle.
func seed(ctx context.Context, endpoint string, log *slog.Logger) ([]string, error) {
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: endpoint, Logger: log})
	if err != nil {
		return nil, err
	}
	buf, err := umbp.NewHostBuffer(3 * 4096)
	if err != nil {
		return nil, err
	}
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		buf.Close()
		return nil, err
	}
	defer func() {
		if w.Close() == nil {
			buf.Close()
		}
	}()
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		return nil, err
	}
	codec, err := umbp.NewKeyCodec("demo", umbp.RankTopology{})
	if err != nil {
		return nil, err
	}
	var plans []umbp.BlockTransferPlan
	for i := range 3 {
		plans = append(plans, umbp.BlockTransferPlan{
			Key:     codec.Key(0, []byte{byte(i), 0xab}),
			BlockID: i,
			Ranges:  []umbp.KVRange{{BaseAddress: buf.Buffer().Ptr + uintptr(i*4096), Length: 4096}},
		})
	}
	job := w.Store(plans)
	if err := w.Wait(ctx, job); err != nil {
		return nil, fmt.Errorf("seed store: %w", err)
	}
	return job.Keys(), nil
}

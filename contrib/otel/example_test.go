package umbpotel_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// A scheduler handle whose calls are traced: each lookup is a client span
// named after its method.
func Example() {
	srv, err := umbptest.Start(umbptest.Options{Capacity: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer srv.Close()

	// Spans go to an in-memory recorder here; a program would export them.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	rt, err := umbp.NewStandaloneRuntime(umbp.Config{
		Endpoint:     srv.Endpoint(),
		StatsHandler: otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp)),
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(sched.Lookup(ctx, []string{"a", "b"}))
	fmt.Println(sched.LookupPrefix(ctx, []string{"a", "b"}))
	sched.Close()

	var names []string
	for _, s := range spans.Ended() {
		names = append(names, s.Name())
	}
	slices.Sort(names)
	fmt.Println(slices.Compact(names))
	// Output:
	// [false false]
	// 0
	// [umbp.UMBPStandalone/BatchExists umbp.UMBPStandalone/BatchExistsConsecutive umbp.UMBPStandalone/Ping]
}

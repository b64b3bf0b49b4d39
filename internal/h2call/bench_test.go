package h2call

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// rawCodec sends a request that is already encoded ([]byte) as it is, as
// the project's encoded requests are sent through grpc-go, and unmarshals
// replies as grpc-go's protobuf codec: the two clients then do the same
// work around the transport.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}

func (rawCodec) Name() string { return "" }

var rawCall = []grpc.CallOption{grpc.ForceCodecV2(rawCodec{}), grpc.StaticMethod()}

// lookupBench is a standalone server and the two clients to it.
type lookupBench struct {
	c  *Client
	cc *grpc.ClientConn
}

func newLookupBench(b *testing.B) lookupBench {
	path := standaloneProcess(b, 400)
	return lookupBench{
		c:  lockstep(b, Options{Dial: unixDial(path)}),
		cc: stub(b, "unix://"+path),
	}
}

// lookupReq is BatchExists' request for n keys of 100 bytes, a third of
// them held.
func lookupReq(n int) []byte {
	b, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: keys(n, 100, n)})
	return b
}

func (lb lookupBench) call(b *testing.B, grpcGo bool, req *[]byte, n int) {
	resp := new(umbppb.BatchBoolResponse)
	var err error
	if grpcGo {
		err = lb.cc.Invoke(context.Background(), umbppb.UMBPStandalone_BatchExists_FullMethodName, req, resp, rawCall...)
	} else {
		err = lb.c.Invoke(context.Background(), umbppb.UMBPStandalone_BatchExists_FullMethodName, *req, resp)
	}
	if err != nil || len(resp.Ok) != n {
		b.Fatalf("%d answers, %v", len(resp.Ok), err)
	}
}

var clients = []struct {
	name   string
	grpcGo bool
}{{"lockstep", false}, {"grpc", true}}

// BenchmarkLookup: BatchExists of 1, 64 and 1024 keys of 100 bytes against
// the project's Go server over a Unix socket, one call at a time, through
// the lock-step client and through grpc-go's (with the same pre-encoded
// request). Compare as ratios of one run, alternated rounds (-count).
func BenchmarkLookup(b *testing.B) {
	lb := newLookupBench(b)
	for _, n := range []int{1, 64, 1024} {
		req := lookupReq(n)
		for _, cl := range clients {
			b.Run(fmt.Sprintf("keys=%d/%s", n, cl.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					lb.call(b, cl.grpcGo, &req, n)
				}
			})
		}
	}
}

// BenchmarkLookupParallel: 16 goroutines looking up 64 keys at once through
// one client; ns/op is the time per call of all of them together (its
// inverse the calls per second), with the median and 99th percentile of a
// call's latency.
func BenchmarkLookupParallel(b *testing.B) {
	lb := newLookupBench(b)
	const goroutines = 16
	for _, n := range []int{1, 64} {
		req := lookupReq(n)
		for _, cl := range clients {
			b.Run(fmt.Sprintf("keys=%d/%s", n, cl.name), func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				var mu sync.Mutex
				var lat []time.Duration
				b.RunParallel(func(pb *testing.PB) {
					mine := make([]time.Duration, 0, 1024)
					for pb.Next() {
						start := time.Now()
						lb.call(b, cl.grpcGo, &req, n)
						mine = append(mine, time.Since(start))
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				})
				if len(lat) > 0 {
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
					b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
				}
			})
		}
	}
}

// A lock-step call allocates nothing of its own: what it allocates is the
// reply's content, which proto.Unmarshal makes (here, the slice of
// results). grpc-go's call allocates dozens of objects.
func TestAllocsPerCall(t *testing.T) {
	lb := lookupBench{}
	path := standaloneProcess(t, 10)
	lb.c = lockstep(t, Options{Dial: unixDial(path)})
	lb.cc = stub(t, "unix://"+path)
	req, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: keys(64, 100, 10)})
	resp := new(umbppb.BatchBoolResponse)
	measure := func(call func() error) float64 {
		if err := call(); err != nil { // connected, buffers grown
			t.Fatal(err)
		}
		return testing.AllocsPerRun(200, func() {
			if err := call(); err != nil || len(resp.Ok) != 64 {
				t.Fatalf("%d answers, %v", len(resp.Ok), err)
			}
		})
	}
	ls := measure(func() error {
		return lb.c.Invoke(context.Background(), umbppb.UMBPStandalone_BatchExists_FullMethodName, req, resp)
	})
	gg := measure(func() error {
		return lb.cc.Invoke(context.Background(), umbppb.UMBPStandalone_BatchExists_FullMethodName, &req, resp, rawCall...)
	})
	t.Logf("allocations per call: lock-step %v, grpc-go %v", ls, gg)
	if ls > 1 || ls >= gg {
		t.Errorf("a lock-step call allocates %v objects (grpc-go's %v), want at most the reply's 1", ls, gg)
	}
}

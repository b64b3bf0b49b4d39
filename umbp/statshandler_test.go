package umbp_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc/stats"

	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// methodCounter is a stats.Handler that counts the RPCs it sees by method.
type methodCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (m *methodCounter) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[info.FullMethodName]++
	return ctx
}

func (m *methodCounter) HandleRPC(context.Context, stats.RPCStats) {}

func (m *methodCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (m *methodCounter) HandleConn(context.Context, stats.ConnStats) {}

func (m *methodCounter) count(method string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls["/umbp.UMBPStandalone/"+method]
}

// TestStatsHandler: Config.StatsHandler sees every handle's gRPC calls.
func TestStatsHandler(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	h := &methodCounter{calls: map[string]int{}}
	cfg := testConfig(t, srv.Endpoint())
	cfg.StatsHandler = h
	rt := newRuntime(t, cfg)
	e := newEngine(t, rt, 1, 2, 512)
	sched := newScheduler(t, rt)
	ctx := context.Background()

	plans := e.plans(t, "stats", 0)
	waitJob(t, e.w, e.w.Store(plans))
	if got := sched.Lookup(ctx, []string{plans[0].Key}); !got[0] {
		t.Fatal("lookup missed a stored key")
	}
	for _, m := range []string{"Ping", "RegisterMemory", "BatchPut", "BatchExists"} { // one host range: a plain BatchPut
		if h.count(m) == 0 {
			t.Errorf("the stats handler saw no %s call", m)
		}
	}
	if got := rt.Config().StatsHandler; got != stats.Handler(h) {
		t.Errorf("Config().StatsHandler = %v, want the handler", got)
	}
}

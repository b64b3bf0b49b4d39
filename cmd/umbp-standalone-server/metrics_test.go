package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/umbp"
)

// poolMetrics are the names TestMetricsShowThePool compares whole.
var poolMetrics = []string{
	"umbp_server_pool_capacity_bytes", "umbp_server_pool_used_bytes", "umbp_server_pool_objects",
	"umbp_server_pool_evictions_total", "umbp_server_registered_regions", "umbp_server_registered_clients",
}

// expect is the exposition of poolMetrics for these values.
func expect(used, objects, evictions, regions, clients int) string {
	return fmt.Sprintf(`# HELP umbp_server_pool_capacity_bytes The DRAM pool's capacity.
# TYPE umbp_server_pool_capacity_bytes gauge
umbp_server_pool_capacity_bytes 1.048576e+06
# HELP umbp_server_pool_evictions_total Objects evicted to make room for others since the server started.
# TYPE umbp_server_pool_evictions_total counter
umbp_server_pool_evictions_total %d
# HELP umbp_server_pool_objects Objects stored in the pool.
# TYPE umbp_server_pool_objects gauge
umbp_server_pool_objects %d
# HELP umbp_server_pool_used_bytes Bytes of stored (and reserved) objects in the pool.
# TYPE umbp_server_pool_used_bytes gauge
umbp_server_pool_used_bytes %d
# HELP umbp_server_registered_clients Client ids holding at least one registered region.
# TYPE umbp_server_registered_clients gauge
umbp_server_registered_clients %d
# HELP umbp_server_registered_regions Registered memory regions, host and GPU.
# TYPE umbp_server_registered_regions gauge
umbp_server_registered_regions %d
`, evictions, objects, used, clients, regions)
}

// TestMetricsShowThePool: scraped over HTTP from a running server, the
// metrics show its pool filling, evicting and being cleared, its
// registrations, and its calls by method.
func TestMetricsShowThePool(t *testing.T) {
	dir, err := os.MkdirTemp("", "umbpm")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var srv *server.Server
	m := newMetrics(func() server.Stats { return srv.Stats() })
	srv, err = server.New(server.Options{
		Endpoint: "unix://" + filepath.Join(dir, "m.grpc.sock"), Capacity: 1 << 20,
		UnaryInterceptor: m.interceptor, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	bound, closeMetrics, err := serveMetrics("127.0.0.1:0", m, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeMetrics()
	url := "http://" + bound + "/metrics"
	scrape := func(what string, want string) {
		t.Helper()
		if err := testutil.ScrapeAndCompare(url, strings.NewReader(want), poolMetrics...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	scrape("a new server", expect(0, 0, 0, 0, 0))

	ctx := context.Background()
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: srv.Endpoint(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	const object = 64 << 10
	buf, err := umbp.NewHostBuffer(24 * object)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	store := func(from, to int) {
		t.Helper()
		var plans []umbp.BlockTransferPlan
		for i := from; i < to; i++ {
			plans = append(plans, umbp.BlockTransferPlan{Key: fmt.Sprint("k", i), Ranges: []umbp.KVRange{
				{BaseAddress: buf.Buffer().Ptr + uintptr(i*object), Length: object},
			}})
		}
		if err := w.Wait(ctx, w.Store(plans)); err != nil {
			t.Fatal(err)
		}
	}
	store(0, 8) // half the pool
	scrape("the pool half full", expect(8*object, 8, 0, 1, 1))
	store(8, 24) // 16 more: 8 of the first are evicted
	scrape("the pool full, evicting", expect(16*object, 16, 8, 1, 1))
	sched, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Close()
	if err := sched.Clear(ctx); err != nil {
		t.Fatal(err)
	}
	scrape("the pool cleared", expect(0, 0, 8, 1, 1))
	const handoffs = `# HELP umbp_server_fd_handoffs_total Host-memory registrations by descriptor (fd handoffs) served, by result.
# TYPE umbp_server_fd_handoffs_total counter
umbp_server_fd_handoffs_total{result="registered"} 1
umbp_server_fd_handoffs_total{result="rejected"} 0
`
	if err := testutil.ScrapeAndCompare(url, strings.NewReader(handoffs), "umbp_server_fd_handoffs_total"); err != nil {
		t.Errorf("fd handoffs: %v", err)
	}
	if n := testutil.ToFloat64(m.calls.WithLabelValues("BatchPut", "OK")); n != 2 {
		t.Errorf("umbp_server_calls_total{method=BatchPut,code=OK} = %v, want 2 (two stores)", n)
	}
	if n := testutil.ToFloat64(m.calls.WithLabelValues("Clear", "OK")); n != 1 {
		t.Errorf("umbp_server_calls_total{method=Clear,code=OK} = %v, want 1", n)
	}
}

// TestMetricsFlag: the command serves its metrics where -metrics says, on
// loopback for a bare port, and refuses an address beyond the host unless
// told.
func TestMetricsFlag(t *testing.T) {
	for _, c := range []struct {
		addr, want string
		any        bool
	}{
		{":9464", "127.0.0.1:9464", false},
		{"127.0.0.1:0", "127.0.0.1:0", false},
		{"[::1]:9464", "[::1]:9464", false},
		{"localhost:9464", "localhost:9464", false},
		{"10.1.2.3:9464", "", false},
		{"10.1.2.3:9464", "10.1.2.3:9464", true},
		{"9464", "", false},
	} {
		got, err := metricsAddr(c.addr, c.any)
		if got != c.want || (err != nil) != (c.want == "") {
			t.Errorf("metricsAddr(%q, %v) = %q, %v; want %q", c.addr, c.any, got, err, c.want)
		}
	}
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildServer(t)
	dir, err := os.MkdirTemp("", "umbpm")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command(bin, "-endpoint", "unix://"+filepath.Join(dir, "m.grpc.sock"), "-capacity", "1MiB", "-prefault=false", "-gpu", "off", "-metrics", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := regexp.MustCompile(`msg="serving metrics" url=(\S+)`).FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	var url string
	select {
	case url = <-urls:
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not say where it serves its metrics")
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "umbp_server_pool_capacity_bytes 1.048576e+06") {
		t.Fatalf("%s answered no pool capacity:\n%s", url, body)
	}
}

package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// goServerMetrics is what the Go server's -metrics serves (Prometheus'
// text format), as it writes it, for a pool of 64 MiB holding 3 objects.
const goServerMetrics = `# HELP umbp_server_fd_handoffs_total Host-memory registrations by descriptor (fd handoffs) served, by result.
# TYPE umbp_server_fd_handoffs_total counter
umbp_server_fd_handoffs_total{result="registered"} 2
umbp_server_fd_handoffs_total{result="rejected"} 0
umbp_server_gpu_ipc_handles 0
# HELP umbp_server_pool_capacity_bytes The DRAM pool's capacity.
# TYPE umbp_server_pool_capacity_bytes gauge
umbp_server_pool_capacity_bytes 6.7108864e+07
# TYPE umbp_server_pool_evictions_total counter
umbp_server_pool_evictions_total 5
# TYPE umbp_server_pool_objects gauge
umbp_server_pool_objects 3
# TYPE umbp_server_pool_used_bytes gauge
umbp_server_pool_used_bytes 1.6777216e+07
umbp_server_reclaimed_processes_total 0
umbp_server_registered_clients 1
umbp_server_registered_regions 2
`

func serveText(t *testing.T, text string) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, text)
	}))
	t.Cleanup(hs.Close)
	return strings.TrimPrefix(hs.URL, "http://")
}

// ping -metrics shows the Go server's pool from its metrics: its use,
// objects and evictions, and the regions registered.
func TestPingMetrics(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	addr := serveText(t, goServerMetrics)
	stdout, _ := mustRun(t, exitOK, "", "ping", "-endpoint", srv.Endpoint(), "-count", "0", "-metrics", addr)
	mustContain(t, "ping -metrics", stdout,
		"pool       16.0 MiB of 64.0 MiB used (25%), 3 objects, 5 evicted since start",
		"regions    2 registered by 1 clients",
		"metrics    http://"+addr+"/metrics")
	stdout, _ = mustRun(t, exitOK, "", "ping", "-endpoint", srv.Endpoint(), "-count", "0", "-json", "-metrics", "http://"+addr)
	mustContain(t, "ping -json -metrics", stdout, `"capacity_bytes": 67108864`, `"used_bytes": 16777216`, `"objects": 3`)

	// Not the Go server's metrics, none there, a bad address.
	_, stderr := mustRun(t, exitFail, "", "ping", "-endpoint", srv.Endpoint(), "-count", "0", "-metrics", serveText(t, "up 1\n"))
	mustContain(t, "ping -metrics (other metrics)", stderr, "has no umbp_server_pool_capacity_bytes: not the Go server's metrics (MORI's server serves none)")
	_, stderr = mustRun(t, exitUsage, "", "ping", "-endpoint", srv.Endpoint(), "-metrics", "127.0.0.1:99999")
	mustContain(t, "ping -metrics 127.0.0.1:99999", stderr, `umbp ping: -metrics "127.0.0.1:99999": port "99999" is not a TCP port (1 to 65535)`)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/server"
)

// The server's metrics: its pool, its registrations and its calls, read at
// each scrape from the server's own counters (server.Stats) and counted by
// method as the calls are served.
var (
	descCapacity   = prometheus.NewDesc("umbp_server_pool_capacity_bytes", "The DRAM pool's capacity.", nil, nil)
	descUsed       = prometheus.NewDesc("umbp_server_pool_used_bytes", "Bytes of stored (and reserved) objects in the pool.", nil, nil)
	descObjects    = prometheus.NewDesc("umbp_server_pool_objects", "Objects stored in the pool.", nil, nil)
	descEvictions  = prometheus.NewDesc("umbp_server_pool_evictions_total", "Objects evicted to make room for others since the server started.", nil, nil)
	descRegions    = prometheus.NewDesc("umbp_server_registered_regions", "Registered memory regions, host and GPU.", nil, nil)
	descClients    = prometheus.NewDesc("umbp_server_registered_clients", "Client ids holding at least one registered region.", nil, nil)
	descGPUHandles = prometheus.NewDesc("umbp_server_gpu_ipc_handles", "Open GPU IPC handles.", nil, nil)
	descHandoffs   = prometheus.NewDesc("umbp_server_fd_handoffs_total", "Host-memory registrations by descriptor (fd handoffs) served, by result.", []string{"result"}, nil)
	descReclaimed  = prometheus.NewDesc("umbp_server_reclaimed_processes_total", "Client processes that exited holding regions, whose regions the server released.", nil, nil)
)

// poolCollector reports a server's pool and registrations as its Stats
// say them at the moment of the scrape.
type poolCollector struct{ stats func() server.Stats }

// Describe names every metric without reading the server (the registry
// asks before the server exists).
func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descUsed, descObjects, descEvictions, descRegions, descClients, descGPUHandles, descHandoffs, descReclaimed} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	gauge(descCapacity, float64(st.Capacity))
	gauge(descUsed, float64(st.BytesUsed))
	gauge(descObjects, float64(st.Objects))
	ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(st.Evictions))
	gauge(descRegions, float64(st.Regions))
	gauge(descClients, float64(st.Clients))
	gauge(descGPUHandles, float64(st.GPUHandles))
	ch <- prometheus.MustNewConstMetric(descHandoffs, prometheus.CounterValue, float64(st.FDRegistered), "registered")
	ch <- prometheus.MustNewConstMetric(descHandoffs, prometheus.CounterValue, float64(st.FDRejected), "rejected")
	ch <- prometheus.MustNewConstMetric(descReclaimed, prometheus.CounterValue, float64(st.ReclaimedProcesses))
}

// metrics is the server's registry and what counts its calls.
type metrics struct {
	reg   *prometheus.Registry
	calls *prometheus.CounterVec
}

// newMetrics makes the registry: the pool collector (stats is read at each
// scrape), the calls counter, and the process's and Go runtime's own.
func newMetrics(stats func() server.Stats) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "umbp_server_calls_total",
			Help: "gRPC calls served, by method and status code.",
		}, []string{"method", "code"}),
	}
	m.reg.MustRegister(poolCollector{stats: stats}, m.calls,
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	return m
}

// interceptor counts each call by its method's name (BatchPut, not the
// whole path) and the code it answered.
func (m *metrics) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	method := info.FullMethod
	for i := len(method) - 1; i >= 0; i-- {
		if method[i] == '/' {
			method = method[i+1:]
			break
		}
	}
	m.calls.WithLabelValues(method, status.Code(err).String()).Inc()
	return resp, err
}

// metricsAddr is where -metrics listens: an address without a host (":9464")
// is loopback's, and one whose host is not loopback is refused unless the
// operator says so (-metrics-any-interface): the metrics name the pool's
// clients' sizes to anyone who can reach them.
func metricsAddr(addr string, anyInterface bool) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("-metrics %q: %w (want HOST:PORT or :PORT)", addr, err)
	}
	if host == "" {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	ip := net.ParseIP(host)
	if host == "localhost" || (ip != nil && ip.IsLoopback()) || anyInterface {
		return addr, nil
	}
	return "", fmt.Errorf("-metrics %q is not a loopback address: pass -metrics-any-interface to serve metrics beyond this host", addr)
}

// serveMetrics serves m's registry at /metrics on addr until close is
// called, and returns the address it listens on.
func serveMetrics(addr string, m *metrics, log *slog.Logger) (bound string, closeFn func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("-metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server ended", "err", err)
		}
	}()
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if hs.Shutdown(ctx) != nil {
			_ = hs.Close() // a scrape that outlasted the grace
		}
		<-done
	}, nil
}

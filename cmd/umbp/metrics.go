package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// poolMetrics is the Go server's pool as its -metrics endpoint serves it
// (Prometheus' text format): what Ping does not say.
type poolMetrics struct {
	URL           string  `json:"url"`
	CapacityBytes float64 `json:"capacity_bytes"`
	UsedBytes     float64 `json:"used_bytes"`
	Objects       float64 `json:"objects"`
	Evictions     float64 `json:"evictions"`
	Regions       float64 `json:"registered_regions"`
	Clients       float64 `json:"registered_clients"`
}

// metricsURL is the URL of the metrics at addr: host:port (or :port, on
// loopback), or an http:// URL; a URL without a path gets /metrics.
func metricsURL(addr string) (string, error) {
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		if strings.Count(addr, "/") == 2 {
			addr += "/metrics"
		}
		return addr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%w: -metrics %q: want host:port, :port or an http:// URL, as the server's -metrics takes", errUsage, addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("%w: -metrics %q: port %q is not a TCP port (1 to 65535)", errUsage, addr, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics", nil
}

// fetchPool reads the pool's metrics from url, within ctx.
func fetchPool(ctx context.Context, url string) (*poolMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w (is the server started with -metrics at that address?)", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("-metrics: %s answered %s", url, resp.Status)
	}
	values, err := parseMetrics(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("-metrics: %s: %w", url, err)
	}
	p := &poolMetrics{URL: url}
	for _, m := range []struct {
		name string
		v    *float64
	}{
		{"umbp_server_pool_capacity_bytes", &p.CapacityBytes},
		{"umbp_server_pool_used_bytes", &p.UsedBytes},
		{"umbp_server_pool_objects", &p.Objects},
		{"umbp_server_pool_evictions_total", &p.Evictions},
		{"umbp_server_registered_regions", &p.Regions},
		{"umbp_server_registered_clients", &p.Clients},
	} {
		v, ok := values[m.name]
		if !ok {
			return nil, fmt.Errorf("-metrics: %s has no %s: not the Go server's metrics (MORI's server serves none)", url, m.name)
		}
		*m.v = v
	}
	return p, nil
}

// parseMetrics reads Prometheus' text exposition format: each sample's
// value by its name, the samples of one name with labels summed.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	values := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ \t"); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				return nil, fmt.Errorf("line %d: labels not closed: %q", n, line)
			}
			rest = rest[end+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("line %d: no value: %q", n, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: value %q: %w", n, f[0], err)
		}
		values[name] += v
	}
	return values, sc.Err()
}

// printPool prints the pool's line of ping.
func printPool(p func(k, format string, a ...any), m *poolMetrics) {
	p("pool", "%s of %s used (%.0f%%), %.0f objects, %.0f evicted since start", bytesText(m.UsedBytes), bytesText(m.CapacityBytes), 100*m.UsedBytes/max(m.CapacityBytes, 1), m.Objects, m.Evictions)
	p("regions", "%.0f registered by %.0f clients", m.Regions, m.Clients)
	p("metrics", "%s", m.URL)
}

// bytesText is n bytes in KiB, MiB or GiB.
func bytesText(n float64) string {
	for _, u := range []struct {
		unit string
		size float64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size {
			return strconv.FormatFloat(n/u.size, 'f', 1, 64) + " " + u.unit
		}
	}
	return strconv.FormatFloat(n, 'f', 0, 64) + " B"
}

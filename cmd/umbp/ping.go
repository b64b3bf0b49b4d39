package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
)

// pingResult is what ping reports; -json prints it as is.
type pingResult struct {
	Endpoint string `json:"endpoint"`
	FDSocket string `json:"fd_socket"`
	Ready    bool   `json:"ready"`
	Mode     string `json:"mode"`
	RangedIO bool   `json:"ranged_io"`
	// GPUMemory is whether the server takes GPU memory by IPC handle:
	// false where Ping's answer rules it out, null where it cannot tell
	// (Ping does not say whether the server can open IPC handles);
	// GPUMemoryNote says why.
	GPUMemory     *bool     `json:"gpu_memory"`
	GPUMemoryNote string    `json:"gpu_memory_note"`
	RTTs          []float64 `json:"rtt_seconds"`
	FDHandoff     *bool     `json:"fd_handoff,omitempty"`
	FDHandoffErr  string    `json:"fd_handoff_error,omitempty"`
	// Pool is the Go server's pool, from its -metrics (ping -metrics).
	Pool *poolMetrics `json:"pool,omitempty"`
}

func pingFlags(fs *flag.FlagSet, c *common) func(context.Context, env, []string) error {
	c.register(fs, 5*time.Second, "how long to wait for the server to answer, and for each ping")
	count := fs.Int("count", 3, "pings to time after the server first answered")
	fd := fs.Bool("fd", false, "also register one page of host memory through the fd-handoff socket, and release it")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	metrics := fs.String("metrics", "", "the Go server's -metrics address (host:port, :port or a URL): also show its pool's use, which Ping does not say")
	return func(ctx context.Context, e env, args []string) error {
		if len(args) != 0 {
			return fmt.Errorf("%w: unexpected arguments %q", errUsage, args)
		}
		if *count < 0 {
			return fmt.Errorf("%w: -count must not be negative", errUsage)
		}
		var url string
		if *metrics != "" {
			var err error
			if url, err = metricsURL(*metrics); err != nil {
				return err
			}
		}
		rt, err := c.runtime()
		if err != nil {
			return err
		}
		res, err := ping(ctx, c, rt, *count, *fd)
		if err != nil {
			return err
		}
		if url != "" {
			mctx, cancel := context.WithTimeout(ctx, c.timeout)
			res.Pool, err = fetchPool(mctx, url)
			cancel()
			if err != nil {
				return err
			}
		}
		if *asJSON {
			if err := printJSON(e, res); err != nil {
				return err
			}
		} else {
			printPing(e, res)
		}
		if res.FDHandoff != nil && !*res.FDHandoff {
			return fmt.Errorf("fd handoff: %s", res.FDHandoffErr)
		}
		return nil
	}
}

// ping attaches a scheduler handle as an engine would (trust check, wait
// for ready), times count more pings and, with fd, registers a page of
// host memory.
func ping(ctx context.Context, c *common, rt *umbp.StandaloneRuntime, count int, fd bool) (*pingResult, error) {
	h, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	caps := h.Stats().Capabilities
	res := &pingResult{
		Endpoint: rt.Endpoint(),
		FDSocket: rt.FDSocketPath(),
		Ready:    caps.Ready,
		Mode:     caps.Mode,
		RangedIO: caps.RangedIO,
		RTTs:     []float64{},
	}
	res.GPUMemory, res.GPUMemoryNote = gpuMemory(caps)
	for range count {
		start := time.Now()
		caps, err := h.Ping(ctx)
		took := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("ping %d: %w", len(res.RTTs)+1, err)
		}
		res.Ready = caps.Ready
		res.RTTs = append(res.RTTs, took.Seconds())
	}
	if fd {
		err := registerPage(ctx, rt)
		ok := err == nil
		res.FDHandoff = &ok
		if err != nil {
			res.FDHandoffErr = err.Error()
		}
	}
	return res, nil
}

// gpuMemory says what Ping's answer tells of GPU memory by IPC handle:
// nothing certain on a server with ranged I/O, whose answer is the same
// with a usable GPU or without (the Go server without a GPU runtime, or
// MORI's on a host without a device, refuses every IPC handle), nor in
// distributed mode, where a v2 server may lack ranged I/O with its SSD
// tier off. Otherwise the server is v1, which takes host memory only, or
// v2 with its SSD tier on, which refuses GPU memory.
func gpuMemory(caps umbp.ServerCapabilities) (*bool, string) {
	switch {
	case caps.RangedIO:
		return nil, "Ping does not tell whether the server opens GPU IPC handles: one without a usable GPU, or the Go server with -gpu off, answers the same and refuses them; registering GPU memory shows which"
	case caps.Mode == "STANDALONE_BACKEND_DISTRIBUTED":
		return nil, "Ping does not say; in distributed mode a server may take GPU memory without ranged I/O; only registering GPU memory shows it"
	}
	return new(bool), "a v1 server takes host memory only, and a v2 server refuses GPU memory with its SSD tier on"
}

// registerPage registers one page of host memory through a worker handle
// (fd handoff, then RegisterMemory) and releases it.
func registerPage(ctx context.Context, rt *umbp.StandaloneRuntime) (err error) {
	buf, err := umbp.NewHostBuffer(4096)
	if err != nil {
		return err
	}
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		buf.Close()
		return err
	}
	defer func() {
		// A buffer the handle could not release stays mapped: the server
		// may still use it.
		if cerr := w.Close(); cerr != nil {
			err = errors.Join(err, cerr)
			return
		}
		err = errors.Join(err, buf.Close())
	}()
	return w.RegisterBuffers(ctx, map[string]umbp.Buffer{"page": buf.Buffer()})
}

func printPing(e env, r *pingResult) {
	p := func(k, format string, a ...any) { fmt.Fprintf(e.stdout, "%-10s %s\n", k, fmt.Sprintf(format, a...)) }
	p("endpoint", "%s", r.Endpoint)
	p("fd socket", "%s", r.FDSocket)
	p("ready", "%v", r.Ready)
	p("mode", "%s", r.Mode)
	if r.RangedIO {
		p("ranged I/O", "yes: scatter/gather batches (a v2 server with its SSD tier off)")
	} else {
		p("ranged I/O", "no: contiguous batches only (a v1 server, or v2 with its SSD tier on)")
	}
	if r.GPUMemory == nil {
		p("GPU memory", "not said: %s", r.GPUMemoryNote)
	} else {
		p("GPU memory", "no: %s", r.GPUMemoryNote)
	}
	if len(r.RTTs) > 0 {
		s := slices.Clone(r.RTTs)
		slices.Sort(s)
		sum := 0.0
		for _, v := range s {
			sum += v
		}
		pings := "pings"
		if len(s) == 1 {
			pings = "ping"
		}
		p("rtt", "min %v, avg %v, max %v over %d %s", dur(s[0]), dur(sum/float64(len(s))), dur(s[len(s)-1]), len(s), pings)
	}
	if r.Pool != nil {
		printPool(p, r.Pool)
	}
	if r.FDHandoff != nil {
		if *r.FDHandoff {
			p("fd handoff", "ok: registered and released one page of host memory")
		} else {
			p("fd handoff", "FAILED: %s", r.FDHandoffErr)
		}
	}
}

// dur formats seconds as a duration rounded to a microsecond.
func dur(seconds float64) time.Duration {
	return time.Duration(seconds * float64(time.Second)).Round(time.Microsecond)
}

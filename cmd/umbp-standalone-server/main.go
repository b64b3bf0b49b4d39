// Command umbp-standalone-server runs the Go implementation of
// umbp_standalone_server as a process: a stand-in for MORI's binary on hosts
// without it.
//
//	go install github.com/umbp-go/umbp-go/cmd/umbp-standalone-server@latest
//	umbp-standalone-server -endpoint unix:///run/umbp/standalone/node0.grpc.sock -capacity 4GiB -metrics :9464
//
// It is a module of its own, so that the Prometheus client library it
// serves -metrics with is none of the library's requirements.
//
// It prints "listening on <endpoint>" on stdout once both sockets accept
// connections, and on SIGTERM or SIGINT closes (sockets unlinked) and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/internal/bytesize"
	"github.com/umbp-go/umbp-go/internal/endpoint"
	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/internal/server"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the exit: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("umbp-standalone-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", endpoint.Default(), "gRPC socket: an absolute path or unix:///abs/path (the fd socket is derived); default $UMBP_ENDPOINT, else MORI's node address from $UMBP_NODE_ID")
	capacity := fs.String("capacity", "1GiB", "DRAM pool size in bytes; suffixes K, M, G, T (and KiB, MiB, GiB, TiB) are powers of 1024, KB, MB, GB, TB powers of 1000")
	version := fs.Int("version", 2, "protocol version: 1 (host memory, contiguous batches) or 2 (adds ranged I/O and GPU IPC)")
	prefault := fs.Bool("prefault", true, "map the whole pool at start-up (commits -capacity bytes at once)")
	noRanged := fs.Bool("no-ranged-io", false, "behave as a v2 server with its SSD tier on: no ranged I/O advertised, GPU IPC refused")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	replace := fs.Bool("replace", false, "start even where a live server answers on the endpoint, taking its socket paths over (it keeps running, unreachable); without it such a start fails, while sockets left by a server that is gone are replaced")
	metricsFlag := fs.String("metrics", "", "serve Prometheus metrics (the pool, registrations, calls by method) at http://ADDR/metrics; :PORT is loopback's; empty: none")
	metricsAny := fs.Bool("metrics-any-interface", false, "allow -metrics on an address that is not loopback")
	gpuMode := fs.String("gpu", "auto", "GPU IPC regions (v2): auto uses the GPU runtime (HIP, else CUDA) when one loads with a device, on requires it, off refuses GPU registration; with a GPU the pool is pinned, which commits all of it")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "umbp-standalone-server: unexpected arguments %q\n", fs.Args())
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "umbp-standalone-server: -log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	size, err := bytesize.Parse(*capacity)
	if err != nil {
		log.Error("invalid -capacity", "err", err)
		return 2
	}
	if _, _, err := fdpass.SocketPaths(*endpoint); err != nil {
		log.Error("invalid -endpoint", "err", err)
		return 2
	}
	if *version != 1 && *version != 2 {
		log.Error("invalid -version: want 1 or 2", "version", *version)
		return 2
	}
	var metricsAt string
	if *metricsFlag != "" {
		if metricsAt, err = metricsAddr(*metricsFlag, *metricsAny); err != nil {
			log.Error("invalid -metrics", "err", err)
			return 2
		}
	}
	gpu, code := gpuBackend(*gpuMode, log)
	if code != 0 {
		return code
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var srv *server.Server
	var m *metrics
	var intercept grpc.UnaryServerInterceptor
	if metricsAt != "" {
		m = newMetrics(func() server.Stats { return srv.Stats() })
		intercept = m.interceptor
	}
	srv, err = server.New(server.Options{
		UnaryInterceptor: intercept,
		Endpoint:         *endpoint,
		Capacity:         size,
		Version:          *version,
		DisableRangedIO:  *noRanged,
		Prefault:         *prefault,
		Replace:          *replace,
		Logger:           log,
		GPU:              gpu,
	})
	if c, ok := gpu.(io.Closer); ok {
		defer c.Close()
	}
	if err != nil {
		log.Error(startFailure(err, *endpoint))
		return 1
	}
	if m != nil {
		bound, closeMetrics, err := serveMetrics(metricsAt, m, log)
		if err != nil {
			log.Error("cannot start: " + err.Error())
			_ = srv.Close()
			return 1
		}
		defer closeMetrics()
		log.Info("serving metrics", "url", "http://"+bound+"/metrics")
	}
	log.Info("listening", "endpoint", srv.Endpoint(), "capacity_bytes", size, "prefault", *prefault)
	fmt.Fprintf(stdout, "listening on %s\n", srv.Endpoint())
	<-ctx.Done()
	stop() // a second signal now ends the process at once
	log.Info("signal received; shutting down")
	if err := srv.Close(); err != nil {
		log.Error("close", "err", err)
		return 1
	}
	return 0
}

// gpuBackend returns the GPU backend that -gpu asks for (nil for none), or
// a non-zero exit status.
func gpuBackend(mode string, log *slog.Logger) (server.GPUBackend, int) {
	switch mode {
	case "off":
		return nil, 0
	case "auto", "on":
	default:
		log.Error("invalid -gpu: want auto, on or off", "gpu", mode)
		return nil, 2
	}
	gpu, err := server.NewHIPBackend(log) // each library tried, at debug level
	if err == nil {
		log.Info("GPU IPC regions served", "runtime", fmt.Sprint(gpu))
		return gpu, 0
	}
	var found string
	var le *hip.LoadError
	if errors.As(err, &le) {
		found = fmt.Sprintf("no usable GPU runtime among the %d libraries tried (-log-level debug lists them)", len(le.Tried))
	} else {
		found = fmt.Sprintf("no GPU runtime (%s)", strings.TrimPrefix(err.Error(), "server: GPU backend: "))
	}
	if mode == "on" {
		log.Error("-gpu on: " + found)
		return nil, 1
	}
	log.Info(found + ": GPU IPC registration is refused")
	return nil, 0
}

// startFailure is the one line that says why the server could not start,
// and which flag, if any, changes that.
func startFailure(err error, endpoint string) string {
	var nse *server.NotSocketError
	switch {
	case errors.As(err, &nse):
		where := nse.Path
		if grpcPath, _, perr := fdpass.SocketPaths(endpoint); perr == nil && grpcPath != nse.Path {
			where += " (the fd socket path, derived from -endpoint)"
		}
		return fmt.Sprintf("cannot start: %s is %s, not a socket; it is left as it is: move it away, or give another -endpoint", where, nse.What)
	case errors.Is(err, server.ErrEndpointInUse):
		who := strings.TrimPrefix(err.Error(), server.ErrEndpointInUse.Error()+": ")
		return fmt.Sprintf("cannot start: %s; stop it, or pass -replace to take its sockets over", who)
	}
	return "cannot start: " + strings.TrimPrefix(err.Error(), "server: ")
}

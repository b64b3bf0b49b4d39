package umbp_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// TestErrorsSayItOnce: what a user reads of a missing, stalled or killed
// server says "umbp:" once and names the endpoint once: the errors of
// attach, Clear, Store and RegisterBuffers, and the warning a failed
// Lookup logs.
func TestErrorsSayItOnce(t *testing.T) {
	check := func(t *testing.T, what, text, endpoint string) {
		t.Helper()
		t.Logf("%s: %s", what, text)
		n := strings.Count(text, "umbp:")
		if strings.Contains(what, "log") && n == 0 {
			n = 1 // a log record need not say it
		}
		if n != 1 {
			t.Errorf("%s says umbp: %d times: %s", what, n, text)
		}
		path := strings.TrimPrefix(endpoint, "unix://")
		if n := strings.Count(text, path); n != 1 {
			t.Errorf("%s names the endpoint %d times: %s", what, n, text)
		}
		for _, cause := range []string{"context deadline exceeded", "context canceled"} {
			if n := strings.Count(text, cause); n > 1 {
				t.Errorf("%s says %q %d times: %s", what, cause, n, text)
			}
		}
	}
	// checkErr is check for an error a function returned: an *OpError that
	// names the server.
	checkErr := func(t *testing.T, what string, err error, endpoint string) {
		t.Helper()
		check(t, what, err.Error(), endpoint)
		var oe *umbp.OpError
		if !errors.As(err, &oe) || oe.Addr != endpoint || oe.Op == "" {
			t.Errorf("%s: %#v is not an *OpError naming the operation and %s", what, err, endpoint)
		}
	}
	ctx := context.Background()

	t.Run("missing", func(t *testing.T) {
		ep := "unix://" + t.TempDir() + "/none.grpc.sock"
		cfg := testConfig(t, ep)
		cfg.StartupTimeout = 100 * time.Millisecond
		rt := newRuntime(t, cfg)
		_, err := rt.NewSchedulerHandle(ctx)
		if err == nil {
			t.Fatal("attached to no server")
		}
		checkErr(t, "attach", err, ep)
	})

	t.Run("silent at attach", func(t *testing.T) { // the wait's end is said as which deadline it was
		srv := newServer(t, umbptest.Options{})
		srv.Stall("Ping") // accepts connections, answers nothing
		defer srv.Resume()
		cfg := testConfig(t, srv.Endpoint())
		cfg.StartupTimeout = 300 * time.Millisecond
		_, err := newRuntime(t, cfg).NewSchedulerHandle(ctx)
		checkErr(t, "attach", err, srv.Endpoint())
		// The last attempt may have been cut off by the wait's end (its
		// error then says the deadline) or have ended just before it: the
		// deadline is said once either way, as StartupTimeout's.
		want := "(the wait's end: StartupTimeout, 300ms"
		if text := err.Error(); !strings.Contains(text, want) || strings.Count(text, "deadline exceeded") != 1 || strings.Contains(text, "waited") || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("attach to a silent server says\n\t%s\nwant it to say %q, the deadline once, and match context.DeadlineExceeded", err, want)
		}
		// A caller's context that ends first is said as the caller's.
		cfg.StartupTimeout = time.Minute
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err = newRuntime(t, cfg).NewSchedulerHandle(short)
		if want := "the caller's context ended the wait for the server after "; err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "StartupTimeout") {
			t.Errorf("attach ended by the caller's context says\n\t%v\nwant it to say %q and not blame StartupTimeout", err, want)
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("attach ended by the caller's deadline = %v, want it to match context.DeadlineExceeded", err)
		}
	})

	t.Run("stalled", func(t *testing.T) {
		srv := newServer(t, umbptest.Options{})
		var logs bytes.Buffer
		cfg := testConfig(t, srv.Endpoint())
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		cfg.Timeout = 300 * time.Millisecond
		rt := newRuntime(t, cfg)
		sched, err := rt.NewSchedulerHandle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer sched.Close()
		e := newEngine(t, rt, 2, 4, 4096)
		srv.Stall("BatchExists", "Clear", "RegisterMemory", "BatchPutRanges", "BatchPut")
		sched.Lookup(ctx, []string{"k"})
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				check(t, "lookup's log", line, srv.Endpoint())
			}
		}
		if err := sched.Clear(ctx); err == nil {
			t.Fatal("Clear of a stalled server succeeded")
		} else {
			checkErr(t, "clear", err, srv.Endpoint())
		}
		buf, err := umbp.NewHostBuffer(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Close()
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err = e.w.RegisterBuffers(short, map[string]umbp.Buffer{"more": buf.Buffer()})
		cancel()
		if err == nil {
			t.Fatal("registration with a stalled server succeeded")
		}
		checkErr(t, "register", err, srv.Endpoint())
		err = e.w.Wait(ctx, e.w.Store(e.plans(t, "k", 0, 1)))
		if !errors.Is(err, umbp.ErrBuffersInUse) {
			t.Fatalf("a store to a stalled server: %v, want ErrBuffersInUse", err)
		}
		checkErr(t, "store", err, srv.Endpoint())
		srv.Resume()
	})

	t.Run("killed", func(t *testing.T) {
		srv := newServer(t, umbptest.Options{})
		cfg := testConfig(t, srv.Endpoint())
		warnings := &warnSink{lines: make(chan string, 64)}
		cfg.Logger = slog.New(warnings)
		rt := newRuntime(t, cfg)
		e := newEngine(t, rt, 2, 4, 4096)
		sched, err := rt.NewSchedulerHandle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer sched.Close()
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		err = e.w.Wait(ctx, e.w.Store(e.plans(t, "k", 0, 1)))
		if err == nil {
			t.Fatal("a store to a killed server succeeded")
		}
		checkErr(t, "store", err, srv.Endpoint())
		if err := sched.Clear(ctx); err == nil {
			t.Fatal("Clear of a killed server succeeded")
		} else {
			checkErr(t, "clear", err, srv.Endpoint())
		}
		// The handles' warnings while they try to reattach, up to the
		// first failed attempt.
		timeout := time.After(time.Minute)
		for {
			select {
			case line := <-warnings.lines:
				check(t, "reconnect log", line, srv.Endpoint())
				if !strings.Contains(line, "reconnect attempt failed") {
					continue
				}
			case <-timeout:
				t.Fatal("no failed reconnect attempt was logged within a minute")
			}
			break
		}
	})
}

// warnSink is a slog handler that sends each WARN or ERROR record, as text,
// to lines (dropping it when lines is full).
type warnSink struct {
	lines chan string
	attrs []slog.Attr
}

func (w *warnSink) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnSink) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	h := slog.NewTextHandler(&b, nil).WithAttrs(w.attrs)
	if err := h.Handle(context.Background(), r); err != nil {
		return err
	}
	select {
	case w.lines <- strings.TrimSpace(b.String()):
	default:
	}
	return nil
}
func (w *warnSink) WithAttrs(as []slog.Attr) slog.Handler {
	return &warnSink{lines: w.lines, attrs: append(slices.Clone(w.attrs), as...)}
}
func (w *warnSink) WithGroup(string) slog.Handler { return w }

// TestAttachSaysWhy: a server that never answers an attach is described
// as what it is, with what to do: no socket, a socket nobody listens on, a
// process that accepts and says nothing (stopped), one that hangs up
// without speaking gRPC; and an endpoint naming the fd-handoff socket is
// refused before anything connects.
func TestAttachSaysWhy(t *testing.T) {
	dir := shortDir(t)
	attach := func(t *testing.T, path string) error {
		t.Helper()
		cfg := testConfig(t, path)
		cfg.StartupTimeout = time.Second // several attempts even on a loaded machine
		rt := newRuntime(t, cfg)
		h, err := rt.NewSchedulerHandle(context.Background())
		if err == nil {
			h.Close()
			t.Fatal("attached")
		}
		if !errors.Is(err, umbp.ErrUnavailable) {
			t.Errorf("%v does not match ErrUnavailable", err)
		}
		return err
	}
	want := func(t *testing.T, err error, parts ...string) {
		t.Helper()
		for _, p := range parts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("%q does not say %q", err, p)
			}
		}
	}
	t.Run("no socket", func(t *testing.T) {
		want(t, attach(t, dir+"/none.grpc.sock"), "no socket file", "start umbp_standalone_server")
	})
	t.Run("stale socket", func(t *testing.T) {
		path := dir + "/stale.grpc.sock"
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close() // the file stays, as after kill -9
		want(t, attach(t, path), "no server listens", "exited without removing it")
	})
	serve := func(t *testing.T, path string, handle func(net.Conn)) {
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		t.Cleanup(func() { l.Close(); wg.Wait() })
		wg.Go(func() {
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				conns = append(conns, c)
				handle(c)
			}
		})
	}
	t.Run("stopped server", func(t *testing.T) {
		path := dir + "/stopped.grpc.sock"
		serve(t, path, func(net.Conn) {}) // accepts, never answers
		want(t, attach(t, path), "accepted the connection but never answered", "stopped")
	})
	t.Run("not gRPC", func(t *testing.T) {
		path := dir + "/other.grpc.sock"
		serve(t, path, func(c net.Conn) { c.Close() })
		want(t, attach(t, path), "hung up without speaking gRPC")
	})
	t.Run("fd socket", func(t *testing.T) {
		_, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: dir + "/node0.fd.sock"})
		if !errors.Is(err, umbp.ErrInvalidConfig) {
			t.Fatalf("an fd-handoff socket as the endpoint: %v, want ErrInvalidConfig", err)
		}
		want(t, err, "fd-handoff socket", "node0.grpc.sock")
	})
}

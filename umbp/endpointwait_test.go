package umbp_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
)

// recordHandler sends each warning it is given to c.
type recordHandler struct{ c chan slog.Record }

func (h recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.c <- r.Clone()
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

// An endpoint with white space at either end is refused at construction,
// saying what was probably meant.
func TestEndpointWithSpacesRefused(t *testing.T) {
	for _, ep := range []string{" /run/umbp/node0.grpc.sock", "unix:///run/umbp/node0.grpc.sock\n"} {
		_, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: ep})
		if !errors.Is(err, umbp.ErrInvalidConfig) {
			t.Fatalf("endpoint %q: %v, want ErrInvalidConfig", ep, err)
		}
		if want := "has white space at its start or end (a socket path never does): did you mean"; !strings.Contains(err.Error(), want) {
			t.Errorf("endpoint %q: %v; want it to say %q", ep, err, want)
		}
		if _, err := umbp.NormalizeEndpoint(ep); err == nil {
			t.Errorf("NormalizeEndpoint(%q) accepted it", ep)
		}
	}
}

// A handle whose endpoint has no socket file says at its first attempt
// which path it watches and that Endpoint may be wrong, and the error at
// the end of the wait says whether even the directory is missing.
func TestEndpointWithoutSocketSaysWhere(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "typo", "node0.grpc.sock")
	records := make(chan slog.Record, 16)
	cfg := testConfig(t, path)
	cfg.StartupTimeout = time.Hour
	cfg.Logger = slog.New(recordHandler{records})
	rt := newRuntime(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := rt.NewSchedulerHandle(ctx)
		done <- err
	}()
	r := <-records // the first attempt's: long before StartupTimeout
	cancel()
	if want := "no socket file at the endpoint yet: waiting for a server to create it; check Config.Endpoint if none is starting"; r.Message != want {
		t.Errorf("first warning %q, want %q", r.Message, want)
	}
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	if attrs["watching"] != path || attrs["startup_timeout"] != "1h0m0s" {
		t.Errorf("first warning's attributes %v, want watching=%s startup_timeout=1h0m0s", attrs, path)
	}
	err := <-done
	if want := "no socket file there, nor its directory: check Endpoint for a typo, or start umbp_standalone_server on this host first"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("attach without the socket's directory: %v; want it to say %q", err, want)
	}

	// The directory there, the socket not: StartupTimeout's end.
	cfg = testConfig(t, filepath.Join(dir, "node0.grpc.sock"))
	cfg.StartupTimeout = 50 * time.Millisecond
	_, err = newRuntime(t, cfg).NewSchedulerHandle(context.Background())
	if want := "server unavailable: no socket file there: check Endpoint for a typo, or start umbp_standalone_server on this host first"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("attach without the socket: %v; want it to say %q", err, want)
	}
}

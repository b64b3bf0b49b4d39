package umbp_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
)

func TestNormalizeEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"/run/umbp/standalone/node0.grpc.sock":        "unix:///run/umbp/standalone/node0.grpc.sock",
		"unix:///run/umbp/standalone/node0.grpc.sock": "unix:///run/umbp/standalone/node0.grpc.sock",
		"/tmp/x.sock":      "unix:///tmp/x.sock",
		"unix:/tmp/x.sock": "unix:///tmp/x.sock",
	} {
		got, err := umbp.NormalizeEndpoint(in)
		if err != nil || got != want {
			t.Errorf("NormalizeEndpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, frag := range map[string]string{
		"tcp://127.0.0.1:1":           "must be a Unix socket path or unix:// address",
		"dns:///x":                    "must be a Unix socket path or unix:// address",
		"relative.sock":               "must be an absolute path",
		"unix://relative.sock":        "must be an absolute path",
		"":                            "must be an absolute path",
		"/" + strings.Repeat("a", 99): "fit a Unix socket address",
	} {
		_, err := umbp.NormalizeEndpoint(in)
		if err == nil || !strings.Contains(err.Error(), frag) {
			t.Errorf("NormalizeEndpoint(%q) err = %v, want it to say %q", in, err, frag)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: "/tmp/none/x.grpc.sock"})
	if err != nil {
		t.Fatal(err)
	}
	c := rt.Config()
	if c.NumWorkers != 4 || c.Timeout != 30*time.Second || c.LookupTimeout != time.Second || c.StartupTimeout != 30*time.Second || c.Logger == nil {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if rt.Endpoint() != "unix:///tmp/none/x.grpc.sock" {
		t.Fatalf("endpoint %q", rt.Endpoint())
	}
	for name, cfg := range map[string]umbp.Config{
		"Endpoint":       {Endpoint: "http://x"},
		"NumWorkers":     {Endpoint: "/x", NumWorkers: -1},
		"Timeout":        {Endpoint: "/x", Timeout: -time.Second},
		"LookupTimeout":  {Endpoint: "/x", LookupTimeout: -1},
		"StartupTimeout": {Endpoint: "/x", StartupTimeout: -1},
		"TrustedUIDs":    {Endpoint: "/x", TrustedUIDs: []int{-1}},
		"NodeID":         {Endpoint: "/x", NodeID: "\xff"},
		"NodeAddress":    {Endpoint: "/x", NodeAddress: "a\xc3"},
		"Tags":           {Endpoint: "/x", Tags: []string{"ok", "\xfe"}},
	} {
		_, err := umbp.NewStandaloneRuntime(cfg)
		if !errors.Is(err, umbp.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config."+name) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig naming Config.%s", name, err, name)
		}
	}
}

package umbp_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// refusedAddr is a loopback port nothing listens on: one the system gave
// and took back.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// An attach to a master whose port refuses connections fails at once,
// saying so in words, not after StartupTimeout with gRPC's; with another
// replica answering, the attach succeeds and the refusing one is set aside.
func TestClusterAttachRefusedSaidAtOnce(t *testing.T) {
	addr := refusedAddr(t)
	cfg := clusterConfig(t, addr)
	cfg.StartupTimeout = 20 * time.Second // far past the refusal, which comes at once
	rt, err := umbp.NewClusterRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = rt.NewSchedulerHandle(context.Background())
	want := "umbp: attach at " + addr + ": server unavailable: connection refused: nothing listens at this address; start the master, or check the address and its port"
	if err == nil || err.Error() != want {
		t.Errorf("attach to a refused port: %v\nwant %s", err, want)
	}
	if !errors.Is(err, umbp.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("attach to a refused port: %v; want ErrUnavailable, not a deadline", err)
	}

	m := umbptest.NewMaster(t, umbptest.MasterOptions{ReaperInterval: -1})
	cfg.Masters = []string{addr, m.Addr()}
	h := newClusterHandle(t, cfg)
	if got := h.Lookup(context.Background(), []string{"k"}); len(got) != 1 || got[0] {
		t.Errorf("lookup through the replica that answers: %v", got)
	}
	if s := h.State(); s != umbp.StateConnected {
		t.Errorf("state %v with one replica answering", s)
	}
}

package umbp_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/testcert"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp"
)

// tlsMaster answers BatchLookup: every key named "held" is found.
type tlsMaster struct {
	umbppb.UnimplementedUMBPMasterServer
}

func (tlsMaster) BatchLookup(_ context.Context, req *umbppb.BatchLookupRequest) (*umbppb.BatchLookupResponse, error) {
	found := make([]bool, len(req.GetKeys()))
	for i, k := range req.GetKeys() {
		found[i] = k == "held"
	}
	return &umbppb.BatchLookupResponse{Found: found}, nil
}

// A master behind TLS is reached with the config's credentials, and a
// plaintext handle does not get through.
func TestClusterTransportCredentials(t *testing.T) {
	cert, pool := testcert.New(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
	umbppb.RegisterUMBPMasterServer(srv, tlsMaster{})
	go srv.Serve(lis)
	defer srv.Stop()

	cfg := clusterConfig(t, lis.Addr().String())
	cfg.TransportCredentials = credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	h := newClusterHandle(t, cfg)
	if got := h.Lookup(context.Background(), []string{"held", "x"}); !equalBools(got, true, false) {
		t.Errorf("Lookup over TLS = %v", got)
	}

	plain := clusterConfig(t, lis.Addr().String())
	plain.StartupTimeout = 200 * time.Millisecond
	rt, err := umbp.NewClusterRuntime(plain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.NewSchedulerHandle(context.Background()); err == nil {
		t.Error("a plaintext handle attached to a TLS master")
	}

	// With credentials, an address that is not loopback is accepted.
	remote := umbp.ClusterConfig{Masters: []string{"10.1.2.3:50051"}, TransportCredentials: cfg.TransportCredentials}
	if _, err := umbp.NewClusterRuntime(remote); err != nil {
		t.Errorf("NewClusterRuntime with TLS to a remote address = %v", err)
	}
	if _, err := umbp.NewClusterRuntime(umbp.ClusterConfig{Masters: []string{"no-port"}}); !errors.Is(err, umbp.ErrInvalidConfig) {
		t.Errorf("NewClusterRuntime without a port = %v", err)
	}
}

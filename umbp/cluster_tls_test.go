package umbp_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"

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

// selfSigned returns a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "master"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// A master behind TLS is reached with the config's credentials, and a
// plaintext handle does not get through.
func TestClusterTransportCredentials(t *testing.T) {
	cert, pool := selfSigned(t)
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

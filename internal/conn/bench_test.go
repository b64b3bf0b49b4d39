package conn

import (
	"context"
	"fmt"
	"testing"

	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// benchConn connects to a fresh Go server.
func benchConn(b *testing.B) *Conn {
	b.Helper()
	srv := startServer(b, server.Options{Capacity: 64 << 20})
	return dial(b, srv.Endpoint())
}

// BenchmarkPing compares a Ping through the Conn with one through the bare
// generated client on the same connection.
func BenchmarkPing(b *testing.B) {
	c := benchConn(b)
	ctx := context.Background()
	b.Run("Conn", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Ping(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Raw", func(b *testing.B) {
		raw := c.Raw()
		for b.Loop() {
			if _, err := raw.Ping(ctx, &umbppb.Empty{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkBatchExists1024 looks up 1024 keys of 64 hex digits, half of
// them stored.
func BenchmarkBatchExists1024(b *testing.B) {
	c := benchConn(b)
	ctx := context.Background()
	const n = 1024
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", uint64(i)*0x9e3779b97f4a7c15)
	}
	r := hostRegion(b, c, n*64)
	segs := make([]Segment, n/2)
	for i := range segs {
		segs[i] = r.seg(i*64, 64)
	}
	if got, err := joined(c.BatchPut(ctx, keys[:n/2], segs)); err != nil || !got[0] {
		b.Fatalf("BatchPut: %v", err)
	}
	b.Run("Conn", func(b *testing.B) {
		for b.Loop() {
			got, err := joined(c.BatchExists(ctx, keys))
			if err != nil || !got[0] || got[n-1] {
				b.Fatal(err)
			}
		}
	})
	b.Run("Raw", func(b *testing.B) {
		raw := c.Raw()
		for b.Loop() {
			resp, err := raw.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: keys})
			if err != nil || len(resp.GetOk()) != n {
				b.Fatal(err)
			}
		}
	})
}

package conn

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// call is one request the fake received.
type call struct {
	method string
	req    proto.Message
	// deadline reports whether the request's context had a deadline.
	deadline bool
	// contentType is the request's content-type header.
	contentType string
}

// handler answers method; a nil reply and nil error mean "the default".
type handler func(ctx context.Context, method string, req proto.Message) (proto.Message, error)

// fake is an in-test umbp.UMBPStandalone server over a real Unix socket,
// with an fd-handoff listener beside it. It records every request and
// answers with defaults (ready, ok, all true) unless a handler says more.
type fake struct {
	umbppb.UnimplementedUMBPStandaloneServer

	mu      sync.Mutex
	calls   []call
	regs    []fdpass.Registration
	handle  handler
	fdReply int32
	v1      bool // answer ranged calls with Unimplemented

	srv      *grpc.Server
	fdLis    net.Listener
	wg       sync.WaitGroup
	endpoint string
	dir      string
}

// shortDir returns a temporary directory with a path short enough for
// socket addresses.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "umbp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func startFake(t testing.TB) *fake {
	t.Helper()
	return startFakeVersion(t, 2)
}

// startFakeVersion starts a fake speaking protocol version 1 or 2.
func startFakeVersion(t testing.TB, version int) *fake {
	t.Helper()
	f := &fake{dir: shortDir(t), v1: version == 1}
	f.serve(t)
	return f
}

// serve starts (or restarts) the servers on f.dir.
func (f *fake) serve(t testing.TB) {
	t.Helper()
	grpcPath := filepath.Join(f.dir, "n.grpc.sock")
	_, fdPath, err := fdpass.SocketPaths(grpcPath)
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(grpcPath)
	_ = os.Remove(fdPath)
	lis, err := net.Listen("unix", grpcPath)
	if err != nil {
		t.Fatal(err)
	}
	fdLis, err := net.Listen("unix", fdPath)
	if err != nil {
		t.Fatal(err)
	}
	f.endpoint = "unix://" + grpcPath
	f.srv = grpc.NewServer(grpc.MaxRecvMsgSize(256 << 20))
	f.fdLis = fdLis
	umbppb.RegisterUMBPStandaloneServer(f.srv, f)
	srv := f.srv
	f.wg.Add(2)
	go func() { defer f.wg.Done(); _ = srv.Serve(lis) }()
	go func() { defer f.wg.Done(); f.acceptFDs(fdLis) }()
	t.Cleanup(f.stop)
}

// stop stops the servers; idempotent.
func (f *fake) stop() {
	f.srv.Stop()
	_ = f.fdLis.Close()
	f.wg.Wait()
}

func (f *fake) acceptFDs(lis net.Listener) {
	for {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		uc := c.(*net.UnixConn)
		reg, file, err := fdpass.Receive(uc, time.Now().Add(5*time.Second))
		f.mu.Lock()
		status := f.fdReply
		if err == nil {
			f.regs = append(f.regs, reg)
		}
		f.mu.Unlock()
		if err != nil {
			status = fdpass.StatusFailed
		} else {
			_ = file.Close()
		}
		_ = fdpass.Reply(uc, status, time.Now().Add(5*time.Second))
		_ = uc.Close()
	}
}

func (f *fake) setHandler(h handler) {
	f.mu.Lock()
	f.handle = h
	f.mu.Unlock()
}

// take returns and forgets the recorded calls.
func (f *fake) take() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fake) registrations() []fdpass.Registration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fdpass.Registration(nil), f.regs...)
}

func (f *fake) do(ctx context.Context, method string, req proto.Message, def func() proto.Message) (proto.Message, error) {
	_, hasDeadline := ctx.Deadline()
	var ct string
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("content-type")) > 0 {
		ct = md.Get("content-type")[0]
	}
	f.mu.Lock()
	f.calls = append(f.calls, call{method: method, req: proto.Clone(req), deadline: hasDeadline, contentType: ct})
	h := f.handle
	f.mu.Unlock()
	if h != nil {
		resp, err := h(ctx, method, req)
		if resp != nil || err != nil {
			return resp, err
		}
	}
	return def(), nil
}

// reply converts a generic answer to the method's reply type; a reply of the
// wrong type is a test bug.
func reply[T proto.Message](m proto.Message, err error) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	r, ok := m.(T)
	if !ok {
		return zero, errors.New("fake: handler returned the wrong reply type")
	}
	return r, nil
}

func okBool() proto.Message { return &umbppb.BoolResponse{Ok: true} }

func allTrue(n int) func() proto.Message {
	return func() proto.Message {
		ok := make([]bool, n)
		for i := range ok {
			ok[i] = true
		}
		return &umbppb.BatchBoolResponse{Ok: ok}
	}
}

func (f *fake) Ping(ctx context.Context, r *umbppb.Empty) (*umbppb.PingResponse, error) {
	return reply[*umbppb.PingResponse](f.do(ctx, "Ping", r, func() proto.Message {
		return &umbppb.PingResponse{Ready: true, DeploymentMode: umbppb.StandaloneBackendMode_STANDALONE_BACKEND_LOCAL, SupportsRangedIo: !f.v1}
	}))
}

func (f *fake) Put(ctx context.Context, r *umbppb.PutRequest) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "Put", r, okBool))
}

func (f *fake) Get(ctx context.Context, r *umbppb.GetRequest) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "Get", r, okBool))
}

func (f *fake) BatchPut(ctx context.Context, r *umbppb.BatchDataRequest) (*umbppb.BatchBoolResponse, error) {
	return reply[*umbppb.BatchBoolResponse](f.do(ctx, "BatchPut", r, allTrue(len(r.Keys))))
}

func (f *fake) BatchGet(ctx context.Context, r *umbppb.BatchDataRequest) (*umbppb.BatchBoolResponse, error) {
	return reply[*umbppb.BatchBoolResponse](f.do(ctx, "BatchGet", r, allTrue(len(r.Keys))))
}

func (f *fake) BatchPutRanges(ctx context.Context, r *umbppb.BatchRangeDataRequest) (*umbppb.BatchBoolResponse, error) {
	if f.v1 {
		return f.UnimplementedUMBPStandaloneServer.BatchPutRanges(ctx, r)
	}
	return reply[*umbppb.BatchBoolResponse](f.do(ctx, "BatchPutRanges", r, allTrue(len(r.Keys))))
}

func (f *fake) BatchGetRanges(ctx context.Context, r *umbppb.BatchRangeDataRequest) (*umbppb.BatchBoolResponse, error) {
	if f.v1 {
		return f.UnimplementedUMBPStandaloneServer.BatchGetRanges(ctx, r)
	}
	return reply[*umbppb.BatchBoolResponse](f.do(ctx, "BatchGetRanges", r, allTrue(len(r.Keys))))
}

func (f *fake) Exists(ctx context.Context, r *umbppb.KeyRequest) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "Exists", r, okBool))
}

func (f *fake) BatchExists(ctx context.Context, r *umbppb.BatchKeysRequest) (*umbppb.BatchBoolResponse, error) {
	return reply[*umbppb.BatchBoolResponse](f.do(ctx, "BatchExists", r, allTrue(len(r.Keys))))
}

func (f *fake) BatchExistsConsecutive(ctx context.Context, r *umbppb.BatchKeysRequest) (*umbppb.CountResponse, error) {
	return reply[*umbppb.CountResponse](f.do(ctx, "BatchExistsConsecutive", r, func() proto.Message {
		return &umbppb.CountResponse{Count: uint64(len(r.Keys))}
	}))
}

func (f *fake) Clear(ctx context.Context, r *umbppb.Empty) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "Clear", r, okBool))
}

func (f *fake) Flush(ctx context.Context, r *umbppb.Empty) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "Flush", r, okBool))
}

func (f *fake) RegisterMemory(ctx context.Context, r *umbppb.RegisterMemoryRequest) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "RegisterMemory", r, okBool))
}

func (f *fake) DeregisterMemory(ctx context.Context, r *umbppb.DeregisterMemoryRequest) (*umbppb.Empty, error) {
	return reply[*umbppb.Empty](f.do(ctx, "DeregisterMemory", r, func() proto.Message { return &umbppb.Empty{} }))
}

func (f *fake) ReportExternalKvBlocks(ctx context.Context, r *umbppb.StandaloneExternalKvMutationRequest) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "ReportExternalKvBlocks", r, okBool))
}

func (f *fake) RevokeExternalKvBlocks(ctx context.Context, r *umbppb.StandaloneExternalKvMutationRequest) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "RevokeExternalKvBlocks", r, okBool))
}

func (f *fake) RevokeAllExternalKvBlocksAtTier(ctx context.Context, r *umbppb.StandaloneExternalKvTierRequest) (*umbppb.BoolResponse, error) {
	return reply[*umbppb.BoolResponse](f.do(ctx, "RevokeAllExternalKvBlocksAtTier", r, okBool))
}

func (f *fake) MatchExternalKv(ctx context.Context, r *umbppb.StandaloneMatchExternalKvRequest) (*umbppb.StandaloneMatchExternalKvResponse, error) {
	return reply[*umbppb.StandaloneMatchExternalKvResponse](f.do(ctx, "MatchExternalKv", r, func() proto.Message {
		return &umbppb.StandaloneMatchExternalKvResponse{}
	}))
}

func (f *fake) GetExternalKvHitCounts(ctx context.Context, r *umbppb.StandaloneExternalKvHitCountsRequest) (*umbppb.StandaloneExternalKvHitCountsResponse, error) {
	return reply[*umbppb.StandaloneExternalKvHitCountsResponse](f.do(ctx, "GetExternalKvHitCounts", r, func() proto.Message {
		resp := &umbppb.StandaloneExternalKvHitCountsResponse{}
		for i, h := range r.Hashes {
			resp.Entries = append(resp.Entries, &umbppb.StandaloneExternalKvHitCountEntry{Hash: h, HitCountTotal: uint64(i)})
		}
		return resp
	}))
}

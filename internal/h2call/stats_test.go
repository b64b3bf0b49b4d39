package h2call

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// recorder is a stats.Handler that writes down what it is shown, per call
// and per connection. Its TagRPC adds outgoing metadata, as otelgrpc's does
// to propagate a trace.
type recorder struct {
	mu    sync.Mutex
	calls [][]string
	conns []string
}

type callID struct{}

func (r *recorder) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, []string{fmt.Sprintf("TagRPC %s failfast=%v", info.FullMethodName, info.FailFast)})
	ctx = metadata.AppendToOutgoingContext(ctx, "x-tagged", "yes")
	return context.WithValue(ctx, callID{}, len(r.calls)-1)
}

func (r *recorder) HandleRPC(ctx context.Context, s stats.RPCStats) {
	var e string
	switch s := s.(type) {
	case *stats.Begin:
		e = fmt.Sprintf("Begin client=%v failfast=%v client-stream=%v server-stream=%v retry=%v time=%v",
			s.Client, s.FailFast, s.IsClientStream, s.IsServerStream, s.IsTransparentRetryAttempt, !s.BeginTime.IsZero())
	case *stats.OutHeader:
		e = fmt.Sprintf("OutHeader client=%v method=%s authority=%s header=%v compression=%q addrs=%v",
			s.Client, s.FullMethod, s.Authority, mdString(s.Header), s.Compression, s.RemoteAddr != nil && s.LocalAddr != nil)
	case *stats.OutPayload:
		e = fmt.Sprintf("OutPayload client=%v len=%d compressed=%d wire=%d payload=%v time=%v",
			s.Client, s.Length, s.CompressedLength, s.WireLength, s.Payload != nil, !s.SentTime.IsZero())
	case *stats.InHeader:
		e = fmt.Sprintf("InHeader client=%v wire=%d header=%v compression=%q", s.Client, s.WireLength, mdString(s.Header), s.Compression)
	case *stats.InPayload:
		e = fmt.Sprintf("InPayload client=%v len=%d compressed=%d wire=%d payload=%v time=%v",
			s.Client, s.Length, s.CompressedLength, s.WireLength, s.Payload != nil, !s.RecvTime.IsZero())
	case *stats.InTrailer:
		e = fmt.Sprintf("InTrailer client=%v wire=%d trailer=%v", s.Client, s.WireLength, mdString(s.Trailer))
	case *stats.End:
		e = fmt.Sprintf("End client=%v status=%v trailer=%v times=%v", s.Client, status.Convert(s.Error), mdString(s.Trailer),
			!s.BeginTime.IsZero() && !s.EndTime.Before(s.BeginTime))
	case *stats.DelayedPickComplete:
		return // a grpc-go channel's wait for its first connection
	default:
		e = fmt.Sprintf("%T", s)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id := ctx.Value(callID{}).(int)
	r.calls[id] = append(r.calls[id], e)
}

func (r *recorder) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns = append(r.conns, fmt.Sprintf("TagConn addrs=%v", info.RemoteAddr != nil && info.LocalAddr != nil))
	return ctx
}

func (r *recorder) HandleConn(_ context.Context, s stats.ConnStats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns = append(r.conns, fmt.Sprintf("%T client=%v", s, s.IsClient()))
}

func (r *recorder) snapshot() ([][]string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls := make([][]string, len(r.calls))
	for i, c := range r.calls {
		calls[i] = slices.Clone(c)
	}
	return calls, slices.Clone(r.conns)
}

// A stats.Handler sees each call of the lock-step client as it sees
// grpc-go's: the same events with the same sizes, metadata and statuses,
// and the connection's begin and end. grpc-go emits its InHeader and
// InTrailer from its reader goroutine, so their order against the caller's
// events varies: the events are compared as sets, and the lock-step
// client's order is checked on its own.
func TestStatsHandlerAsGRPC(t *testing.T) {
	path := standalone(t, 10)
	var lr, gr recorder
	const ua = "umbp-go-test"
	c := lockstep(t, Options{Dial: unixDial(path), StatsHandler: &lr, UserAgent: ua + " grpc-go/" + grpc.Version})
	cc := stub(t, "unix://"+path, grpc.WithStatsHandler(&gr), grpc.WithUserAgent(ua))
	calls := []call{
		exists("found", heldKey(0), "x"),
		exists("trailers-only error", "fail/5/nothing"),
		exists("error after headers", "headers-then-fail/9/precondition"),
		exists("metadata", "metadata"),
		// Not an unknown method: grpc-go's server answers it before
		// reading the request, and whether grpc-go's client then reports
		// an OutPayload, and an End with the status or without, depends
		// on which of its goroutines runs first.
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-out", "1")
	for _, k := range calls {
		req, _ := proto.Marshal(k.req)
		_ = c.Invoke(ctx, k.method, req, k.resp())
		_ = cc.Invoke(ctx, k.method, k.req, k.resp())
	}
	_ = c.Close()
	_ = cc.Close()
	lcalls, lconns := lr.snapshot()
	gcalls, gconns := gr.snapshot()
	if len(lcalls) != len(calls) || len(gcalls) != len(calls) {
		t.Fatalf("%d and %d calls tagged for %d", len(lcalls), len(gcalls), len(calls))
	}
	for i, k := range calls {
		l, g := lcalls[i], gcalls[i]
		if !slices.Equal(sorted(l), sorted(g)) {
			t.Errorf("%s: lock-step's events:\n\t%s\ngrpc-go's:\n\t%s", k.name, join(l), join(g))
		}
		order := []string{"TagRPC", "Begin", "OutHeader", "OutPayload", "InHeader", "InPayload", "InTrailer", "End"}
		var kinds []string
		for _, e := range l {
			kinds = append(kinds, e[:len(e)-len(trimKind(e))])
		}
		if !slices.IsSortedFunc(kinds, func(a, b string) int { return slices.Index(order, a) - slices.Index(order, b) }) || kinds[0] != "TagRPC" || kinds[len(kinds)-1] != "End" {
			t.Errorf("%s: lock-step's events out of order: %v", k.name, kinds)
		}
	}
	// The metadata TagRPC added went out: the server echoed it.
	if e := lcalls[3][4]; !strings.Contains(e, `x-echo=["yes"]`) {
		t.Errorf("the metadata added by TagRPC was not sent: %s", e)
	}
	want := []string{"TagConn addrs=true", "*stats.ConnBegin client=true", "*stats.ConnEnd client=true"}
	if !slices.Equal(lconns, want) || !slices.Equal(gconns, want) {
		t.Errorf("connection events: lock-step %v, grpc-go %v", lconns, gconns)
	}
}

// mdString writes md out in full, keys sorted (MD's String hides values).
func mdString(md metadata.MD) string {
	keys := slices.Sorted(maps.Keys(md))
	out := "{"
	for _, k := range keys {
		out += fmt.Sprintf("%s=%q ", k, md[k])
	}
	return out + "}"
}

// trimKind returns e without its first word.
func trimKind(e string) string {
	for i := range e {
		if e[i] == ' ' {
			return e[i:]
		}
	}
	return ""
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func join(s []string) string {
	out := ""
	for i, e := range s {
		if i > 0 {
			out += "\n\t"
		}
		out += e
	}
	return out
}

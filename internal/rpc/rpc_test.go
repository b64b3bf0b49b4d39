package rpc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func TestErrorClasses(t *testing.T) {
	bg := context.Background()
	for _, tc := range []struct {
		name   string
		err    error
		closed bool
		want   []error
		not    []error
	}{
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), false, []error{errdefs.ErrUnavailable}, []error{errdefs.ErrClosed, ErrBadReply}},
		{"unimplemented", status.Error(codes.Unimplemented, "unknown method"), false, []error{ErrUnimplemented}, []error{errdefs.ErrUnavailable}},
		{"reply too large", status.Error(codes.ResourceExhausted, TooLargeMessage+" (9 vs. 8)"), false, []error{ErrBadReply}, []error{errdefs.ErrUnavailable}},
		{"server's own resource exhausted", status.Error(codes.ResourceExhausted, "pool full"), false, nil, []error{ErrBadReply, errdefs.ErrUnavailable}},
		{"internal", status.Error(codes.Internal, "boom"), false, nil, []error{ErrBadReply, errdefs.ErrUnavailable, ErrUnimplemented}},
		{"closed by the caller", status.Error(codes.Canceled, "context canceled"), true, []error{errdefs.ErrClosed, errdefs.ErrUnavailable}, nil},
		{"channel closing", status.Error(codes.Canceled, closingMessage), false, []error{errdefs.ErrClosed, errdefs.ErrUnavailable}, nil},
		{"deadline without one on ctx", status.Error(codes.DeadlineExceeded, "server's"), false, nil, []error{context.DeadlineExceeded}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Error(bg, "Op", tc.err, tc.closed)
			if !strings.HasPrefix(err.Error(), "Op: ") {
				t.Errorf("%q does not name the operation first", err)
			}
			if status.Code(err) != status.Code(tc.err) {
				t.Errorf("status code %v, want %v", status.Code(err), status.Code(tc.err))
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("%q does not match %v", err, w)
				}
			}
			for _, w := range tc.not {
				if errors.Is(err, w) {
					t.Errorf("%q matches %v", err, w)
				}
			}
		})
	}
}

// A call cut off by its context says so once: gRPC's own copy of the
// context's error is in the chain, not in the text.
func TestErrorSaysTheContextOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	err := Error(ctx, "RegisterMemory", status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error()), false)
	if got := err.Error(); got != "RegisterMemory: context deadline exceeded" {
		t.Fatalf("text %q", got)
	}
	if !errors.Is(err, context.DeadlineExceeded) || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("%v: chain lost the cause or the status", err)
	}
	// A deadline that passed on the server's side while ctx still had
	// one: the caller's deadline, said once.
	dctx, dcancel := context.WithTimeout(context.Background(), time.Hour)
	defer dcancel()
	err = Error(dctx, "Get", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false)
	if got := err.Error(); got != "Get: context deadline exceeded" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("server-side deadline: %q", got)
	}
	// Where gRPC says something else, it is kept.
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	err = Error(cctx, "Get", status.Error(codes.Unavailable, "connection reset"), false)
	if got := err.Error(); !strings.Contains(got, "context canceled") || !strings.Contains(got, "connection reset") {
		t.Fatalf("cancelled with another cause: %q", got)
	}
}

func TestCut(t *testing.T) {
	wire := func(ws ...int) func(int) Cost {
		return func(i int) Cost { return Cost{Wire: ws[i], Ranges: 1, Bytes: uint64(ws[i])} }
	}
	for _, tc := range []struct {
		name string
		k    Cutter
		ws   []int
		want []Span
	}{
		{"none", Cutter{Limit: 10}, nil, []Span{{0, 0}}},
		{"fits", Cutter{Limit: 10}, []int{3, 3, 3}, []Span{{0, 3}}},
		{"by the limit", Cutter{Limit: 10}, []int{4, 4, 4, 4}, []Span{{0, 2}, {2, 4}}},
		{"fixed counts", Cutter{Limit: 10, Fixed: 2}, []int{4, 4, 4}, []Span{{0, 2}, {2, 3}}},
		{"by ranges", Cutter{Limit: 100, PartRanges: 2}, []int{1, 1, 1, 1, 1}, []Span{{0, 2}, {2, 4}, {4, 5}}},
		{"by bytes", Cutter{Limit: 100, PartBytes: 5}, []int{3, 3, 1, 9, 1}, []Span{{0, 2}, {2, 4}, {4, 5}}},
	} {
		got, err := tc.k.Cut(len(tc.ws), wire(tc.ws...))
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v %v, want %v", tc.name, got, err, tc.want)
		}
	}
	_, err := Cutter{Op: "Put", Limit: 10, Fixed: 2}.Cut(2, wire(3, 9))
	if !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), "entry 1 needs 11 bytes") {
		t.Fatalf("an entry too large alone: %v", err)
	}
}

// EncodeKeys writes what proto.Marshal writes, part by part, and names a
// key it refuses.
func TestEncodeKeys(t *testing.T) {
	keys := []string{"alpha", "beta", "gamma", "delta"}
	for _, limit := range []int{MaxMessageSize, 14} {
		k, err := EncodeKeys("lookup", 1, keys, limit)
		if err != nil {
			t.Fatal(err)
		}
		if k.N != len(keys) || (limit == MaxMessageSize) != (len(k.Parts) == 1) {
			t.Fatalf("limit %d: %d keys in %d parts", limit, k.N, len(k.Parts))
		}
		for i, s := range Spans(k) {
			want, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: keys[s.Start:s.End]})
			if got := Part(k, s).Bytes(); string(got) != string(want) {
				t.Fatalf("limit %d part %d: %x, want %x", limit, i, got, want)
			}
		}
		k.Free()
	}
	for _, tc := range []struct {
		keys []string
		want string
	}{
		{[]string{"a", ""}, "key 1 is empty"},
		{[]string{"a", "b", "\xff"}, `key 2 ("\xff") is not valid UTF-8`},
	} {
		_, err := EncodeKeys("lookup", 1, tc.keys, MaxMessageSize)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.keys, err, tc.want)
		}
	}
}

// EncodeAskable leaves out the keys EncodeKeys refuses, and says where the
// others are.
func TestEncodeAskable(t *testing.T) {
	for _, tc := range []struct {
		keys []string
		ask  []string
		at   []int // nil: every key asked about
	}{
		{[]string{"a", "b"}, []string{"a", "b"}, nil},
		{[]string{"a", "", "b", "\xff", "c"}, []string{"a", "b", "c"}, []int{0, 2, 4}},
		{[]string{"\xff", "a"}, []string{"a"}, []int{1}},
		{[]string{"", "\xff"}, nil, []int{}},
		{[]string{"a", strings.Repeat("k", MaxKeyBytes+1), "b"}, []string{"a", "b"}, []int{0, 2}},
		{[]string{strings.Repeat("k", MaxKeyBytes)}, []string{strings.Repeat("k", MaxKeyBytes)}, nil},
	} {
		k, err := EncodeAskable("lookup", 1, tc.keys, MaxMessageSize)
		if err != nil {
			t.Fatalf("%q: %v", tc.keys, err)
		}
		if k.N != len(tc.ask) || (tc.at == nil) != (k.At == nil) || !slices.Equal(k.At, tc.at) {
			t.Fatalf("%q: %d keys at %v, want %d at %v", tc.keys, k.N, k.At, len(tc.ask), tc.at)
		}
		if k.N > 0 {
			want, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: tc.ask})
			if got := Part(k, Span{0, k.N}).Bytes(); string(got) != string(want) {
				t.Fatalf("%q: %x, want %x", tc.keys, got, want)
			}
		}
		k.Free()
	}
	// A key too large for the limit is not a key left out.
	if _, err := EncodeAskable("lookup", 1, []string{"a", strings.Repeat("x", 100)}, 50); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a key over the limit: %v", err)
	}
}

// FuzzEncodeAskable: whatever the keys, the encoding asks about exactly
// those that can be asked about (not empty, at most MaxKeyBytes, UTF-8),
// in order, byte for byte as proto.Marshal writes them, and At says where
// each is.
func FuzzEncodeAskable(f *testing.F) {
	f.Add("a\x00b\x00\xff\x00\x00c", 0)
	f.Add("k", MaxKeyBytes+1)
	f.Fuzz(func(t *testing.T, joined string, longAt int) {
		keys := strings.Split(joined, "\x00")
		if longAt >= 0 && longAt < len(keys) {
			keys[longAt] = strings.Repeat("k", MaxKeyBytes+1)
		}
		k, err := EncodeAskable("lookup", 1, keys, MaxMessageSize)
		if err != nil {
			t.Fatalf("%q: %v", keys, err)
		}
		defer k.Free()
		var ask []string
		var at []int
		for i, key := range keys {
			if key != "" && len(key) <= MaxKeyBytes && utf8.ValidString(key) {
				ask, at = append(ask, key), append(at, i)
			}
		}
		if k.N != len(ask) {
			t.Fatalf("%q: %d keys asked, want %d", keys, k.N, len(ask))
		}
		if k.At == nil {
			if len(ask) != len(keys) {
				t.Fatalf("%q: At nil with keys left out", keys)
			}
		} else if !slices.Equal(k.At, at) {
			t.Fatalf("%q: At %v, want %v", keys, k.At, at)
		}
		if k.N > 0 {
			want, _ := proto.Marshal(&umbppb.BatchKeysRequest{Keys: ask})
			if got := Part(k, Span{0, k.N}).Bytes(); string(got) != string(want) {
				t.Fatalf("%q: encoded %x, want %x", keys, got, want)
			}
		}
	})
}

package rpc

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/umbp-go/umbp-go/internal/encoded"
)

// EncodeKeys encodes keys as op's request, a message whose field is the
// repeated string of keys, on the caller's goroutine, cut into requests of
// at most limit bytes: the call that sends them reads only the encoded
// bytes. An empty key, or one that is not UTF-8 (which the encoder refuses),
// fails the whole batch with an ErrInvalidArgument that names it; nothing
// is encoded then.
func EncodeKeys(op string, field protowire.Number, keys []string, limit int) (encoded.Keys, error) {
	total := 0
	for i, k := range keys {
		if k == "" {
			return encoded.Keys{}, Invalid(op, "key %d is empty", i)
		}
		total += len(k)
	}
	spans := []Span{{0, len(keys)}}
	// A key costs its bytes, a tag and a length of at most 10 bytes; keys
	// that fit one message, as lookups almost always do, are not cut one
	// by one.
	if total+len(keys)*(1+binary.MaxVarintLen64) > limit {
		var err error
		spans, err = Cutter{Op: op, Limit: limit}.Cut(len(keys), func(i int) Cost { return Cost{Wire: BytesField(len(keys[i]))} })
		if err != nil {
			return encoded.Keys{}, err
		}
	}
	out := encoded.Keys{N: len(keys), Parts: make([]encoded.Part, 0, len(spans))}
	for _, s := range spans {
		m, err := encoded.Strings(field, keys[s.Start:s.End])
		if err != nil {
			out.Free()
			var bad *encoded.NotUTF8Error
			if errors.As(err, &bad) {
				i := s.Start + bad.Index
				return encoded.Keys{}, Invalid(op, "key %d (%q) is not valid UTF-8", i, keys[i])
			}
			return encoded.Keys{}, Invalid(op, "%v", err)
		}
		out.Parts = append(out.Parts, encoded.Part{Start: s.Start, End: s.End, Msg: m})
	}
	return out, nil
}

// Spans returns the spans of k's parts.
func Spans(k encoded.Keys) []Span {
	if len(k.Parts) == 1 {
		return []Span{{k.Parts[0].Start, k.Parts[0].End}}
	}
	out := make([]Span, len(k.Parts))
	for i, p := range k.Parts {
		out[i] = Span{p.Start, p.End}
	}
	return out
}

// Part returns the part of k that carries s.
func Part(k encoded.Keys, s Span) *encoded.Message {
	i, _ := slices.BinarySearchFunc(k.Parts, s.Start, func(p encoded.Part, start int) int { return cmp.Compare(p.Start, start) })
	return k.Parts[i].Msg
}

// encodedCall are the options of a call that sends an encoded request: as
// the generated stub's, and the encoded message sent as it is.
var encodedCall = []grpc.CallOption{grpc.StaticMethod(), encoded.CallOption}

// InvokeEncoded calls method on cc with the encoded request msg, which it
// sends as it is (and frees once sent), and decodes the answer into reply.
func InvokeEncoded(ctx context.Context, cc grpc.ClientConnInterface, method string, msg *encoded.Message, reply any) error {
	return cc.Invoke(ctx, method, msg, reply, encodedCall...)
}

package rpc

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/encoded"
)

// EncodeKeys encodes keys as op's request, a message whose field is the
// repeated string of keys, on the caller's goroutine, cut into requests of
// at most limit bytes: the call that sends them reads only the encoded
// bytes. An empty key, one over MaxKeyBytes, or one that is not UTF-8
// (which the encoder refuses), fails the whole batch with an ErrInvalidArgument that names it; nothing
// is encoded then.
func EncodeKeys(op string, field protowire.Number, keys []string, limit int) (encoded.Keys, error) {
	k, _, err := encodeKeys(op, field, keys, limit)
	return k, err
}

// EncodeAskable is EncodeKeys for a lookup that answers a key it cannot ask
// about (empty, over MaxKeyBytes, not UTF-8) as a miss: such keys are left out, and the
// result's At says where the others are in keys. A batch of such keys
// only is no keys (N 0); its At is empty, not nil.
func EncodeAskable(op string, field protowire.Number, keys []string, limit int) (encoded.Keys, error) {
	k, bad, err := encodeKeys(op, field, keys, limit)
	if bad < 0 {
		return k, err
	}
	// A key that cannot be asked about, found by the encoder, which reads
	// every key anyway: the batch is encoded again without such keys.
	ask := make([]string, 0, len(keys)-1)
	at := make([]int, 0, len(keys)-1)
	for i, key := range keys {
		if key != "" && len(key) <= MaxKeyBytes && utf8.ValidString(key) {
			ask = append(ask, key)
			at = append(at, i)
		}
	}
	if len(ask) == 0 {
		return encoded.Keys{At: at}, nil
	}
	if k, _, err = encodeKeys(op, field, ask, limit); err != nil {
		return encoded.Keys{}, err
	}
	k.At = at
	return k, nil
}

// encodeKeys is EncodeKeys; bad is the index of the key that failed the
// batch, -1 when none did.
func encodeKeys(op string, field protowire.Number, keys []string, limit int) (_ encoded.Keys, bad int, _ error) {
	total := 0
	for i, k := range keys {
		switch {
		case k == "":
			return encoded.Keys{}, i, Invalid(op, "key %d is empty", i)
		case len(k) > MaxKeyBytes:
			return encoded.Keys{}, i, Invalid(op, "key %d is %d bytes, over the %d-byte limit", i, len(k), MaxKeyBytes)
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
			return encoded.Keys{}, -1, err
		}
	}
	out := encoded.Keys{N: len(keys), Parts: make([]encoded.Part, 0, len(spans))}
	for _, s := range spans {
		m, err := encoded.Strings(field, keys[s.Start:s.End])
		if err != nil {
			out.Free()
			var notUTF8 *encoded.NotUTF8Error
			if errors.As(err, &notUTF8) {
				i := s.Start + notUTF8.Index
				return encoded.Keys{}, i, Invalid(op, "key %d (%q) is not valid UTF-8", i, keys[i])
			}
			return encoded.Keys{}, -1, Invalid(op, "%v", err)
		}
		out.Parts = append(out.Parts, encoded.Part{Start: s.Start, End: s.End, Msg: m})
	}
	return out, -1, nil
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

// TryInvoker makes a lock-step call when it can at once, and reports
// whether it did (internal/h2call's Client; a nil *h2call.Client never
// does).
type TryInvoker interface {
	TryInvoke(ctx context.Context, method string, req []byte, resp proto.Message) (sent bool, err error)
}

// InvokeLookup is the one switch between a lookup's two call paths, for a
// standalone server's and a master's alike: lock-step on a connection of
// lockStep free now, else (every one busy, or lockStep a nil client:
// GRPCLookups) through the gRPC channel cc, which takes many calls at once
// on its one connection. Either way msg is sent (or freed) once. A
// lock-step call that could not go out fails as it is, and is not sent
// through cc: the lock-step connections go only to the server the
// connection attached to, while cc may reach another at the same address.
func InvokeLookup(ctx context.Context, lockStep TryInvoker, cc grpc.ClientConnInterface, method string, msg *encoded.Message, reply proto.Message) error {
	if sent, err := lockStep.TryInvoke(ctx, method, msg.Bytes(), reply); sent {
		msg.Free()
		return err
	}
	return InvokeEncoded(ctx, cc, method, msg, reply)
}

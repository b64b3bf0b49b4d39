package conn

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"slices"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// EncodeKeys encodes keys for BatchExists and BatchExistsConsecutive, cut
// to fit the message limit, on the caller's goroutine: the call that sends
// them reads only the encoded bytes. An empty key, or one that is not UTF-8
// (which the encoder refuses), fails the whole batch with an
// ErrInvalidArgument that names it; nothing is encoded then.
func EncodeKeys(keys []string) (encoded.Keys, error) {
	const op = "lookup"
	total := 0
	for i, k := range keys {
		if k == "" {
			return encoded.Keys{}, invalid(op, "key %d is empty", i)
		}
		total += len(k)
	}
	spans := []span{{0, len(keys)}}
	// A key costs its bytes, a tag and a length of at most 10 bytes; keys
	// that fit one message, as lookups almost always do, are not cut one
	// by one.
	if total+len(keys)*(1+binary.MaxVarintLen64) > maxRequestBytes {
		var err error
		spans, err = cutter{op: op}.cut(len(keys), func(i int) entryCost { return entryCost{wire: bytesField(len(keys[i]))} })
		if err != nil {
			return encoded.Keys{}, err
		}
	}
	out := encoded.Keys{N: len(keys), Parts: make([]encoded.Part, 0, len(spans))}
	for _, s := range spans {
		m, err := encoded.Strings(keysField, keys[s.start:s.end])
		if err != nil {
			out.Free()
			var bad *encoded.NotUTF8Error
			if errors.As(err, &bad) {
				i := s.start + bad.Index
				return encoded.Keys{}, invalid(op, "key %d (%q) is not valid UTF-8", i, keys[i])
			}
			return encoded.Keys{}, invalid(op, "%v", err)
		}
		out.Parts = append(out.Parts, encoded.Part{Start: s.start, End: s.end, Msg: m})
	}
	return out, nil
}

// keysField is BatchKeysRequest's keys.
const keysField = 1

// part returns the part of k that carries s.
func part(k encoded.Keys, s span) *encoded.Message {
	i, _ := slices.BinarySearchFunc(k.Parts, s.start, func(p encoded.Part, start int) int { return cmp.Compare(p.Start, start) })
	return k.Parts[i].Msg
}

// spans returns the spans of k's parts.
func spans(k encoded.Keys) []span {
	if len(k.Parts) == 1 {
		return []span{{k.Parts[0].Start, k.Parts[0].End}}
	}
	out := make([]span, len(k.Parts))
	for i, p := range k.Parts {
		out[i] = span{p.Start, p.End}
	}
	return out
}

// BatchExistsEncoded reports, for each key of k in order, whether the server holds it.
// Results and errors are as for BatchPut. It sends each part of k at most
// once; a part not sent is freed.
func (c *Conn) BatchExistsEncoded(ctx context.Context, k encoded.Keys) (ok []bool, errs []error) {
	const op = "BatchExists"
	defer k.Free()
	if err := c.usable(op); err != nil {
		return make([]bool, k.N), failAll(k.N, err)
	}
	if k.N == 0 {
		return []bool{}, nil
	}
	return c.run(ctx, op, k.N, spans(k), 1, func(ctx context.Context, s span) ([]bool, error) {
		resp := new(umbppb.BatchBoolResponse)
		if err := c.cc.Invoke(ctx, umbppb.UMBPStandalone_BatchExists_FullMethodName, part(k, s), resp, encodedCall...); err != nil {
			return nil, c.rpcError(ctx, op, err)
		}
		return resp.GetOk(), nil
	})
}

// BatchExistsConsecutiveEncoded returns how many leading keys of k the server holds.
// On an error the count covers the keys answered before it.
func (c *Conn) BatchExistsConsecutiveEncoded(ctx context.Context, k encoded.Keys) (int, error) {
	const op = "BatchExistsConsecutive"
	defer k.Free()
	if err := c.usable(op); err != nil {
		return 0, err
	}
	total := 0
	for _, p := range k.Parts {
		resp := new(umbppb.CountResponse)
		if err := c.cc.Invoke(ctx, umbppb.UMBPStandalone_BatchExistsConsecutive_FullMethodName, p.Msg, resp, encodedCall...); err != nil {
			return total, c.rpcError(ctx, op, err)
		}
		n := p.End - p.Start
		got := resp.GetCount()
		if got > uint64(n) {
			return total, badReply(op, "count %d for %d keys", got, n)
		}
		total += int(got)
		if int(got) < n {
			break
		}
	}
	return total, nil
}

// encodedCall are the options of a call that sends an encoded request: as
// the generated stub's, and the encoded message sent as it is.
var encodedCall = []grpc.CallOption{grpc.StaticMethod(), encoded.CallOption}

// BatchExists is EncodeKeys and BatchExistsEncoded.
func (c *Conn) BatchExists(ctx context.Context, keys []string) (ok []bool, errs []error) {
	k, err := EncodeKeys(keys)
	if err != nil {
		return make([]bool, len(keys)), failAll(len(keys), err)
	}
	return c.BatchExistsEncoded(ctx, k)
}

// BatchExistsConsecutive is EncodeKeys and BatchExistsConsecutiveEncoded.
func (c *Conn) BatchExistsConsecutive(ctx context.Context, keys []string) (int, error) {
	k, err := EncodeKeys(keys)
	if err != nil {
		return 0, err
	}
	return c.BatchExistsConsecutiveEncoded(ctx, k)
}

// Clear drops every object of every engine on the server; registrations
// stay. A false answer with a reason is an error wrapping ErrRefused.
func (c *Conn) Clear(ctx context.Context) (bool, error) {
	const op = "Clear"
	if err := c.usable(op); err != nil {
		return false, err
	}
	resp, err := c.raw.Clear(ctx, &umbppb.Empty{})
	if err != nil {
		return false, c.rpcError(ctx, op, err)
	}
	return boolReply(op, resp)
}

// Flush asks the server to persist its pending tiers. A false answer with a
// reason is an error wrapping ErrRefused.
func (c *Conn) Flush(ctx context.Context) (bool, error) {
	const op = "Flush"
	if err := c.usable(op); err != nil {
		return false, err
	}
	resp, err := c.raw.Flush(ctx, &umbppb.Empty{})
	if err != nil {
		return false, c.rpcError(ctx, op, err)
	}
	return boolReply(op, resp)
}

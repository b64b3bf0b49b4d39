package conn

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/rpc"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// EncodeKeys encodes keys for BatchExists and BatchExistsConsecutive, cut
// to fit the message limit, on the caller's goroutine (rpc.EncodeKeys): the
// call that sends them reads only the encoded bytes. An empty key, or one
// that is not UTF-8, fails the whole batch with an ErrInvalidArgument that
// names it; nothing is encoded then.
func EncodeKeys(keys []string) (encoded.Keys, error) {
	return rpc.EncodeKeys("lookup", keysField, keys, maxRequestBytes)
}

// EncodeAskable is EncodeKeys leaving out the keys that cannot be asked
// about (rpc.EncodeAskable).
func EncodeAskable(keys []string) (encoded.Keys, error) {
	return rpc.EncodeAskable("lookup", keysField, keys, maxRequestBytes)
}

// keysField is BatchKeysRequest's keys.
const keysField = 1

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
	return c.run(ctx, op, k.N, rpc.Spans(k), 1, func(ctx context.Context, s rpc.Span) ([]bool, error) {
		resp := new(umbppb.BatchBoolResponse)
		if err := c.invokeLookup(ctx, umbppb.UMBPStandalone_BatchExists_FullMethodName, rpc.Part(k, s), resp); err != nil {
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
		if err := c.invokeLookup(ctx, umbppb.UMBPStandalone_BatchExistsConsecutive_FullMethodName, p.Msg, resp); err != nil {
			return total, c.rpcError(ctx, op, err)
		}
		n := p.End - p.Start
		got := resp.GetCount()
		if got > uint64(n) {
			return total, rpc.BadReply(op, "count %d for %d keys", got, n)
		}
		total += int(got)
		if int(got) < n {
			break
		}
	}
	return total, nil
}

// invokeLookup sends the encoded lookup msg (rpc.InvokeLookup).
func (c *Conn) invokeLookup(ctx context.Context, method string, msg *encoded.Message, resp proto.Message) error {
	return rpc.InvokeLookup(ctx, c.lookups, c.cc, method, msg, resp)
}

// LockStepLookups reports whether the lookups are lock-step calls
// (Options.GRPCLookups not set): each ends when its context does, its
// connection interrupted, so that its caller may make it itself, bounded by
// its context, instead of on a goroutine it can walk away from.
func (c *Conn) LockStepLookups() bool { return c.lookups != nil }

// ProbeLookup asks BatchExists (BatchExistsConsecutive when consecutive) of
// no key, as a lookup goes, and returns once the server answers (or the
// call fails, or ctx ends): it tells when a server that let a lookup
// overrun answers lookups again.
func (c *Conn) ProbeLookup(ctx context.Context, consecutive bool) error {
	op, method := "BatchExists", umbppb.UMBPStandalone_BatchExists_FullMethodName
	var resp proto.Message = new(umbppb.BatchBoolResponse)
	if consecutive {
		op, method = "BatchExistsConsecutive", umbppb.UMBPStandalone_BatchExistsConsecutive_FullMethodName
		resp = new(umbppb.CountResponse)
	}
	if err := c.usable(op); err != nil {
		return err
	}
	var err error
	if c.lookups != nil {
		err = c.lookups.Invoke(ctx, method, nil, resp)
	} else {
		err = c.cc.Invoke(ctx, method, new(umbppb.BatchKeysRequest), resp)
	}
	if err != nil {
		return c.rpcError(ctx, op, err)
	}
	return nil
}

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

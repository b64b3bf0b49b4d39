package conn

import (
	"context"
	"encoding/binary"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// keySpans validates keys (unless checked says the caller did) and cuts
// them to fit the message limit. Keys that fit one message, as lookups
// almost always do, are sized in one pass without a per-key cut.
func keySpans(op string, keys []string, checked bool) ([]span, error) {
	total := 0
	for i, k := range keys {
		if !checked {
			if err := checkKey(op, i, k); err != nil {
				return nil, err
			}
		}
		total += len(k)
	}
	// A key costs its bytes, a tag and a length of at most 10 bytes.
	if total+len(keys)*(1+binary.MaxVarintLen64) <= maxRequestBytes {
		return []span{{0, len(keys)}}, nil
	}
	return cutter{op: op}.cut(len(keys), func(i int) entryCost { return entryCost{wire: bytesField(len(keys[i]))} })
}

// BatchExists reports, for each key in order, whether the server holds it.
// Results and errors are as for BatchPut. With checked, the keys are not
// checked here: the caller has left out empty ones, and a key that is not
// UTF-8 fails its whole request before anything is sent (the encoder
// refuses it), which the caller may then ask again without it.
func (c *Conn) BatchExists(ctx context.Context, keys []string, checked bool) (ok []bool, errs []error) {
	const op = "BatchExists"
	n := len(keys)
	if err := c.usable(op); err != nil {
		return make([]bool, n), failAll(n, err)
	}
	if n == 0 {
		return []bool{}, nil
	}
	spans, err := keySpans(op, keys, checked)
	if err != nil {
		return make([]bool, n), failAll(n, err)
	}
	return c.run(ctx, op, n, spans, 1, func(ctx context.Context, s span) ([]bool, error) {
		resp, err := c.raw.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: keys[s.start:s.end]})
		if err != nil {
			return nil, c.rpcError(ctx, op, err)
		}
		return resp.GetOk(), nil
	})
}

// BatchExistsConsecutive returns how many leading keys the server holds.
// On an error the count covers the keys answered before it. checked is as
// for BatchExists.
func (c *Conn) BatchExistsConsecutive(ctx context.Context, keys []string, checked bool) (int, error) {
	const op = "BatchExistsConsecutive"
	if err := c.usable(op); err != nil {
		return 0, err
	}
	spans, err := keySpans(op, keys, checked)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, s := range spans {
		resp, err := c.raw.BatchExistsConsecutive(ctx, &umbppb.BatchKeysRequest{Keys: keys[s.start:s.end]})
		if err != nil {
			return total, c.rpcError(ctx, op, err)
		}
		got := resp.GetCount()
		if got > uint64(s.len()) {
			return total, badReply(op, "count %d for %d keys", got, s.len())
		}
		total += int(got)
		if int(got) < s.len() {
			break
		}
	}
	return total, nil
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

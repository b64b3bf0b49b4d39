package rpc

import "google.golang.org/protobuf/encoding/protowire"

// A batch goes to a server as consecutive requests, cut by Cutter.Cut and
// nowhere else: by the message limit and, for ranged transfers, into parts
// of a number of ranges or bytes. Each entry of a batch gets the answer of
// the request that carried it.

// Span is the half-open range [Start, End) of a batch's entries that one
// request carries.
type Span struct{ Start, End int }

// Len is the number of entries the span carries.
func (s Span) Len() int { return s.End - s.Start }

// Cost is what an entry adds to a request: its encoded bytes and, for the
// part limits, its ranges and object bytes.
type Cost struct {
	Wire   int
	Ranges int
	Bytes  uint64
}

// Cutter says how a batch is cut: Fixed is what a request spends outside
// its entries; Limit the most a request may take (MaxMessageSize, or less
// in tests); PartRanges and PartBytes, when not zero, close a request once
// it holds that many ranges or bytes.
type Cutter struct {
	Op         string
	Fixed      int
	Limit      int
	PartRanges int
	PartBytes  uint64
}

// Cut cuts n entries into consecutive spans. A span closes before an entry
// that would take its request past Limit, and after the entry that brings
// it to PartRanges ranges or PartBytes bytes. An entry that cannot fit a
// request alone is an ErrInvalidArgument. No entry is a span of none.
func (k Cutter) Cut(n int, cost func(i int) Cost) ([]Span, error) {
	parts := k.PartRanges > 0 || k.PartBytes > 0
	var spans []Span
	start, used, ranges, bytes := 0, k.Fixed, 0, uint64(0)
	for i := range n {
		ci := cost(i)
		if k.Fixed+ci.Wire > k.Limit {
			return nil, Invalid(k.Op, "entry %d needs %d bytes of request, more than the %d-byte message limit", i, k.Fixed+ci.Wire, k.Limit)
		}
		if used+ci.Wire > k.Limit {
			spans = append(spans, Span{start, i})
			start, used, ranges, bytes = i, k.Fixed, 0, 0
		}
		used += ci.Wire
		ranges += ci.Ranges
		bytes += ci.Bytes
		if parts && (k.PartRanges > 0 && ranges >= k.PartRanges || k.PartBytes > 0 && bytes >= k.PartBytes) {
			spans = append(spans, Span{start, i + 1})
			start, used, ranges, bytes = i+1, k.Fixed, 0, 0
		}
	}
	if n > start || n == 0 {
		spans = append(spans, Span{start, n})
	}
	return spans, nil
}

// Encoded sizes, computed per entry so that a batch is cut without
// marshalling it. Every field numbered below 16 has a one-byte tag.

// BytesField is the size of a string or bytes field holding n bytes.
func BytesField(n int) int { return 1 + protowire.SizeBytes(n) }

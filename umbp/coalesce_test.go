package umbp

import (
	"slices"
	"testing"

	"github.com/umbp-go/umbp-go/internal/conn"
)

func TestCoalesce(t *testing.T) {
	// r is a range of region base at off, of size, at object offset obj.
	r := func(base, off, size, obj uint64) conn.Range {
		return conn.Range{RegionBase: base, Offset: off, Size: size, ObjectOffset: obj}
	}
	for _, tc := range []struct {
		name string
		in   []conn.Range
		want []conn.Range
	}{
		{"none", nil, nil},
		{"one", []conn.Range{r(1, 0, 8, 0)}, []conn.Range{r(1, 0, 8, 0)}},
		{"contiguous", []conn.Range{r(1, 0, 8, 0), r(1, 8, 8, 8), r(1, 16, 4, 16)}, []conn.Range{r(1, 0, 20, 0)}},
		{"contiguous, listed out of order", []conn.Range{r(1, 16, 4, 16), r(1, 0, 8, 0), r(1, 8, 8, 8)}, []conn.Range{r(1, 0, 20, 0)}},
		{"gap in memory", []conn.Range{r(1, 0, 8, 0), r(1, 16, 8, 8)}, []conn.Range{r(1, 0, 8, 0), r(1, 16, 8, 8)}},
		{"another region", []conn.Range{r(1, 0, 8, 0), r(2, 8, 8, 8)}, []conn.Range{r(1, 0, 8, 0), r(2, 8, 8, 8)}},
		{"reversed in memory", []conn.Range{r(1, 8, 8, 0), r(1, 0, 8, 8)}, []conn.Range{r(1, 8, 8, 0), r(1, 0, 8, 8)}},
		{
			"layer-major, two runs",
			[]conn.Range{r(1, 0, 4, 0), r(1, 4, 4, 4), r(1, 64, 4, 8), r(1, 68, 4, 12)},
			[]conn.Range{r(1, 0, 8, 0), r(1, 64, 8, 8)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := coalesce(slices.Clone(tc.in))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("coalesce(%v) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestCoalesceNoAllocs(t *testing.T) {
	rs := make([]conn.Range, 64)
	for i := range rs {
		rs[i] = conn.Range{RegionBase: 1, Offset: uint64(i) * 4096, Size: 4096, ObjectOffset: uint64(i) * 4096}
	}
	buf := make([]conn.Range, len(rs))
	if n := testing.AllocsPerRun(100, func() {
		copy(buf, rs)
		coalesce(buf)
	}); n != 0 {
		t.Fatalf("coalesce allocates %v times", n)
	}
}

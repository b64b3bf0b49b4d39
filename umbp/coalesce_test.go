package umbp

import (
	"errors"
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

func TestCutParts(t *testing.T) {
	obj := func(ranges int, size uint64) conn.Object {
		return conn.Object{Size: size, Ranges: make([]conn.Range, ranges)}
	}
	var objs []conn.Object
	q := partRanges * 300 / 1024 // 3 of these fall short of a part, 4 make one
	for range 10 {
		objs = append(objs, obj(q, 1<<20))
	}
	for range 3 {
		objs = append(objs, obj(1, 16<<20))
	}
	objs = append(objs, obj(2*partRanges, 1))
	// Objects 8-11 close on bytes (2 MiB, then 16 more twice); 12 and 13 on
	// ranges; the last part is what is left.
	want := []part{{0, 4}, {4, 8}, {8, 12}, {12, 14}}
	if got := cutParts(objs); !slices.Equal(got, want) {
		t.Fatalf("cutParts = %v, want %v", got, want)
	}
	if got := cutParts(objs[:1]); !slices.Equal(got, []part{{0, 1}}) {
		t.Fatalf("one object: %v", got)
	}
}

func TestPartsError(t *testing.T) {
	ps := []part{{0, 3}, {3, 5}, {5, 9}}
	plain := errors.New("part 1 failed")
	inner := errors.New("the second half of part 2 failed")
	errs := []error{nil, plain, &conn.BatchError{Spans: []conn.SpanError{{Start: 2, End: 4, Err: inner}}}}
	err := partsError(ps, errs)
	for i, want := range []error{nil, nil, nil, plain, plain, nil, nil, inner, inner} {
		if got := conn.ErrFor(err, i); got != want {
			t.Errorf("item %d: %v, want %v", i, got, want)
		}
	}
	if !errors.Is(err, plain) || !errors.Is(err, inner) {
		t.Errorf("errors.Is misses a part's error: %v", err)
	}
	if err := partsError(ps, make([]error, 3)); err != nil {
		t.Errorf("no failed part: %v", err)
	}
}

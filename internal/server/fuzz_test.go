package server

import (
	"encoding/binary"
	"testing"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// FuzzRangedPlan decodes arbitrary ranged requests: rangedShape must never
// panic and must accept exactly the well-shaped ones, and tiles must agree
// with a byte-by-byte coverage count.
func FuzzRangedPlan(f *testing.F) {
	f.Add([]byte{2, 1, 1, 0, 0, 4, 0, 4, 4, 8}, true)
	f.Add([]byte{1, 2, 0, 0, 0, 4, 4, 0, 0, 8}, false)
	f.Add([]byte{3, 0, 1, 2, 5, 5, 5, 5, 5, 5, 5, 5}, true)
	f.Fuzz(func(t *testing.T, data []byte, put bool) {
		next := func() uint64 {
			if len(data) == 0 {
				return 0
			}
			v := uint64(data[0])
			data = data[1:]
			return v
		}
		req := &umbppb.BatchRangeDataRequest{ClientId: "f"}
		nKeys := int(next() % 5)
		for range nKeys {
			req.Keys = append(req.Keys, "k")
			req.RangeCounts = append(req.RangeCounts, uint32(next()%4))
		}
		nRanges := int(next() % 10)
		for range nRanges {
			req.ShmOffsets = append(req.ShmOffsets, next())
			req.RegionBases = append(req.RegionBases, 0)
			req.Sizes = append(req.Sizes, next()%9)
			req.ObjectOffsets = append(req.ObjectOffsets, next()%17)
		}
		// Sometimes break one array's length.
		switch next() % 6 {
		case 1:
			req.Sizes = append(req.Sizes, 1)
		case 2:
			if len(req.ObjectOffsets) > 0 {
				req.ObjectOffsets = req.ObjectOffsets[1:]
			}
		}
		if put {
			for range nKeys {
				req.ObjectSizes = append(req.ObjectSizes, next()%20)
			}
		} else if next()%7 == 0 {
			req.ObjectSizes = []uint64{1}
		}
		if len(data) >= 4 && data[0] == 0xff {
			req.RangeCounts = append(req.RangeCounts, binary.LittleEndian.Uint32(data))
		}

		starts, ok := rangedShape(req, put)
		var sum uint64
		for _, c := range req.RangeCounts {
			sum += uint64(c)
		}
		m := uint64(len(req.ShmOffsets))
		wantOK := len(req.RangeCounts) == len(req.Keys) && sum == m &&
			len(req.Sizes) == int(m) && len(req.ObjectOffsets) == int(m) && len(req.RegionBases) == int(m) &&
			(put && len(req.ObjectSizes) == len(req.Keys) || !put && len(req.ObjectSizes) == 0)
		if ok != wantOK {
			t.Fatalf("rangedShape = %v, want %v for %v", ok, wantOK, req)
		}
		if !ok || !put {
			return
		}
		for i := range req.Keys {
			a, b := starts[i], starts[i+1]
			offs, sizes, objSize := req.ObjectOffsets[a:b], req.Sizes[a:b], req.ObjectSizes[i]
			if got, want := tiles(offs, sizes, objSize), tilesSlow(offs, sizes, objSize); got != want {
				t.Fatalf("tiles(%v, %v, %d) = %v, want %v", offs, sizes, objSize, got, want)
			}
		}
	})
}

// tilesSlow counts coverage byte by byte (small objects only).
func tilesSlow(offs, sizes []uint64, objSize uint64) bool {
	if len(offs) == 0 || objSize == 0 {
		return false
	}
	cover := make([]int, objSize)
	for i := range offs {
		if sizes[i] == 0 || offs[i]+sizes[i] > objSize {
			return false
		}
		for b := offs[i]; b < offs[i]+sizes[i]; b++ {
			cover[b]++
		}
	}
	for _, c := range cover {
		if c != 1 {
			return false
		}
	}
	return true
}

func TestTiles(t *testing.T) {
	for _, c := range []struct {
		offs, sizes []uint64
		obj         uint64
		want        bool
	}{
		{[]uint64{0}, []uint64{4}, 4, true},
		{[]uint64{4, 0}, []uint64{4, 4}, 8, true},
		{[]uint64{0, 4}, []uint64{4, 3}, 8, false},
		{[]uint64{0, 3}, []uint64{4, 5}, 8, false},
		{[]uint64{0, 0}, []uint64{4, 4}, 4, false},
		{[]uint64{1}, []uint64{4}, 5, false},
		{[]uint64{0, 4}, []uint64{4, 0}, 4, false},
		{nil, nil, 4, false},
		{[]uint64{0}, []uint64{4}, 0, false},
		{[]uint64{0, 1 << 63, 1 << 63}, []uint64{1 << 63, 1 << 63, 1}, 1<<64 - 1, false},
	} {
		if got := tiles(c.offs, c.sizes, c.obj); got != c.want {
			t.Errorf("tiles(%v, %v, %d) = %v, want %v", c.offs, c.sizes, c.obj, got, c.want)
		}
	}
}

package umbp

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func region(layer string, group int, base uintptr, blocks int, blockBytes, stride uint64) KVRegion {
	return KVRegion{LayerName: layer, GroupID: group, BaseAddress: base, NumBlocks: blocks, BlockBytes: blockBytes, Stride: stride}
}

func TestKVRegionValidate(t *testing.T) {
	ok := region("l0", 0, 0x1000, 4, 64, 128)
	tests := []struct {
		name    string
		mod     func(*KVRegion)
		wantErr string
	}{
		{"valid", func(*KVRegion) {}, ""},
		{"block equals stride", func(r *KVRegion) { r.BlockBytes = 128 }, ""},
		{"sub-blocks", func(r *KVRegion) { r.SubBlocks = 4; r.BlockBytes = 256 }, ""},
		{"one sub-block", func(r *KVRegion) { r.SubBlocks = 1 }, ""},
		{"empty layer", func(r *KVRegion) { r.LayerName = "" }, "LayerName is empty"},
		{"negative group", func(r *KVRegion) { r.GroupID = -1 }, "GroupID -1 is negative"},
		{"zero base", func(r *KVRegion) { r.BaseAddress = 0 }, "BaseAddress is 0"},
		{"zero blocks", func(r *KVRegion) { r.NumBlocks = 0 }, "NumBlocks 0"},
		{"negative blocks", func(r *KVRegion) { r.NumBlocks = -3 }, "NumBlocks -3"},
		{"zero block bytes", func(r *KVRegion) { r.BlockBytes = 0 }, "BlockBytes is 0"},
		{"zero stride", func(r *KVRegion) { r.Stride = 0 }, "Stride is 0"},
		{"block above stride", func(r *KVRegion) { r.BlockBytes = 129 }, "BlockBytes 129 exceeds Stride 128"},
		{"negative sub-blocks", func(r *KVRegion) { r.SubBlocks = -2 }, "SubBlocks -2"},
		{"sub-blocks not dividing", func(r *KVRegion) { r.SubBlocks = 3 }, "BlockBytes 64 is not a multiple of SubBlocks 3"},
		{"chunk above stride", func(r *KVRegion) { r.SubBlocks = 2; r.BlockBytes = 512 }, "= 256 exceeds Stride 128"},
		{"span wraps", func(r *KVRegion) { r.NumBlocks = 1 << 62; r.Stride = 1 << 10 }, "end of the address space"},
		{"end wraps", func(r *KVRegion) { r.BaseAddress = ^uintptr(0) - 100 }, "end of the address space"},
		{"sub-block count overflows", func(r *KVRegion) { r.NumBlocks = 1 << 62; r.SubBlocks = 8; r.BlockBytes = 64 }, "end of the address space"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.mod(&r)
			err := (&KVLayoutDescriptor{Regions: []KVRegion{r}}).Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want ErrInvalidLayout containing %q", err, tt.wantErr)
			}
			if r.LayerName != "" && !strings.Contains(err.Error(), `"l0"`) {
				t.Errorf("error %q does not name the region", err)
			}
		})
	}
}

func TestKVRegionSpan(t *testing.T) {
	r := region("l", 0, 0x1000, 4, 64, 128)
	if got := r.extent(); got != 3*128+64 {
		t.Errorf("Span() = %d", got)
	}
	r.SubBlocks, r.BlockBytes = 2, 128 // 8 physical blocks of 64 bytes
	if got := r.extent(); got != 7*128+64 {
		t.Errorf("Span() with sub-blocks = %d", got)
	}
	if r.chunkBytes() != 64 {
		t.Errorf("chunkBytes() = %d", r.chunkBytes())
	}
}

func TestKVLayoutDescriptorValidate(t *testing.T) {
	tests := []struct {
		name    string
		layout  *KVLayoutDescriptor
		wantErr string
	}{
		{"nil", nil, "no regions"},
		{"empty", &KVLayoutDescriptor{}, "no regions"},
		{"one region", &KVLayoutDescriptor{Regions: []KVRegion{region("l0", 0, 0x1000, 4, 64, 64)}}, ""},
		{"same layer in two groups", &KVLayoutDescriptor{Regions: []KVRegion{
			region("l0", 0, 0x1000, 4, 64, 64), region("l0", 1, 0x9000, 4, 64, 64),
		}}, ""},
		{"duplicate", &KVLayoutDescriptor{Regions: []KVRegion{
			region("l0", 0, 0x1000, 4, 64, 64), region("l1", 0, 0x2000, 4, 64, 64), region("l0", 0, 0x9000, 4, 64, 64),
		}}, `regions 0 and 2 both have LayerName "l0" and GroupID 0`},
		{"bad region", &KVLayoutDescriptor{Regions: []KVRegion{
			region("l0", 0, 0x1000, 4, 64, 64), region("l1", 0, 0x2000, 4, 65, 64),
		}}, `umbp: invalid KV layout: region 1: region "l1" group 0: BlockBytes 65 exceeds Stride 64`},
		{"object size overflows", &KVLayoutDescriptor{Regions: []KVRegion{
			region("l0", 0, 0x1000, 1, 1<<63, 1<<63), region("l1", 0, 0x1000, 1, 1<<63, 1<<63),
		}}, "object size of group 0 overflows at region 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.layout.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want ErrInvalidLayout containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestKVLayoutDescriptorGroups(t *testing.T) {
	l := &KVLayoutDescriptor{Regions: []KVRegion{
		region("a", 2, 0x1000, 4, 64, 64),
		region("b", 0, 0x2000, 4, 32, 64),
		region("c", 2, 0x3000, 4, 16, 64),
		region("d", 5, 0x4000, 4, 8, 64),
	}}
	if got := l.Groups(); !slices.Equal(got, []int{0, 2, 5}) {
		t.Errorf("Groups() = %v", got)
	}
	for g, want := range map[int]uint64{0: 32, 2: 80, 5: 8, 1: 0, -1: 0} {
		if got := l.ObjectSize(g); got != want {
			t.Errorf("ObjectSize(%d) = %d, want %d", g, got, want)
		}
	}
	if got := l.regionsOf(2); len(got) != 2 || got[0].LayerName != "a" || got[1].LayerName != "c" {
		t.Errorf("regionsOf(2) = %+v", got)
	}
	c := l.clone()
	c.Regions[0].LayerName = "changed"
	if l.Regions[0].LayerName != "a" {
		t.Error("Clone shares regions with the original")
	}
	var nilLayout *KVLayoutDescriptor
	if nilLayout.Groups() != nil || nilLayout.ObjectSize(0) != 0 || nilLayout.regionsOf(0) != nil || nilLayout.clone() != nil {
		t.Error("nil layout accessors")
	}
}

package umbp

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// testLayout has two groups: group 0 with a plain region, a region with
// padding between blocks and a region of 4 sub-blocks; group 3 with one
// region.
func testLayout() *KVLayoutDescriptor {
	return &KVLayoutDescriptor{Regions: []KVRegion{
		region("k0", 0, 0x10000, 8, 64, 64),
		region("v0", 0, 0x20000, 8, 32, 48),
		{LayerName: "mla1", GroupID: 0, BaseAddress: 0x30000, NumBlocks: 8, BlockBytes: 64, Stride: 16, SubBlocks: 4},
		region("ssm", 3, 0x40000, 2, 100, 128),
	}}
}

func mustPlanner(t testing.TB, l *KVLayoutDescriptor) *LayoutPlanner {
	t.Helper()
	p, err := NewLayoutPlanner(l)
	if err != nil {
		t.Fatalf("NewLayoutPlanner: %v", err)
	}
	return p
}

func TestPlanForBlock(t *testing.T) {
	p := mustPlanner(t, testLayout())
	plan, err := p.PlanForBlock("key-5", 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	want := []KVRange{
		{LayerName: "k0", GroupID: 0, BlockID: 5, BaseAddress: 0x10000 + 5*64, Stride: 64, Length: 64, ObjectOffset: 0},
		{LayerName: "v0", GroupID: 0, BlockID: 5, BaseAddress: 0x20000 + 5*48, Stride: 48, Length: 32, ObjectOffset: 64},
		{LayerName: "mla1", GroupID: 0, BlockID: 20, BaseAddress: 0x30000 + 20*16, Stride: 16, Length: 16, ObjectOffset: 96},
		{LayerName: "mla1", GroupID: 0, BlockID: 21, BaseAddress: 0x30000 + 21*16, Stride: 16, Length: 16, ObjectOffset: 112},
		{LayerName: "mla1", GroupID: 0, BlockID: 22, BaseAddress: 0x30000 + 22*16, Stride: 16, Length: 16, ObjectOffset: 128},
		{LayerName: "mla1", GroupID: 0, BlockID: 23, BaseAddress: 0x30000 + 23*16, Stride: 16, Length: 16, ObjectOffset: 144},
	}
	if !slices.Equal(plan.Ranges, want) {
		t.Fatalf("ranges:\n got %+v\nwant %+v", plan.Ranges, want)
	}
	if plan.Key != "key-5" || plan.BlockID != 5 || plan.GroupID != 0 {
		t.Errorf("plan header %+v", plan)
	}
	if plan.ObjectSize() != 160 || p.objectSize(0) != 160 || testLayout().ObjectSize(0) != 160 {
		t.Errorf("object sizes: plan %d planner %d layout %d", plan.ObjectSize(), p.objectSize(0), testLayout().ObjectSize(0))
	}
	if err := plan.Validate(); err != nil {
		t.Errorf("planner output invalid: %v", err)
	}
	if p.rangesPerBlock(0) != 6 || p.rangesPerBlock(3) != 1 || p.rangesPerBlock(1) != 0 {
		t.Errorf("rangesPerBlock: %d %d %d", p.rangesPerBlock(0), p.rangesPerBlock(3), p.rangesPerBlock(1))
	}
	if p.NumBlocks(0) != 8 || p.NumBlocks(3) != 2 || p.NumBlocks(7) != 0 {
		t.Errorf("NumBlocks: %d %d %d", p.NumBlocks(0), p.NumBlocks(3), p.NumBlocks(7))
	}
	if !slices.Equal(p.groups, []int{0, 3}) {
		t.Errorf("Groups() = %v", p.groups)
	}

	// Every block of every group plans to a valid plan inside its regions.
	for _, g := range p.groups {
		for b := range p.NumBlocks(g) {
			plan, err := p.PlanForBlock(fmt.Sprint("k", g, b), g, b)
			if err != nil {
				t.Fatalf("PlanForBlock(%d, %d): %v", g, b, err)
			}
			if err := plan.Validate(); err != nil {
				t.Fatalf("PlanForBlock(%d, %d) invalid: %v", g, b, err)
			}
			for _, r := range plan.Ranges {
				i := slices.IndexFunc(testLayout().Regions, func(x KVRegion) bool { return x.LayerName == r.LayerName && x.GroupID == g })
				reg := testLayout().Regions[i]
				lo, hi := reg.BaseAddress, reg.BaseAddress+uintptr(reg.extent())
				if r.BaseAddress < lo || r.BaseAddress+uintptr(r.Length) > hi {
					t.Fatalf("range %+v outside region [%#x, %#x)", r, lo, hi)
				}
			}
		}
	}
}

func TestPlanForBlockErrors(t *testing.T) {
	p := mustPlanner(t, testLayout())
	for _, tt := range []struct {
		key          string
		group, block int
		want         string
	}{
		{"k", 1, 0, "group 1 is not in the layout (groups [0 3])"},
		{"k", -1, 0, "group -1 is not in the layout"},
		{"k", 5000, 0, "group 5000 is not in the layout"},
		{"k", 3, 2, `block 2 of group 3 outside [0, 2) (NumBlocks of region "ssm")`},
		{"k", 0, -1, "block -1 of group 0"},
		{"", 0, 0, "empty key"},
	} {
		_, err := p.PlanForBlock(tt.key, tt.group, tt.block)
		if !errors.Is(err, ErrInvalidPlan) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("PlanForBlock(%q, %d, %d) = %v, want ErrInvalidPlan containing %q", tt.key, tt.group, tt.block, err, tt.want)
		}
	}
	if _, err := NewLayoutPlanner(&KVLayoutDescriptor{}); !errors.Is(err, ErrInvalidLayout) {
		t.Errorf("NewLayoutPlanner(empty) = %v", err)
	}
}

func TestPlannerUsesSmallestNumBlocks(t *testing.T) {
	p := mustPlanner(t, &KVLayoutDescriptor{Regions: []KVRegion{
		region("big", 0, 0x1000, 10, 8, 8), region("small", 0, 0x2000, 3, 8, 8),
	}})
	if _, err := p.PlanForBlock("k", 0, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := p.PlanForBlock("k", 0, 3); err == nil || !strings.Contains(err.Error(), `"small"`) {
		t.Fatalf("block 3: %v, want error naming region small", err)
	}
}

func TestPlannerSparseGroups(t *testing.T) {
	l := &KVLayoutDescriptor{Regions: []KVRegion{
		region("a", 1<<20, 0x1000, 2, 8, 8), region("b", 7, 0x2000, 2, 8, 8),
	}}
	p := mustPlanner(t, l)
	for _, g := range []int{1 << 20, 7} {
		if plan, err := p.PlanForBlock("k", g, 1); err != nil || plan.GroupID != g || len(plan.Ranges) != 1 {
			t.Errorf("group %d: %+v, %v", g, plan, err)
		}
	}
	if _, err := p.PlanForBlock("k", 8, 0); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("missing sparse group: %v", err)
	}
}

func TestPlannerCopiesLayout(t *testing.T) {
	l := testLayout()
	p := mustPlanner(t, l)
	l.Regions[0].BaseAddress = 0xdead0000
	plan, _ := p.PlanForBlock("k", 0, 0)
	if plan.Ranges[0].BaseAddress != 0x10000 {
		t.Fatal("planner follows changes to the caller's layout")
	}
	if p.layout.Regions[0].BaseAddress != 0x10000 {
		t.Fatal("the planner's layout is the caller's")
	}
}

func rng(off, length uint64) KVRange {
	return KVRange{LayerName: fmt.Sprint("l", off), BaseAddress: 0x1000 + uintptr(off), Length: length, ObjectOffset: off}
}

func TestBlockTransferPlanValidate(t *testing.T) {
	tests := []struct {
		name    string
		plan    BlockTransferPlan
		wantErr string
	}{
		{"one range", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(0, 10)}}, ""},
		{"in order", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(0, 10), rng(10, 5), rng(15, 1)}}, ""},
		{"out of order", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(15, 1), rng(0, 10), rng(10, 5)}}, ""},
		{"empty key", BlockTransferPlan{Ranges: []KVRange{rng(0, 1)}}, "key is empty"},
		{"bad utf8 key", BlockTransferPlan{Key: "\xff", Ranges: []KVRange{rng(0, 1)}}, "UTF-8"},
		{"negative block", BlockTransferPlan{Key: "k", BlockID: -1, Ranges: []KVRange{rng(0, 1)}}, "BlockID -1"},
		{"negative group", BlockTransferPlan{Key: "k", GroupID: -2, Ranges: []KVRange{rng(0, 1)}}, "GroupID -2"},
		{"no ranges", BlockTransferPlan{Key: "k"}, `key "k": no ranges`},
		{"zero length", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(0, 10), rng(10, 0)}}, `key "k": range 1 (layer "l10", object offset 10, length 0): Length is 0`},
		{"zero base", BlockTransferPlan{Key: "k", Ranges: []KVRange{{Length: 4}}}, "range 0 (layer \"\", object offset 0, length 4): BaseAddress is 0"},
		{"not from zero", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(4, 10)}}, "range 0 (layer \"l4\", object offset 4, length 10): object bytes [0, 4) are not covered"},
		{"gap", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(0, 10), rng(12, 5)}}, "range 1 (layer \"l12\", object offset 12, length 5): gap: object bytes [10, 12) after range 0"},
		{"overlap", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(0, 10), rng(8, 5)}}, "range 1 (layer \"l8\", object offset 8, length 5): overlaps range 0, which ends at object offset 10"},
		{"duplicate offset", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(0, 10), rng(10, 5), rng(0, 10)}}, "range 2 (layer \"l0\", object offset 0, length 10): overlaps range 0"},
		{"unsorted gap", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(20, 1), rng(0, 10)}}, "range 0 (layer \"l20\", object offset 20, length 1): gap: object bytes [10, 20) after range 1"},
		{"offset overflow", BlockTransferPlan{Key: "k", Ranges: []KVRange{rng(0, 10), {BaseAddress: 1, ObjectOffset: 10, Length: ^uint64(0) - 5}}}, "object offset + length overflows"},
		{"address overflow", BlockTransferPlan{Key: "k", Ranges: []KVRange{{BaseAddress: ^uintptr(0) - 1, Length: 4}}}, "passes the end of the address space"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := slices.Clone(tt.plan.Ranges)
			err := tt.plan.Validate()
			if !slices.Equal(before, tt.plan.Ranges) {
				t.Fatal("Validate reordered the ranges")
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidPlan) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v\nwant ErrInvalidPlan containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestBlockTransferPlanValidateNoAllocs(t *testing.T) {
	p := mustPlanner(t, testLayout())
	plan, _ := p.PlanForBlock("k", 0, 1)
	if n := testing.AllocsPerRun(100, func() { _ = plan.Validate() }); n != 0 {
		t.Fatalf("Validate of an ordered plan allocates %v times", n)
	}
}

// FuzzPlanValidate checks Validate against a byte-coverage model: a plan
// whose ranges have non-zero base and length is valid exactly when every
// byte of [0, sum of lengths) is covered by exactly one range.
func FuzzPlanValidate(f *testing.F) {
	f.Add([]byte{0, 10, 10, 5})
	f.Add([]byte{10, 5, 0, 10})
	f.Add([]byte{0, 10, 8, 5})
	f.Add([]byte{0, 10, 12, 5})
	f.Add([]byte{15, 1, 0, 10, 10, 5})
	f.Add([]byte{0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		// Each range is 2 bytes: object offset and length. Small values keep
		// the model cheap and still reach every ordering, gap and overlap.
		var ranges []KVRange
		for i := 0; i+2 <= len(data) && len(ranges) < 64; i += 2 {
			ranges = append(ranges, KVRange{BaseAddress: 0x1000, ObjectOffset: uint64(data[i]), Length: uint64(data[i+1])})
		}
		plan := BlockTransferPlan{Key: "fuzz", Ranges: ranges}
		err := plan.Validate()

		want := len(ranges) > 0
		total := plan.ObjectSize()
		cover := make([]uint8, total)
		for _, r := range ranges {
			if r.Length == 0 {
				want = false
				break
			}
			for b := r.ObjectOffset; b < r.ObjectOffset+r.Length; b++ {
				if b >= total {
					want = false
					break
				}
				cover[b]++
			}
		}
		if want {
			for _, c := range cover {
				if c != 1 {
					want = false
					break
				}
			}
		}
		if want != (err == nil) {
			t.Fatalf("ranges %+v: Validate() = %v, model says valid=%v", ranges, err, want)
		}
		if err != nil && (!errors.Is(err, ErrInvalidPlan) || !strings.Contains(err.Error(), `"fuzz"`)) {
			t.Fatalf("error %v does not match ErrInvalidPlan or name the key", err)
		}
	})
}

func TestPlanBlocks(t *testing.T) {
	p := mustPlanner(t, testLayout())
	blocks := []Block{{Key: "a", BlockID: 1}, {Key: "b", GroupID: 3}, {Key: "c", BlockID: 7}}
	plans, bad := p.planBlocks(blocks)
	if bad != nil {
		t.Fatal(bad)
	}
	for i, plan := range plans {
		want, err := p.PlanForBlock(blocks[i].Key, blocks[i].GroupID, blocks[i].BlockID)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Key != want.Key || plan.BlockID != want.BlockID || plan.GroupID != want.GroupID ||
			!slices.Equal(plan.Ranges, want.Ranges) {
			t.Errorf("block %d: %+v, want %+v", i, plan, want)
		}
		if cap(plan.Ranges) != len(plan.Ranges) {
			t.Errorf("block %d: ranges share capacity with the next plan", i)
		}
	}
	if n, bad := p.planBlocks(nil); bad != nil || len(n) != 0 {
		t.Fatalf("no blocks: %v, %v", n, bad)
	}
}

// A block the planner cannot plan fails alone, with an error naming it;
// the others are planned.
func TestPlanBlocksErrors(t *testing.T) {
	p := mustPlanner(t, testLayout())
	blocks := []Block{
		{Key: "ok"},
		{Key: ""},
		{Key: "neg-block", BlockID: -1},
		{Key: "neg-group", GroupID: -4},
		{Key: "missing", GroupID: 2},
		{Key: "far", BlockID: 8},
		{Key: "ok2", BlockID: 1},
	}
	want := []string{"", "empty key for group 0 block 0", `key "neg-block": block -1 of group 0 outside [0, 8)`,
		`key "neg-group": group -4 is not in the layout`, `key "missing": group 2 is not in the layout`,
		`key "far": block 8 of group 0 outside [0, 8)`, ""}
	plans, bad := p.planBlocks(blocks)
	for i, w := range want {
		switch {
		case w == "" && (bad[i] != nil || len(plans[i].Ranges) == 0):
			t.Errorf("block %d: %v, %d ranges", i, bad[i], len(plans[i].Ranges))
		case w != "" && (!errors.Is(bad[i], ErrInvalidPlan) || !strings.Contains(bad[i].Error(), w) || plans[i].Ranges != nil):
			t.Errorf("block %d: %v, want ErrInvalidPlan containing %q", i, bad[i], w)
		}
	}
}

func BenchmarkPlanForBlock(b *testing.B) {
	// 32 layers of K and V in one group: 64 ranges per block.
	var l KVLayoutDescriptor
	for i := range 32 {
		for j, kv := range []string{"k", "v"} {
			l.Regions = append(l.Regions, region(fmt.Sprintf("layer.%d.%s", i, kv), 0,
				uintptr(0x10000000*(2*i+j+1)), 1024, 16384, 16384))
		}
	}
	p := mustPlanner(b, &l)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := p.PlanForBlock("key", 0, i&1023); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlanBlocks(b *testing.B) {
	var l KVLayoutDescriptor
	for i := range 32 {
		l.Regions = append(l.Regions, region(fmt.Sprintf("layer.%d", i), 0, uintptr(0x10000000*(i+1)), 1024, 32768, 32768))
	}
	p := mustPlanner(b, &l)
	blocks := make([]Block, 256)
	for i := range blocks {
		blocks[i] = Block{Key: fmt.Sprint("key", i), BlockID: i}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, bad := p.planBlocks(blocks); bad != nil {
			b.Fatal(bad)
		}
	}
}

func BenchmarkPlanValidate(b *testing.B) {
	var l KVLayoutDescriptor
	for i := range 64 {
		l.Regions = append(l.Regions, region(fmt.Sprint("l", i), 0, uintptr(0x10000000*(i+1)), 16, 4096, 4096))
	}
	plan, err := mustPlanner(b, &l).PlanForBlock("key", 0, 3)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := plan.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

package umbp

import (
	"errors"
	"strings"
	"testing"
)

func TestRankTopologyValidate(t *testing.T) {
	big := 1 << 40
	tests := []struct {
		name    string
		topo    RankTopology
		wantErr string // substring; "" means valid
	}{
		{"zero value is one rank", RankTopology{}, ""},
		{"explicit ones", RankTopology{TPSize: 1, PPSize: 1, PCPSize: 1, DCPSize: 1}, ""},
		{"last ranks", RankTopology{TPRank: 7, TPSize: 8, PPRank: 1, PPSize: 2, PCPRank: 2, PCPSize: 3, DCPRank: 3, DCPSize: 4}, ""},
		{"tp rank at size", RankTopology{TPRank: 2, TPSize: 2}, "TPRank 2 outside [0, 2)"},
		{"tp rank with zero size", RankTopology{TPRank: 1}, "TPRank 1 outside [0, 1)"},
		{"negative tp rank", RankTopology{TPRank: -1, TPSize: 4}, "TPRank -1"},
		{"negative tp size", RankTopology{TPSize: -2}, "TPSize -2 is negative"},
		{"negative pp size", RankTopology{PPSize: -1}, "PPSize -1 is negative"},
		{"pp rank", RankTopology{PPRank: 3, PPSize: 3}, "PPRank 3"},
		{"pcp rank", RankTopology{PCPRank: 5, PCPSize: 2}, "PCPRank 5"},
		{"dcp rank", RankTopology{DCPRank: -3}, "DCPRank -3"},
		{"negative dcp size", RankTopology{DCPSize: -7}, "DCPSize -7"},
		{"world size overflow", RankTopology{TPSize: big, PPSize: big}, "overflows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.topo.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want error containing %q", tt.wantErr)
			}
			if !errors.Is(err, ErrInvalidTopology) {
				t.Errorf("error %v does not match ErrInvalidTopology", err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestRankTopologyNormalized(t *testing.T) {
	got := RankTopology{TPRank: 1, TPSize: 2, PPSize: -1}.Normalized()
	want := RankTopology{TPRank: 1, TPSize: 2, PPSize: -1, PCPSize: 1, DCPSize: 1}
	if got != want {
		t.Fatalf("Normalized() = %+v, want %+v", got, want)
	}
	if n := (RankTopology{}).Normalized(); n.WorldSize() != 1 || n.TPSize != 1 || n.PPSize != 1 {
		t.Fatalf("zero topology normalized to %+v", n)
	}
}

func TestRankTopologyAllRanks(t *testing.T) {
	topo := RankTopology{TPRank: 1, TPSize: 2, PPSize: 2, PCPSize: 1, DCPSize: 3}
	all := topo.AllRanks()
	if len(all) != 12 || topo.WorldSize() != 12 {
		t.Fatalf("AllRanks() has %d ranks, WorldSize() = %d; want 12", len(all), topo.WorldSize())
	}
	// PP outermost, then PCP, DCP, TP innermost.
	want := [][4]int{ // pp, pcp, dcp, tp
		{0, 0, 0, 0}, {0, 0, 0, 1}, {0, 0, 1, 0}, {0, 0, 1, 1}, {0, 0, 2, 0}, {0, 0, 2, 1},
		{1, 0, 0, 0}, {1, 0, 0, 1}, {1, 0, 1, 0}, {1, 0, 1, 1}, {1, 0, 2, 0}, {1, 0, 2, 1},
	}
	for i, r := range all {
		got := [4]int{r.PPRank, r.PCPRank, r.DCPRank, r.TPRank}
		if got != want[i] {
			t.Errorf("rank %d = %v, want %v", i, got, want[i])
		}
		if r.TPSize != 2 || r.PPSize != 2 || r.PCPSize != 1 || r.DCPSize != 3 {
			t.Errorf("rank %d sizes not normalized: %+v", i, r)
		}
		if err := r.Validate(); err != nil {
			t.Errorf("rank %d invalid: %v", i, err)
		}
		if r.Index() != i {
			t.Errorf("rank %d Index() = %d", i, r.Index())
		}
	}
	if got := (RankTopology{}).AllRanks(); len(got) != 1 || got[0] != (RankTopology{TPSize: 1, PPSize: 1, PCPSize: 1, DCPSize: 1}) {
		t.Errorf("zero topology AllRanks() = %+v", got)
	}
	if got := (RankTopology{TPSize: -1}).AllRanks(); got != nil {
		t.Errorf("invalid topology AllRanks() = %+v, want nil", got)
	}
	// The receiver's own (even out-of-range) ranks do not matter.
	if got := (RankTopology{TPRank: 9, TPSize: 2}).AllRanks(); len(got) != 2 {
		t.Errorf("AllRanks() with out-of-range own rank = %+v", got)
	}
}

func TestRankTopologyString(t *testing.T) {
	got := RankTopology{TPRank: 1, TPSize: 4, PPRank: 0}.String()
	if want := "tp1/4 pcp0/1 dcp0/1 pp0/1"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

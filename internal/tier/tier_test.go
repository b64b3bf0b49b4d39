package tier

import (
	"testing"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// The tiers are the protocol's values, and say their names.
func TestTiersAreTheProtocols(t *testing.T) {
	for _, c := range []struct {
		t     Tier
		pb    umbppb.TierType
		name  string
		valid bool
	}{
		{HBM, umbppb.TierType_TIER_HBM, "HBM", true},
		{DRAM, umbppb.TierType_TIER_DRAM, "DRAM", true},
		{SSD, umbppb.TierType_TIER_SSD, "SSD", true},
		{0, 0, "Tier(0)", false},
		{4, 4, "Tier(4)", false},
	} {
		if int32(c.t) != int32(c.pb) || c.t.String() != c.name || c.t.Valid() != c.valid {
			t.Errorf("tier %d: %s valid %v; want the protocol's %d, %s, %v", int32(c.t), c.t, c.t.Valid(), int32(c.pb), c.name, c.valid)
		}
	}
}

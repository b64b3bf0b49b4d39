// Package tier is the protocol's storage tiers, once: umbp.Tier and
// umbptest.Tier are this type.
package tier

import "fmt"

// Tier is a storage tier of a node, as the external KV index and the
// master record it. Its values are the protocol's (umbppb.TierType).
type Tier int32

// The tiers, fastest first.
const (
	HBM  Tier = 1
	DRAM Tier = 2
	SSD  Tier = 3
)

// String returns "HBM", "DRAM" or "SSD", or Tier(N) for another value.
func (t Tier) String() string {
	switch t {
	case HBM:
		return "HBM"
	case DRAM:
		return "DRAM"
	case SSD:
		return "SSD"
	}
	return fmt.Sprintf("Tier(%d)", int32(t))
}

// Valid reports whether t is HBM, DRAM or SSD.
func (t Tier) Valid() bool { return t >= HBM && t <= SSD }

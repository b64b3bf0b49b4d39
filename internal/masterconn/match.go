package masterconn

import (
	"fmt"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// NumTiers is the number of tier slots in NodeMatch.PrefixByTier, indexed
// by umbppb.TierType: HBM (1), DRAM (2), SSD (3); slot 0 stays zero.
const NumTiers = 4

// NodeMatch is what one node holds of a request's hashes.
type NodeMatch struct {
	NodeID      string
	PeerAddress string // empty when the master gave none (node not alive)
	// Prefix is the number of leading request hashes the node holds, on
	// any tier; PrefixByTier splits them by the fastest tier the node holds
	// each on (HBM before DRAM before SSD), so they sum to Prefix.
	Prefix       int
	PrefixByTier [NumTiers]int
	// Held is the number of request positions the node holds at all.
	Held int
}

// Match is one node's answer: the master's ExternalKvNodeMatch, or the
// standalone server's StandaloneExternalKvMatch that forwards it.
type Match interface {
	GetNodeId() string
	GetPeerAddress() string
	GetHashesByTier() []*umbppb.TierHashes
}

// CheckMatch checks the master's answer to MatchExternalKv(hashes) and
// reduces it to one NodeMatch per node, in the answer's order. The answer
// is refused (ErrBadReply) if it names more than maxNodes nodes, a node
// twice or with an empty id, a tier that is not HBM, DRAM or SSD, a hash
// that was not asked for, or more hashes in a tier than were asked. Its
// memory is bounded by len(hashes) and the number of nodes, not by what
// the answer claims.
func CheckMatch[M Match](hashes []string, matches []M, maxNodes int) ([]NodeMatch, error) {
	if len(matches) > maxNodes {
		return nil, fmt.Errorf("%w: %d nodes, more than the %d allowed", ErrBadReply, len(matches), maxNodes)
	}
	if len(matches) == 0 {
		return []NodeMatch{}, nil
	}
	// first[i] is the first position of hashes[i]: a hash asked twice is
	// held at both positions or neither.
	index := make(map[string]int32, len(hashes))
	first := make([]int32, len(hashes))
	for i, h := range hashes {
		j, ok := index[h]
		if !ok {
			j = int32(i)
			index[h] = j
		}
		first[i] = j
	}
	// best[j]: the fastest tier the node holds hash j on, 0 for none;
	// reset after each node.
	best := make([]uint8, len(hashes))
	seen := make(map[string]struct{}, len(matches))
	out := make([]NodeMatch, 0, len(matches))
	for n, m := range matches {
		id := m.GetNodeId()
		if id == "" {
			return nil, fmt.Errorf("%w: node %d has no id", ErrBadReply, n)
		}
		if _, dup := seen[id]; dup {
			return nil, fmt.Errorf("%w: node %q named twice", ErrBadReply, id)
		}
		seen[id] = struct{}{}
		var marked []int32 // positions set in best, to reset
		for _, th := range m.GetHashesByTier() {
			tier := th.GetTier()
			if tier < umbppb.TierType_TIER_HBM || tier > umbppb.TierType_TIER_SSD {
				clear(best)
				return nil, fmt.Errorf("%w: node %q: tier %v", ErrBadReply, id, tier)
			}
			if len(th.GetHashes()) > len(hashes) {
				clear(best)
				return nil, fmt.Errorf("%w: node %q: %d hashes on %v for %d asked", ErrBadReply, id, len(th.GetHashes()), tier, len(hashes))
			}
			for _, h := range th.GetHashes() {
				j, ok := index[h]
				if !ok {
					clear(best)
					return nil, fmt.Errorf("%w: node %q: hash %.64q was not asked for", ErrBadReply, id, h)
				}
				switch b := best[j]; {
				case b == 0:
					best[j] = uint8(tier)
					marked = append(marked, j)
				case uint8(tier) < b:
					best[j] = uint8(tier)
				}
			}
		}
		nm := NodeMatch{NodeID: id, PeerAddress: m.GetPeerAddress()}
		prefix := true
		for i := range hashes {
			b := best[first[i]]
			if b == 0 {
				prefix = false
				continue
			}
			nm.Held++
			if prefix {
				nm.Prefix++
				nm.PrefixByTier[b]++
			}
		}
		for _, j := range marked {
			best[j] = 0
		}
		out = append(out, nm)
	}
	return out, nil
}

package umbp

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/tier"
)

// Tier is a storage tier of a node, as the external KV index records it:
// TierHBM, TierDRAM or TierSSD (the protocol's values, an int32). Its
// String method returns "HBM", "DRAM" or "SSD". umbptest.Tier is the same
// type.
type Tier = tier.Tier

// The tiers a node reports its blocks on, fastest first.
const (
	TierHBM  = tier.HBM
	TierDRAM = tier.DRAM
	TierSSD  = tier.SSD
)

// checkTier refuses a tier that is not HBM, DRAM or SSD.
func checkTier(t Tier) error {
	if !t.Valid() {
		return fmt.Errorf("%w: tier %v is not HBM, DRAM or SSD", ErrInvalidKey, t)
	}
	return nil
}

// NodeBlocks is what one node holds of a request's blocks, from the
// external KV index (MatchExternalKv, hits not counted).
type NodeBlocks struct {
	// Node is the node's id; PeerAddress its peer service, empty when the
	// master gave none (a node it does not count as alive).
	Node        string
	PeerAddress string
	// Prefix is how many leading blocks of the request the node holds, on
	// any tier; HBM, DRAM and SSD split them by the fastest tier the node
	// holds each on, and sum to Prefix.
	Prefix         int
	HBM, DRAM, SSD int
	// Held counts every block of the request the node holds, leading or
	// not.
	Held int
}

func nodeBlocksOf(m masterconn.NodeMatch) NodeBlocks {
	return NodeBlocks{
		Node: m.NodeID, PeerAddress: m.PeerAddress, Prefix: m.Prefix, Held: m.Held,
		HBM: m.PrefixByTier[TierHBM], DRAM: m.PrefixByTier[TierDRAM], SSD: m.PrefixByTier[TierSSD],
	}
}

// TierWeights weigh a block by the tier a node holds it on. The zero value
// weighs every tier 1: a score counts leading blocks.
type TierWeights struct {
	HBM, DRAM, SSD float64
}

// ScoreRequest is one request's question to a router: which of these nodes
// holds the most of its leading blocks? The blocks are given either as
// BlockHashes (and PoolKeys), or as a Prompt.
type ScoreRequest struct {
	// Candidates are the nodes to rank, by node id: distinct, not empty,
	// at most 4096. Nil ranks every node that holds any of the blocks, in
	// order of id.
	Candidates []string
	// BlockHashes are the request's blocks as engines report them to the
	// external KV index ([WorkerHandle.ReportExternalKv]), in order: at
	// most 65536.
	BlockHashes []string
	// PoolKeys are the request's keys in the pool, for Scores.PoolPrefix;
	// nil means BlockHashes.
	PoolKeys []string
	// Prompt is a prompt's keys ([TokenKeyer.Keys]), for engines that
	// report their keys as block hashes (vLLM's UMBP connector does): they
	// are both the blocks and the pool's keys, and the answer counts
	// tokens too. A request gives either Prompt or BlockHashes.
	Prompt *TokenKeys
	// Weights weigh each leading block by its node's fastest tier for it.
	Weights TierWeights
}

// NodeScore is one candidate's score.
type NodeScore struct {
	NodeBlocks
	// Score is HBM×Weights.HBM + DRAM×Weights.DRAM + SSD×Weights.SSD, 0 for
	// a node without a peer address (not alive).
	Score float64
	// Tokens is how many leading tokens of a Prompt the node holds, as
	// [TokenKeys.Tokens] counts them; 0 without a Prompt.
	Tokens int
}

// Scores is the answer to a ScoreRequest.
type Scores struct {
	// Nodes has one entry per candidate, in the candidates' order; a
	// candidate the master knows nothing of holds nothing. Without
	// candidates, one per node that holds any block, by id.
	Nodes []NodeScore
	// Best is the index in Nodes of the highest score (the first on a
	// tie), -1 when no candidate scores above 0.
	Best int
	// PoolPrefix is how many leading keys the pool holds, on any node;
	// PoolTokens the tokens of a Prompt they hold.
	PoolPrefix int
	PoolTokens int
	// Complete reports that both answers arrived and passed their checks;
	// otherwise what failed counts as holding nothing (and is logged).
	Complete bool
}

// Validate reports whether the request can be asked: at most 4096
// candidates, none empty, not UTF-8 or listed twice; at most 65536 blocks;
// weights of 0 or more; a Prompt or BlockHashes and PoolKeys, not both.
// [SchedulerHandle.Score] refuses such a request before anything is sent;
// Validate says so without a handle. Errors match [ErrInvalidKey].
func (r ScoreRequest) Validate() error { return invalid(r.check()) }

// check refuses a request that cannot be asked.
func (r *ScoreRequest) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: score: "+format, append([]any{ErrInvalidKey}, args...)...)
	}
	if r.Prompt != nil && (r.BlockHashes != nil || r.PoolKeys != nil) {
		return bad("a request gives either a Prompt or BlockHashes and PoolKeys, not both")
	}
	if err := r.Weights.check(); err != nil {
		return bad("%w", err)
	}
	if len(r.Candidates) > maxScoreCandidates {
		return bad("%d candidates, more than %d", len(r.Candidates), maxScoreCandidates)
	}
	if len(r.BlockHashes) > maxScoreBlocks || len(r.PoolKeys) > maxScoreBlocks || r.Prompt != nil && len(r.Prompt.Keys) > maxScoreBlocks {
		return bad("more than %d blocks", maxScoreBlocks)
	}
	seen := make(map[string]struct{}, len(r.Candidates))
	for _, c := range r.Candidates {
		if c == "" || !utf8.ValidString(c) {
			return bad("candidate %q is empty or not UTF-8", c)
		}
		if _, dup := seen[c]; dup {
			return bad("candidate %q is listed twice", c)
		}
		seen[c] = struct{}{}
	}
	return nil
}

// blocks returns the request's hashes and keys.
func (r *ScoreRequest) blocks() (hashes, keys []string) {
	if r.Prompt != nil {
		return r.Prompt.Keys, r.Prompt.Keys
	}
	if r.PoolKeys == nil {
		return r.BlockHashes, r.BlockHashes
	}
	return r.BlockHashes, r.PoolKeys
}

// empty is the answer of a request that holds nothing: every candidate
// with nothing.
func (r *ScoreRequest) empty() Scores {
	out := Scores{Nodes: make([]NodeScore, len(r.Candidates)), Best: -1}
	for i, c := range r.Candidates {
		out.Nodes[i].Node = c
	}
	return out
}

// rank scores the request's candidates by what the nodes hold (the
// master's matches) and the pool's prefix, filling out.
func (r *ScoreRequest) rank(out *Scores, nodes []masterconn.NodeMatch, prefix int) {
	out.PoolPrefix = prefix
	cands := r.Candidates
	if cands == nil {
		cands = make([]string, len(nodes))
		for i, m := range nodes {
			cands[i] = m.NodeID
		}
		slices.Sort(cands)
		out.Nodes = make([]NodeScore, len(cands))
		for i, c := range cands {
			out.Nodes[i].Node = c
		}
	}
	at := make(map[string]int, len(cands))
	for i, c := range cands {
		at[c] = i
	}
	w := r.Weights
	if w == (TierWeights{}) {
		w = TierWeights{1, 1, 1}
	}
	for _, m := range nodes {
		i, ok := at[m.NodeID]
		if !ok {
			continue
		}
		s := NodeScore{NodeBlocks: nodeBlocksOf(m)}
		if s.PeerAddress != "" {
			s.Score = float64(s.HBM)*w.HBM + float64(s.DRAM)*w.DRAM + float64(s.SSD)*w.SSD
		}
		out.Nodes[i] = s
	}
	out.Best = -1
	for i := range out.Nodes {
		n := &out.Nodes[i]
		if r.Prompt != nil {
			n.Tokens = r.Prompt.Tokens(n.Prefix)
		}
		if n.Score > 0 && (out.Best < 0 || n.Score > out.Nodes[out.Best].Score) {
			out.Best = i
		}
	}
	if r.Prompt != nil {
		out.PoolTokens = r.Prompt.Tokens(prefix)
	}
}

// scoreQuery is what a Score asks, cut at the first block that cannot be
// asked about: the block hashes of the external KV index, and the pool's
// keys, which the call's goroutine encodes.
type scoreQuery struct {
	hashes, keys []string
	encodeKeys   func([]string) (encoded.Keys, error)
}

// scoreAnswer is a Score's two answers, each half's error apart.
type scoreAnswer struct {
	nodes  []masterconn.NodeMatch
	prefix int
	errs   [2]error
}

// ask asks src both halves at once (two replicas of a master, where it
// has them). A call whose both halves failed failed: the handle's
// fail-fast and the link's reconnect see it.
func (s scoreQuery) ask(src lookupSource, ctx context.Context) (scoreAnswer, error) {
	var a scoreAnswer
	var wg sync.WaitGroup
	if len(s.hashes) > 0 {
		wg.Go(func() { a.nodes, a.errs[0] = src.match(ctx, s.hashes) })
	}
	if len(s.keys) > 0 {
		var q encoded.Keys
		if q, a.errs[1] = s.encodeKeys(s.keys); a.errs[1] == nil {
			a.prefix, a.errs[1] = checkedPrefix(src, ctx, q, len(s.keys))
		}
	}
	wg.Wait()
	if a.errs[0] != nil && (a.errs[1] != nil || len(s.keys) == 0) {
		return a, a.errs[0]
	}
	if a.errs[1] != nil && len(s.hashes) == 0 {
		return a, a.errs[1]
	}
	return a, nil
}

package umbp

import (
	"context"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

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

// Score limits: a request for more is refused before anything is sent.
const (
	MaxScoreBlocks     = 1 << 16
	MaxScoreCandidates = 4096
)

// ScoreRequest is one request's question to a router: which of these nodes
// holds the most of its leading blocks?
type ScoreRequest struct {
	// Candidates are the nodes to rank, by node id: distinct, not empty.
	// Nil ranks every node that holds any of the blocks, in order of id.
	Candidates []string
	// Hashes are the request's blocks as engines report them to the
	// external KV index ([WorkerHandle.ReportExternalKv]), in order.
	Hashes []string
	// Keys are the request's keys in the pool, for Scores.PoolPrefix; nil
	// means Hashes.
	Keys []string
	// Weights weigh each leading block by its node's fastest tier for it.
	Weights TierWeights
}

// NodeScore is one candidate's score.
type NodeScore struct {
	NodeBlocks
	// Score is HBM×Weights.HBM + DRAM×Weights.DRAM + SSD×Weights.SSD, 0 for
	// a node without a peer address (not alive).
	Score float64
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
	// PoolPrefix is how many leading keys the pool holds, on any node.
	PoolPrefix int
	// Complete reports that both answers arrived and passed their checks;
	// otherwise what failed counts as holding nothing (and is logged).
	Complete bool
}

func (r *ScoreRequest) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: score: "+format, append([]any{ErrInvalidKey}, args...)...)
	}
	if len(r.Candidates) > MaxScoreCandidates {
		return bad("%d candidates, more than %d", len(r.Candidates), MaxScoreCandidates)
	}
	if len(r.Hashes) > MaxScoreBlocks || len(r.Keys) > MaxScoreBlocks {
		return bad("more than %d blocks", MaxScoreBlocks)
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

// Score ranks candidate nodes for one request: per candidate the longest
// run of the request's leading blocks it holds, by tier, weighed; and the
// pool-wide prefix. It asks twice, in one bounded call: MatchExternalKv
// (hits not counted) for Hashes and BatchLookup (a standalone server:
// BatchExistsConsecutive) for Keys. Never RouteGet: that leases and counts.
// As every lookup, a failure, a bad answer or no reply within
// LookupTimeout scores nothing (Complete false); the error reports only a
// bad request. Quarantined keys end the prefixes they are in.
func (h *SchedulerHandle) Score(ctx context.Context, req ScoreRequest) (Scores, error) {
	if err := req.check(); err != nil {
		return Scores{}, err
	}
	hashes, keys := req.Hashes, req.Keys
	if keys == nil {
		keys = hashes
	}
	// A block that cannot be asked about, or is quarantined, ends the
	// request's prefix.
	cut := func(ss []string) []string {
		for i, s := range ss {
			if !lookupKeyOK(s) {
				ss = ss[:i]
				break
			}
		}
		return ss[:h.quarantine.first(ss)]
	}
	// The call may outlive this one (LookupTimeout), and the caller may
	// reuse its slices once Score returns: it gets a copy of the hashes
	// (their answer is checked against them) and the keys encoded.
	hashes, keys = slices.Clone(cut(hashes)), cut(keys)
	nkeys := len(keys)
	var q encoded.Keys
	var qErr error
	if nkeys > 0 {
		q, qErr = h.backend.encode(keys)
	}
	out := Scores{Nodes: make([]NodeScore, len(req.Candidates)), Best: -1}
	for i, c := range req.Candidates {
		out.Nodes[i].Node = c
	}
	if len(hashes) == 0 && nkeys == 0 {
		out.Complete = true
		return out, nil
	}
	type answer struct {
		nodes  []masterconn.NodeMatch
		prefix int
		errs   [2]error
	}
	h.stats.lookups.Add(1)
	a, err := call(ctx, h, "Score", func(ctx context.Context, c lookupSource) (answer, error) {
		var a answer
		if len(hashes) > 0 {
			a.nodes, a.errs[0] = c.match(ctx, hashes)
		}
		switch {
		case nkeys == 0:
		case qErr != nil:
			a.errs[1] = qErr
		default:
			a.prefix, a.errs[1] = c.prefix(ctx, q)
			if a.errs[1] == nil && (a.prefix < 0 || a.prefix > nkeys) {
				a.errs[1] = fmt.Errorf("count %d for %d keys", a.prefix, nkeys)
				a.prefix = 0
			}
		}
		// A call whose both halves failed failed: the handle's fail-fast
		// and the link's reconnect see it.
		if a.errs[0] != nil && (a.errs[1] != nil || nkeys == 0) {
			return a, a.errs[0]
		}
		if a.errs[1] != nil && len(hashes) == 0 {
			return a, a.errs[1]
		}
		return a, nil
	})
	if err != nil {
		h.logFailure("score", err)
		return out, nil
	}
	out.Complete = true
	for i, e := range a.errs {
		if e != nil {
			out.Complete = false
			h.logFailure([...]string{"score: match", "score: pool prefix"}[i], e)
		}
	}
	out.PoolPrefix = a.prefix
	if req.Candidates == nil {
		ids := make([]string, len(a.nodes))
		for i, m := range a.nodes {
			ids[i] = m.NodeID
		}
		slices.Sort(ids)
		req.Candidates = ids
		out.Nodes = make([]NodeScore, len(ids))
	}
	at := make(map[string]int, len(req.Candidates))
	for i, c := range req.Candidates {
		at[c] = i
	}
	w := req.Weights
	if w == (TierWeights{}) {
		w = TierWeights{1, 1, 1}
	}
	for _, m := range a.nodes {
		i, ok := at[m.NodeID]
		if !ok {
			continue
		}
		nb := nodeBlocksOf(m)
		s := NodeScore{NodeBlocks: nb}
		if nb.PeerAddress != "" {
			s.Score = float64(nb.HBM)*w.HBM + float64(nb.DRAM)*w.DRAM + float64(nb.SSD)*w.SSD
		}
		out.Nodes[i] = s
	}
	for i, n := range out.Nodes {
		if n.Score > 0 && (out.Best < 0 || n.Score > out.Nodes[out.Best].Score) {
			out.Best = i
		}
	}
	return out, nil
}

// TokenScores is Score's answer in tokens, for a request given as tokens.
type TokenScores struct {
	Scores
	// Tokens[i] is how many leading tokens Nodes[i] holds, counted as
	// TokenKeys.Tokens counts them; PoolTokens the pool's.
	Tokens     []int
	PoolTokens int
}

// ScoreTokens scores a request given as tokens: its keys
// ([TokenKeyer.Keys]) are both the blocks engines report and the keys of
// the pool. Errors report only bad input.
func (h *SchedulerHandle) ScoreTokens(ctx context.Context, k *TokenKeyer, tokens []int32, extra vllmhash.ExtraKeys, candidates []string, weights TierWeights) (TokenScores, error) {
	keys, err := k.Keys(tokens, extra)
	if err != nil {
		return TokenScores{}, err
	}
	s, err := h.Score(ctx, ScoreRequest{Candidates: candidates, Hashes: keys.Keys, Weights: weights})
	if err != nil {
		return TokenScores{}, err
	}
	out := TokenScores{Scores: s, Tokens: make([]int, len(s.Nodes)), PoolTokens: keys.Tokens(s.PoolPrefix)}
	for i, n := range s.Nodes {
		out.Tokens[i] = keys.Tokens(n.Prefix)
	}
	return out, nil
}

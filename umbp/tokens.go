package umbp

import (
	"fmt"
	"math/bits"
	"sort"

	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

// KVCacheGroup is one prefix-cacheable KV cache group of a vLLM engine.
type KVCacheGroup struct {
	// ID is the group's index in the engine's KV cache config: the g<ID>
	// of its keys.
	ID int
	// BlockSize is the number of tokens in one of the group's blocks, as
	// the engine's KV cache config gives it.
	BlockSize int
}

// TokenKeyConfig describes how a vLLM engine running the UMBP connector
// keys the KV blocks it stores, so that a Go scheduler can compute the same
// keys from a request's tokens.
type TokenKeyConfig struct {
	// Namespace is the connector's key namespace (its key_namespace
	// setting, or the namespace it derived).
	Namespace string
	// Topology gives the engine's TP, PCP, DCP and PP sizes; its ranks are
	// ignored, since a block is held only when every rank stored it.
	Topology RankTopology
	// Groups lists the engine's prefix-cacheable KV cache groups.
	Groups []KVCacheGroup
	// HashBlockSize is vLLM's hash_block_size, the number of tokens each
	// block hash covers. Zero means vLLM's choice: the greatest common
	// divisor of the groups' block sizes (the block size itself for one
	// group); set it when the engine overrides that. Every group's block
	// size must be a multiple of it.
	HashBlockSize int
	// Hasher has the engine's hash algorithm and PYTHONHASHSEED.
	Hasher *vllmhash.Hasher
}

// TokenKeyer turns a request's tokens into the keys vLLM's UMBP connector
// stores its KV blocks under: for every block of every group, one key per
// rank. Block j of a group of block size B uses the block hash ending at
// token (j+1)*B, that is hash index (j+1)*B/HashBlockSize - 1.
//
// A TokenKeyer is immutable and safe for concurrent use.
type TokenKeyer struct {
	hasher *vllmhash.Hasher
	groups []KVCacheGroup
	hashBS int
	unit   int         // least common multiple of the groups' block sizes
	ranks  []*KeyCodec // every rank, TP fastest, then PCP, DCP, PP
}

// NewTokenKeyer checks the configuration and returns a keyer for it. Errors
// match [ErrInvalidTokenKeyConfig].
func NewTokenKeyer(cfg TokenKeyConfig) (*TokenKeyer, error) {
	k, err := newTokenKeyer(cfg)
	return k, invalid(err)
}

func newTokenKeyer(cfg TokenKeyConfig) (*TokenKeyer, error) {
	bad := func(format string, args ...any) (*TokenKeyer, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrInvalidTokenKeyConfig}, args...)...)
	}
	if cfg.Hasher == nil {
		return bad("no Hasher")
	}
	if len(cfg.Groups) == 0 {
		return bad("no KV cache groups")
	}
	if err := validateNamespace(cfg.Namespace); err != nil {
		return bad("%w", err)
	}
	if err := cfg.Topology.validate(); err != nil {
		return bad("%w", err)
	}
	k := &TokenKeyer{hasher: cfg.Hasher, groups: append([]KVCacheGroup(nil), cfg.Groups...), unit: 1}
	seen := make(map[int]bool, len(cfg.Groups))
	gcd := 0
	for _, g := range k.groups {
		switch {
		case g.ID < 0:
			return bad("group %d has a negative ID", g.ID)
		case seen[g.ID]:
			return bad("group %d is listed twice", g.ID)
		case g.BlockSize <= 0:
			return bad("group %d has block size %d", g.ID, g.BlockSize)
		}
		seen[g.ID] = true
		gcd = gcdInt(gcd, g.BlockSize)
		l := k.unit / gcdInt(k.unit, g.BlockSize)
		if hi, lo := bits.Mul64(uint64(l), uint64(g.BlockSize)); hi != 0 || lo > 1<<40 {
			return bad("the groups' block sizes have too large a common multiple")
		}
		k.unit = l * g.BlockSize
	}
	k.hashBS = cfg.HashBlockSize
	switch {
	case k.hashBS == 0:
		k.hashBS = gcd
	case k.hashBS < 0:
		return bad("HashBlockSize %d is negative", k.hashBS)
	}
	for _, g := range k.groups {
		if g.BlockSize%k.hashBS != 0 {
			return bad("group %d's block size %d is not a multiple of HashBlockSize %d", g.ID, g.BlockSize, k.hashBS)
		}
	}
	n := cfg.Topology.Normalized()
	for pp := range n.PPSize {
		for dcp := range n.DCPSize {
			for pcp := range n.PCPSize {
				for tp := range n.TPSize {
					r := n
					r.TPRank, r.PCPRank, r.DCPRank, r.PPRank = tp, pcp, dcp, pp
					c, err := newKeyCodec(cfg.Namespace, r)
					if err != nil {
						return bad("%w", err)
					}
					k.ranks = append(k.ranks, c)
				}
			}
		}
	}
	return k, nil
}

func gcdInt(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// HashBlockSize returns the number of tokens each block hash covers.
func (k *TokenKeyer) HashBlockSize() int { return k.hashBS }

// NewChain starts a hash chain for a request, in blocks of HashBlockSize
// tokens; a scheduler extends it as the request grows and turns it into
// keys with [TokenKeyer.ChainKeys]. Errors are [vllmhash.Hasher.NewChain]'s.
func (k *TokenKeyer) NewChain(extra vllmhash.ExtraKeys) (*vllmhash.Chain, error) {
	c, err := k.hasher.NewChain(k.hashBS, extra)
	return c, invalid(err)
}

// Keys returns the keys of every full block of the tokens, for a request
// with the given extra keys. Errors are [vllmhash.Hasher.NewChain]'s: a
// request with prompt embeddings is refused with [vllmhash.ErrPromptEmbeds].
func (k *TokenKeyer) Keys(tokens []int32, extra vllmhash.ExtraKeys) (*TokenKeys, error) {
	c, err := k.NewChain(extra)
	if err != nil {
		return nil, err
	}
	c.Append(tokens)
	return k.ChainKeys(c)
}

// ChainKeys returns the keys of the blocks a chain has hashed. The chain
// must come from [TokenKeyer.NewChain] (or have the keyer's hasher and
// HashBlockSize); otherwise the error matches [ErrInvalidTokenKeyConfig].
func (k *TokenKeyer) ChainKeys(c *vllmhash.Chain) (*TokenKeys, error) {
	if c.Hasher() != k.hasher || c.BlockSize() != k.hashBS {
		return nil, invalid(fmt.Errorf("%w: the chain's hasher or block size (%d) is not the keyer's (%d)",
			ErrInvalidTokenKeyConfig, c.BlockSize(), k.hashBS))
	}
	t := &TokenKeys{unit: k.unit, full: c.Len() * k.hashBS}
	for i := range c.Len() {
		end := (i + 1) * k.hashBS
		hash := c.Hash(i)
		added := false
		for _, g := range k.groups {
			if end%g.BlockSize != 0 {
				continue
			}
			for _, r := range k.ranks {
				t.Keys = append(t.Keys, r.Key(g.ID, hash))
			}
			added = true
		}
		if added {
			t.ends = append(t.ends, end)
			t.counts = append(t.counts, len(t.Keys))
		}
	}
	return t, nil
}

// TokenKeys are the keys of a request's blocks, in the order a prefix
// lookup needs them: by the token their block ends at, then by group in
// the configuration's order, then by rank with TP fastest, then PCP, DCP
// and PP, as the connector asks for a block's ranks.
type TokenKeys struct {
	// Keys are the keys; see [KeyCodec] for their form.
	Keys []string

	ends   []int // distinct token ends, increasing
	counts []int // counts[i]: keys whose block ends at or before ends[i]
	unit   int   // least common multiple of the groups' block sizes
	full   int   // tokens covered by hashed blocks
}

// Tokens returns how many tokens of the request the pool holds when it
// holds the first held keys (as [SchedulerHandle.LookupPrefix] counts
// them): the largest multiple of every group's block size such that every
// rank's key of every group's block ending at or before it is held.
func (t *TokenKeys) Tokens(held int) int {
	complete := t.full
	if i := sort.Search(len(t.counts), func(i int) bool { return t.counts[i] > held }); i < len(t.counts) {
		complete = 0
		if i > 0 {
			complete = t.ends[i-1]
		}
	}
	return complete / t.unit * t.unit
}

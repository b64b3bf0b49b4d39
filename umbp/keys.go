package umbp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/umbp-go/umbp-go/internal/rpc"
)

// keyPrefix starts every key; the version tag changes if the format does.
const keyPrefix = "umbp:vllm:v1:"

// MaxKeyBytes bounds a key's length. A longer key is refused alone, before
// anything is sent: a lookup answers it as a miss (and a prefix ends at
// it), a store or load fails that key with ErrInvalidPlan and
// ErrNotAttempted, and its siblings go on. vLLM's keys, and those
// KeyCodec and TokenKeyer make, are under 200 bytes.
const MaxKeyBytes = rpc.MaxKeyBytes

// lookupKeyOK reports whether key can be sent in a lookup: not empty, at
// most MaxKeyBytes, valid UTF-8.
func lookupKeyOK(key string) bool {
	return key != "" && len(key) <= MaxKeyBytes && utf8.ValidString(key)
}

// KeyCodec makes the object keys one rank stores and looks up. Keys have the
// form
//
//	umbp:vllm:v1:<namespace>:tp<t>:pcp<c>:dcp<d>:pp<p>:g<group>:<hash>
//
// where t, c, d and p are the rank's TP, PCP, DCP and PP ranks (not sizes),
// group is the KV cache group, and hash is the block hash in lower-case hex.
// This is the format vLLM's UMBP connector uses, so Go engines and vLLM
// engines with the same namespace and topology share stored blocks on one
// server.
//
// A KeyCodec is immutable and safe for concurrent use.
type KeyCodec struct {
	namespace string
	topo      RankTopology
	prefix    string // everything up to and including ":g"
}

// NewKeyCodec returns the codec for one rank. The namespace separates
// unrelated deployments (typically one per model and KV format) sharing a
// server: it must be non-empty valid UTF-8 without ':'. topo must pass
// [RankTopology.Validate]. Errors match [ErrInvalidKey] or
// [ErrInvalidTopology].
func NewKeyCodec(namespace string, topo RankTopology) (*KeyCodec, error) {
	c, err := newKeyCodec(namespace, topo)
	return c, invalid(err)
}

func newKeyCodec(namespace string, topo RankTopology) (*KeyCodec, error) {
	if err := validateNamespace(namespace); err != nil {
		return nil, err
	}
	if err := topo.validate(); err != nil {
		return nil, err
	}
	topo = topo.Normalized()
	prefix := keyPrefix + namespace +
		":tp" + strconv.Itoa(topo.TPRank) +
		":pcp" + strconv.Itoa(topo.PCPRank) +
		":dcp" + strconv.Itoa(topo.DCPRank) +
		":pp" + strconv.Itoa(topo.PPRank) +
		":g"
	return &KeyCodec{namespace: namespace, topo: topo, prefix: prefix}, nil
}

func validateNamespace(ns string) error {
	switch {
	case ns == "":
		return fmt.Errorf("%w: namespace is empty", ErrInvalidKey)
	case strings.IndexByte(ns, ':') >= 0:
		return fmt.Errorf("%w: namespace %q contains ':'", ErrInvalidKey, ns)
	case !utf8.ValidString(ns):
		return fmt.Errorf("%w: namespace %q is not valid UTF-8", ErrInvalidKey, ns)
	}
	return nil
}

const lowerHex = "0123456789abcdef"

// Key returns the key of the block with the given group and hash. The group
// should be non-negative and the hash non-empty: other values produce keys
// that [ParseKey] rejects (a negative group) or that are unlikely to be
// meaningful (an empty hash). Key allocates only the returned string.
func (c *KeyCodec) Key(group int, hash []byte) string {
	var num [20]byte
	g := strconv.AppendInt(num[:0], int64(group), 10)
	var b strings.Builder
	b.Grow(len(c.prefix) + len(g) + 1 + 2*len(hash))
	b.WriteString(c.prefix)
	b.Write(g)
	b.WriteByte(':')
	for _, x := range hash {
		b.WriteByte(lowerHex[x>>4])
		b.WriteByte(lowerHex[x&0x0f])
	}
	return b.String()
}

// KeyHex is [KeyCodec.Key] for a hash already in hex. Upper-case digits are
// accepted and written in lower case, so the key matches the one Key makes
// from the decoded bytes. An odd-length or non-hex hash is an error matching
// [ErrInvalidKey].
func (c *KeyCodec) KeyHex(group int, hexHash string) (string, error) {
	if len(hexHash)%2 != 0 {
		return "", invalid(fmt.Errorf("%w: hex hash %q has odd length %d", ErrInvalidKey, hexHash, len(hexHash)))
	}
	for i := 0; i < len(hexHash); i++ {
		if !isHexByte(hexHash[i]) {
			return "", invalid(fmt.Errorf("%w: hex hash %q has a non-hex byte %q at %d", ErrInvalidKey, hexHash, hexHash[i], i))
		}
	}
	return c.groupPrefix(group) + strings.ToLower(hexHash), nil
}

func isHexByte(x byte) bool {
	return '0' <= x && x <= '9' || 'a' <= x && x <= 'f' || 'A' <= x && x <= 'F'
}

// fromHex returns the value of a lower-case hex digit, or -1.
func fromHex(x byte) int {
	switch {
	case '0' <= x && x <= '9':
		return int(x - '0')
	case 'a' <= x && x <= 'f':
		return int(x-'a') + 10
	}
	return -1
}

// ParsedKey is a key decoded by [ParseKey].
type ParsedKey struct {
	Namespace string
	TPRank    int
	PCPRank   int
	DCPRank   int
	PPRank    int
	Group     int
	// Hash is the block hash decoded from hex; empty (non-nil) when the key
	// ends in ':'.
	Hash []byte
}

// String re-encodes the key. For a ParsedKey returned by [ParseKey] it is
// the string that was parsed.
func (p ParsedKey) String() string {
	var b strings.Builder
	b.Grow(len(keyPrefix) + len(p.Namespace) + 40 + 2*len(p.Hash))
	b.WriteString(keyPrefix)
	b.WriteString(p.Namespace)
	for _, f := range [...]struct {
		tag string
		n   int
	}{{":tp", p.TPRank}, {":pcp", p.PCPRank}, {":dcp", p.DCPRank}, {":pp", p.PPRank}, {":g", p.Group}} {
		b.WriteString(f.tag)
		b.WriteString(strconv.Itoa(f.n))
	}
	b.WriteByte(':')
	for _, x := range p.Hash {
		b.WriteByte(lowerHex[x>>4])
		b.WriteByte(lowerHex[x&0x0f])
	}
	return b.String()
}

// ParseKey decodes a key in the format [KeyCodec] writes. It accepts exactly
// the canonical keys: a valid namespace, non-negative decimal numbers without
// sign or leading zeros that fit in an int, and an even-length lower-case hex
// hash (possibly empty). So for every key it accepts, a KeyCodec for the
// decoded namespace and ranks re-encodes the decoded group and hash to the
// same string. Errors match [ErrInvalidKey] and quote the key.
func ParseKey(key string) (ParsedKey, error) {
	fail := func(what string) (ParsedKey, error) {
		return ParsedKey{}, invalid(fmt.Errorf("%w: %q: %s", ErrInvalidKey, key, what))
	}
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok {
		return fail("does not start with " + strconv.Quote(keyPrefix))
	}
	var p ParsedKey
	p.Namespace, rest, ok = strings.Cut(rest, ":")
	if !ok {
		return fail("no field after the namespace")
	}
	if err := validateNamespace(p.Namespace); err != nil {
		return fail(err.Error())
	}
	var nums [5]int // tp, pcp, dcp, pp, g
	for i, tag := range [...]string{"tp", "pcp", "dcp", "pp", "g"} {
		var field string
		field, rest, ok = strings.Cut(rest, ":")
		if !ok {
			return fail("missing field " + strconv.Quote(tag+"<n>"))
		}
		digits, ok := strings.CutPrefix(field, tag)
		if !ok {
			return fail(fmt.Sprintf("field %q should start with %q", field, tag))
		}
		n, err := parseCanonicalUint(digits)
		if err != nil {
			return fail(fmt.Sprintf("field %q: %v", field, err))
		}
		nums[i] = n
	}
	p.TPRank, p.PCPRank, p.DCPRank, p.PPRank, p.Group = nums[0], nums[1], nums[2], nums[3], nums[4]
	if len(rest)%2 != 0 {
		return fail(fmt.Sprintf("hash %q has odd length %d", rest, len(rest)))
	}
	p.Hash = make([]byte, len(rest)/2)
	for i := 0; i < len(rest); i += 2 {
		hi, lo := fromHex(rest[i]), fromHex(rest[i+1])
		if hi < 0 || lo < 0 {
			return fail(fmt.Sprintf("hash %q is not lower-case hex", rest))
		}
		p.Hash[i/2] = byte(hi<<4 | lo)
	}
	return p, nil
}

// parseCanonicalUint parses a non-negative decimal int written without sign
// or leading zeros.
func parseCanonicalUint(s string) (int, error) {
	if s == "" {
		return 0, errors.New("no digits")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a decimal number", s)
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q does not fit in an int", s)
	}
	return n, nil
}

// groupPrefix returns the part shared by every key of this codec's rank and
// the given group: the key without its hash.
func (c *KeyCodec) groupPrefix(group int) string {
	return c.prefix + strconv.Itoa(group) + ":"
}

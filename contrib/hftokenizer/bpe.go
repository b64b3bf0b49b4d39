package hftokenizer

// byteToRune is GPT-2's bytes_to_unicode: the character each byte is
// written as in a byte-level vocabulary.
var byteToRune [256]rune

// runeToByte inverts byteToRune.
var runeToByte = map[rune]byte{}

func init() {
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae && b <= 0xff {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelDecode returns the bytes a byte-level token stands for, false
// when it has a character outside the byte-level alphabet.
func byteLevelDecode(tok string) ([]byte, bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}

// symbol is one part of a word being merged: a token and its neighbours.
type symbol struct {
	id         int32
	prev, next int32 // -1 at the ends
	gone       bool  // merged into its left neighbour
}

// candidate is a merge waiting in the queue: the pair starting at pos,
// its rank above pos in key (so that one comparison orders by rank, then
// position), and the token it makes.
type candidate struct {
	key uint64
	id  int32
}

func candidateKey(rank, pos int32) uint64 { return uint64(uint32(rank))<<32 | uint64(uint32(pos)) }

// mergeQueue is a 4-ary min-heap of candidates by key: half the levels
// of a binary heap, for the long words a queue grows large for.
type mergeQueue []candidate

func (q mergeQueue) up(i int) {
	c := q[i]
	for i > 0 {
		p := (i - 1) / 4
		if q[p].key <= c.key {
			break
		}
		q[i] = q[p]
		i = p
	}
	q[i] = c
}

func (q mergeQueue) down(i int) {
	n := len(q)
	c := q[i]
	for {
		first := 4*i + 1
		if first >= n {
			break
		}
		m := first
		for j := first + 1; j < first+4 && j < n; j++ {
			if q[j].key < q[m].key {
				m = j
			}
		}
		if c.key <= q[m].key {
			break
		}
		q[i] = q[m]
		i = m
	}
	q[i] = c
}

// init orders q as a heap, in linear time.
func (q mergeQueue) init() {
	if len(q) < 2 {
		return
	}
	for i := (len(q) - 2) / 4; i >= 0; i-- {
		q.down(i)
	}
}

func (q *mergeQueue) push(c candidate) {
	*q = append(*q, c)
	q.up(len(*q) - 1)
}

func (q *mergeQueue) pop() candidate {
	h := *q
	top := h[0]
	h[0] = h[len(h)-1]
	h = h[:len(h)-1]
	if len(h) > 0 {
		h.down(0)
	}
	*q = h
	return top
}

// bpe merges the bytes of w as tokenizers' Word::merge_all does: the pair
// of lowest rank first, the leftmost among equals, with a queue of the
// candidate pairs and the word as a linked list, so a word of n bytes
// takes O(n log n).
func (t *Tokenizer) bpe(ids []int32, w string, sc *scratch) []int32 {
	syms := sc.syms[:0]
	syms = append(syms, make([]symbol, len(w))...)
	sc.syms = syms
	for i := range len(w) {
		syms[i] = symbol{id: t.byteID[w[i]], prev: int32(i - 1), next: int32(i + 1)}
	}
	syms[len(w)-1].next = -1
	q := sc.queue[:0]
	defer func() { sc.queue = q[:0] }()
	for i := 0; i+1 < len(w); i++ {
		if m, ok := t.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			q = append(q, candidate{key: candidateKey(m.rank, int32(i)), id: m.id})
		}
	}
	q.init()
	for len(q) > 0 {
		c := q.pop()
		pos := int32(uint32(c.key))
		s := &syms[pos]
		if s.gone || s.next < 0 {
			continue
		}
		right := &syms[s.next]
		if m, ok := t.merges[pairKey(s.id, right.id)]; !ok || m.id != c.id {
			continue // the pair changed since it was queued
		}
		s.id = c.id
		right.gone = true
		s.next = right.next
		if s.next >= 0 {
			syms[s.next].prev = pos
		}
		if s.prev >= 0 {
			if m, ok := t.merges[pairKey(syms[s.prev].id, s.id)]; ok {
				q.push(candidate{key: candidateKey(m.rank, s.prev), id: m.id})
			}
		}
		if s.next >= 0 {
			if m, ok := t.merges[pairKey(s.id, syms[s.next].id)]; ok {
				q.push(candidate{key: candidateKey(m.rank, pos), id: m.id})
			}
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		ids = append(ids, syms[i].id)
	}
	return ids
}

// trie matches added tokens, leftmost first and longest at a position, as
// tokenizers' AddedVocabulary does (an Aho-Corasick automaton with
// LeftmostLongest matching).
type trie struct {
	nodes []trieNode
	first [256]bool // the bytes a token starts with
}

type trieNode struct {
	next map[byte]int32
	id   int32 // -1: no token ends here
}

func (tr *trie) add(s string, id int32) {
	if tr.nodes == nil {
		tr.nodes = []trieNode{{id: -1}}
	}
	tr.first[s[0]] = true
	n := int32(0)
	for i := 0; i < len(s); i++ {
		nx, ok := tr.nodes[n].next[s[i]]
		if !ok {
			if tr.nodes[n].next == nil {
				tr.nodes[n].next = make(map[byte]int32)
			}
			tr.nodes = append(tr.nodes, trieNode{id: -1})
			nx = int32(len(tr.nodes) - 1)
			tr.nodes[n].next[s[i]] = nx
		}
		n = nx
	}
	tr.nodes[n].id = id
}

// longest returns the length and id of the longest token at the start of
// s, 0 when none.
func (tr *trie) longest(s string) (int, int32) {
	n, best, bestID := int32(0), 0, int32(-1)
	for i := 0; i < len(s); i++ {
		nx, ok := tr.nodes[n].next[s[i]]
		if !ok {
			break
		}
		n = nx
		if tr.nodes[n].id >= 0 {
			best, bestID = i+1, tr.nodes[n].id
		}
	}
	return best, bestID
}

// split passes fn the text between tokens (id -1) and each token found,
// in order.
func (tr *trie) split(s string, fn func(string, int32)) {
	if tr.nodes == nil {
		fn(s, -1)
		return
	}
	prev := 0
	for i := 0; i < len(s); i++ {
		if !tr.first[s[i]] {
			continue
		}
		n, id := tr.longest(s[i:])
		if n == 0 {
			continue
		}
		if i > prev {
			fn(s[prev:i], -1)
		}
		fn(s[i:i+n], id)
		i += n - 1
		prev = i + 1
	}
	if prev < len(s) {
		fn(s[prev:], -1)
	}
}

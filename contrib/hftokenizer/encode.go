package hftokenizer

import (
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// Tokenizer is a byte-level BPE tokenizer read from a model's
// tokenizer.json, with its tokenizer_config.json's chat template and
// special tokens. It encodes as Hugging Face tokenizers does (the library
// behind transformers' fast tokenizers, which vLLM uses): the same ids for
// every input. It is safe for concurrent use.
type Tokenizer struct {
	vocab     tokenTable // the model's tokens, by id and by the bytes they stand for
	byteID    [256]int32 // each byte's own token
	merges    map[uint64]mergeInfo
	vocabSize int

	ignoreMerges bool
	nfc          bool
	splits       []*regexp2.Regexp // applied in turn, each piece split by the next

	addedRaw        trie // added tokens matched on the text as given
	addedNormalized trie // added tokens matched on the normalized text
	addedContent    map[int32]string
	special         map[int32]bool

	postSet        bool
	prefix, suffix []int32 // the post-processor's template around the sequence

	cache wordCache

	config *chatConfig
}

type mergeInfo struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// VocabSize is the number of tokens in the model's vocabulary, added tokens
// not counted.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// Encode returns the ids of text as Hugging Face tokenizers'
// Tokenizer.encode(text, add_special_tokens) gives them: added and special
// tokens written in the text are matched first (leftmost, longest), the
// rest is normalized where the tokenizer declares a normalizer,
// pre-tokenized and merged; addSpecialTokens adds what the post-processor's
// template adds (a BOS for Llama 3.1's tokenizer). Each byte of text that
// is not UTF-8 is encoded as U+FFFD (a Python str cannot hold such bytes).
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []int32 {
	if !utf8.ValidString(text) {
		text = toValidUTF8(text)
	}
	ids := make([]int32, 0, len(text)/3+len(t.prefix)+len(t.suffix)+1)
	if addSpecialTokens {
		ids = append(ids, t.prefix...)
	}
	t.addedRaw.split(text, func(s string, id int32) {
		if id >= 0 {
			ids = append(ids, id)
			return
		}
		s = t.normalize(s)
		t.addedNormalized.split(s, func(s string, id int32) {
			if id >= 0 {
				ids = append(ids, id)
				return
			}
			ids = t.encodeText(ids, s)
		})
	})
	if addSpecialTokens {
		ids = append(ids, t.suffix...)
	}
	return ids
}

func toValidUTF8(s string) string {
	b := make([]byte, 0, len(s)+8)
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		b = utf8.AppendRune(b, r) // RuneError for an invalid byte
		s = s[n:]
	}
	return string(b)
}

func (t *Tokenizer) normalize(s string) string {
	if t.nfc {
		return norm.NFC.String(s)
	}
	return s
}

// scratch is the memory one encoding works in, kept between encodings.
type scratch struct {
	runes []rune
	offs  []int32 // byte offset of each rune, and the length at the end
	syms  []symbol
	queue mergeQueue
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// encodeText pre-tokenizes text without added tokens and merges each piece.
func (t *Tokenizer) encodeText(ids []int32, s string) []int32 {
	if s == "" {
		return ids
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	sc.runes, sc.offs = sc.runes[:0], sc.offs[:0]
	for i, r := range s {
		sc.runes = append(sc.runes, r)
		sc.offs = append(sc.offs, int32(i))
	}
	sc.offs = append(sc.offs, int32(len(s)))
	t.splitPieces(sc.runes, 0, 0, func(start, end int) {
		ids = t.encodeWord(ids, s[sc.offs[start]:sc.offs[end]], sc)
	})
	return ids
}

// splitPieces splits runes with the level-th split pattern and passes each
// piece (matches and the text between them: "Isolated") to the next level,
// the last level's pieces to fn, as rune offsets from base.
func (t *Tokenizer) splitPieces(runes []rune, base, level int, fn func(start, end int)) {
	if level == len(t.splits) {
		fn(base, base+len(runes))
		return
	}
	re := t.splits[level]
	prev := 0
	m, err := re.FindRunesMatch(runes)
	for m != nil && err == nil {
		// Each match is a run of the pattern's consecutive matches, one
		// capture each (see loopPattern).
		for _, c := range m.GroupByNumber(1).Captures {
			start, end := c.Index, c.Index+c.Length
			if end == start {
				continue
			}
			if start > prev {
				t.splitPieces(runes[prev:start], base+prev, level+1, fn)
			}
			t.splitPieces(runes[start:end], base+start, level+1, fn)
			prev = end
		}
		m, err = re.FindNextMatch(m)
	}
	if err != nil {
		// regexp2 fails only on a timeout, which is not set.
		panic(err)
	}
	if prev < len(runes) {
		t.splitPieces(runes[prev:], base+prev, level+1, fn)
	}
}

// wordCache keeps the ids of short words, as tokenizers' BPE cache does.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int32
}

const (
	cacheCapacity = 10000
	cacheMaxWord  = 256
)

func (c *wordCache) get(w string) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.m[w]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []int32) {
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string][]int32)
	}
	if len(c.m) < cacheCapacity {
		c.m[w] = ids
	}
	c.mu.Unlock()
}

// encodeWord appends the ids of one pre-token, given as its bytes.
func (t *Tokenizer) encodeWord(ids []int32, w string, sc *scratch) []int32 {
	if w == "" {
		return ids
	}
	if t.ignoreMerges {
		if id, ok := t.vocab.lookup(w); ok {
			return append(ids, id)
		}
	}
	if len(w) == 1 {
		return append(ids, t.byteID[w[0]])
	}
	if len(w) < cacheMaxWord {
		if hit, ok := t.cache.get(w); ok {
			return append(ids, hit...)
		}
	}
	start := len(ids)
	ids = t.bpe(ids, w, sc)
	if len(w) < cacheMaxWord {
		// w is a piece of the caller's text: the cache keeps a copy, not
		// the whole text.
		t.cache.put(strings.Clone(w), append([]int32(nil), ids[start:]...))
	}
	return ids
}

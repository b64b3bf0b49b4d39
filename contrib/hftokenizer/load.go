package hftokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/dlclark/regexp2"
)

// ErrUnsupported is matched (with errors.Is) by the error of a tokenizer
// this package does not encode exactly as Hugging Face tokenizers does: a
// model other than byte-level BPE, or a normalizer, pre-tokenizer,
// post-processor or option it does not implement. The error names what was
// refused.
var ErrUnsupported = errors.New("hftokenizer: unsupported tokenizer")

// The parts of tokenizer.json this package reads.
type tokenizerFile struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         modelJSON        `json:"model"`
}

type addedTokenJSON struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   json.RawMessage `json:"vocab"` // decoded once the type is known
	vocab                   map[string]int32
	Merges                  json.RawMessage `json:"merges"`
}

// component is a normalizer, pre-tokenizer, post-processor or decoder.
type component struct {
	Type string `json:"type"`
	// Sequence
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`
	// Split
	Pattern  *struct{ Regex, String *string } `json:"pattern"`
	Behavior string                           `json:"behavior"`
	Invert   bool                             `json:"invert"`
	// ByteLevel
	AddPrefixSpace *bool `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`
	// TemplateProcessing
	Single        []templatePiece                  `json:"single"`
	SpecialTokens map[string]struct{ IDs []int32 } `json:"special_tokens"`
}

type templatePiece struct {
	SpecialToken *struct{ ID string } `json:"SpecialToken"`
	Sequence     *struct{ ID string } `json:"Sequence"`
}

// gpt2Pattern is the split ByteLevel makes with use_regex (Hugging Face
// tokenizers, pre_tokenizers/byte_level.rs).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// loopPattern makes a split pattern match a run of its consecutive
// matches at once, each captured by group 1: at a position where the
// pattern matches, the loop's next iteration tries the pattern where the
// last match ended, exactly as the next search would, and the loop ends
// (nothing follows it, so nothing backtracks into it) where that search
// would have to skip text. Searching for the loop finds the same matches as
// searching for the pattern again and again, with one search per run
// instead of one per match: a search costs far more in regexp2 than a
// step of the loop.
func loopPattern(expr string) string { return "(?:(" + expr + "))+" }

// Load reads a tokenizer from the contents of its tokenizer.json and
// tokenizer_config.json (nil when the model has none: then there is no chat
// template and no special-token variables). Either may be gzip-compressed.
// A tokenizer this package cannot encode exactly is refused with an error
// matching [ErrUnsupported] that names the model type or the component.
func Load(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	var err error
	if tokenizerJSON, err = gunzipped(tokenizerJSON); err != nil {
		return nil, fmt.Errorf("hftokenizer: tokenizer.json: %w", err)
	}
	var f tokenizerFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("hftokenizer: tokenizer.json: %w", err)
	}
	t, err := build(&f)
	if err != nil {
		return nil, err
	}
	if configJSON != nil {
		if configJSON, err = gunzipped(configJSON); err != nil {
			return nil, fmt.Errorf("hftokenizer: tokenizer_config.json: %w", err)
		}
		if t.config, err = parseConfig(configJSON); err != nil {
			return nil, fmt.Errorf("hftokenizer: tokenizer_config.json: %w", err)
		}
	}
	return t, nil
}

// LoadDir reads tokenizer.json and, when present, tokenizer_config.json from
// a model's directory (each may also be given gzipped, as name.gz), as
// [Load] does. Template files beside them, where newer model repositories
// keep their templates, take the place of tokenizer_config.json's, as
// transformers loads them: chat_template.jinja is the default template,
// additional_chat_templates/NAME.jinja the one named NAME ("tool_use").
func LoadDir(dir string) (*Tokenizer, error) {
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			b, err = os.ReadFile(filepath.Join(dir, name+".gz"))
		}
		return b, err
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("hftokenizer: the model's directory: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("hftokenizer: %s is a file, not the model's directory (the one holding tokenizer.json)", dir)
	}
	tok, err := read("tokenizer.json")
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("hftokenizer: no tokenizer.json or tokenizer.json.gz in %s: %w", dir, os.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("hftokenizer: %w", err)
	}
	cfg, err := read("tokenizer_config.json")
	if errors.Is(err, os.ErrNotExist) {
		cfg, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hftokenizer: %w", err)
	}
	t, err := Load(tok, cfg)
	if err != nil {
		return nil, err
	}
	// Template files take priority over tokenizer_config.json's
	// templates, all of them (transformers' tokenization_utils_base.py,
	// _from_pretrained): chat_template.jinja is the default,
	// additional_chat_templates/NAME.jinja the others.
	files := map[string]string{}
	if src, err := read("chat_template.jinja"); err == nil {
		if src, err = gunzipped(src); err != nil {
			return nil, fmt.Errorf("hftokenizer: chat_template.jinja.gz: %w", err)
		}
		files["default"] = string(src)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("hftokenizer: %w", err)
	}
	// Listed, not globbed: a directory's name may hold a pattern's
	// characters ("[").
	extraDir := filepath.Join(dir, "additional_chat_templates")
	extra, err := os.ReadDir(extraDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("hftokenizer: %w", err)
	}
	for _, e := range extra {
		name, ok := strings.CutSuffix(e.Name(), ".jinja")
		if !ok || e.IsDir() {
			continue
		}
		src, err := os.ReadFile(filepath.Join(extraDir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("hftokenizer: %w", err)
		}
		files[name] = string(src)
	}
	if len(files) > 0 {
		if t.config == nil {
			t.config = &chatConfig{special: map[string]any{}}
		}
		t.config.templates = map[string]string{}
		t.config.compiled = map[string]*compiledTemplate{}
		for name, src := range files {
			tmpl, err := compileTemplate(src)
			if err != nil {
				return nil, fmt.Errorf("%w %q: %w", ErrTemplate, name, err)
			}
			t.config.templates[name] = src
			t.config.compiled[name] = tmpl
		}
	}
	return t, nil
}

func gunzipped(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		return b, nil
	}
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, args...)...)
}

func isNull(m json.RawMessage) bool {
	return len(bytes.TrimSpace(m)) == 0 || string(bytes.TrimSpace(m)) == "null"
}

func build(f *tokenizerFile) (*Tokenizer, error) {
	m := &f.Model
	if m.Type == "" && m.Merges != nil {
		m.Type = "BPE" // older files write no type for BPE
	}
	if m.Type != "BPE" {
		return nil, unsupported("model type %q (only byte-level BPE is encoded)", m.Type)
	}
	if err := json.Unmarshal(m.Vocab, &m.vocab); err != nil {
		return nil, fmt.Errorf("hftokenizer: tokenizer.json: model: vocab: %w", err)
	}
	switch {
	case m.Dropout != nil && *m.Dropout > 0:
		return nil, unsupported("BPE with dropout %g", *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, unsupported("BPE with continuing_subword_prefix %q", *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, unsupported("BPE with end_of_word_suffix %q", *m.EndOfWordSuffix)
	case m.ByteFallback:
		return nil, unsupported("BPE with byte_fallback (a SentencePiece-style BPE)")
	}
	t := &Tokenizer{ignoreMerges: m.IgnoreMerges, vocabSize: len(m.vocab)}
	if err := t.buildPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.buildNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.buildPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if !isNull(f.Decoder) {
		if err := checkDecoder(f.Decoder); err != nil {
			return nil, err
		}
	}
	if err := t.buildModel(m, len(f.AddedTokens)); err != nil {
		return nil, err
	}
	if err := t.buildAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	return t, nil
}

// buildModel reads the model's vocabulary and merges; added is the number
// of added tokens, whose ids follow the vocabulary's.
func (t *Tokenizer) buildModel(m *modelJSON, added int) error {
	// Tokens are kept as the bytes they stand for; a token with a
	// character outside the byte-level alphabet can never come out of a
	// byte-level word and is kept for decoding only. The table is as
	// long as the largest id: ids run from 0, below the number of tokens
	// with the added ones (the added tokens take the ids after the
	// vocabulary's), and an id past them would only cost memory.
	limit := len(m.vocab) + added
	maxID := int32(-1)
	for tok, id := range m.vocab {
		if id < 0 || int(id) >= limit {
			return fmt.Errorf("hftokenizer: tokenizer.json: model: vocab: token %q has id %d, not in [0, %d) (the vocabulary's %d tokens and %d added tokens)", tok, id, limit, len(m.vocab), added)
		}
		maxID = max(maxID, id)
	}
	byID := make([]string, maxID+1)
	for tok, id := range m.vocab {
		byID[id] = tok
	}
	t.vocab = newTokenTable(byID)
	for b := range 256 {
		id, ok := m.vocab[string(byteToRune[b])]
		if !ok {
			return unsupported("BPE vocabulary without the byte-level token for byte %#02x (not a byte-level BPE)", b)
		}
		t.byteID[b] = id
	}
	// Merges are "a b" strings, or [a, b] pairs in newer files.
	var pairs [][2]string
	var joined []string
	if err := json.Unmarshal(m.Merges, &joined); err == nil {
		pairs = make([][2]string, len(joined))
		for i, s := range joined {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return fmt.Errorf("hftokenizer: merge %d (%q) is not a pair", i, s)
			}
			pairs[i] = [2]string{a, b}
		}
	} else if err := json.Unmarshal(m.Merges, &pairs); err != nil {
		return fmt.Errorf("hftokenizer: merges are neither \"a b\" strings nor [a, b] pairs")
	}
	t.merges = make(map[uint64]mergeInfo, len(pairs))
	for rank, p := range pairs {
		a, b := p[0], p[1]
		ia, oka := m.vocab[a]
		ib, okb := m.vocab[b]
		in, okn := m.vocab[a+b]
		if !oka || !okb || !okn {
			return fmt.Errorf("hftokenizer: merge %d (%q %q) has a token out of the vocabulary", rank, a, b)
		}
		k := pairKey(ia, ib)
		if _, dup := t.merges[k]; !dup {
			t.merges[k] = mergeInfo{rank: int32(rank), id: in}
		}
	}
	return nil
}

func (t *Tokenizer) buildNormalizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("hftokenizer: normalizer: %w", err)
	}
	switch c.Type {
	case "NFC":
		t.nfc = true
		return nil
	case "Sequence":
		for _, n := range c.Normalizers {
			if err := t.buildNormalizer(n); err != nil {
				return err
			}
		}
		return nil
	}
	return unsupported("normalizer %q", c.Type)
}

func (t *Tokenizer) buildPreTokenizer(raw json.RawMessage) error {
	if isNull(raw) {
		return unsupported("BPE without a pre-tokenizer (not byte-level)")
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("hftokenizer: pre_tokenizer: %w", err)
	}
	steps := []component{c}
	if c.Type == "Sequence" {
		steps = steps[:0]
		for _, r := range c.PreTokenizers {
			var s component
			if err := json.Unmarshal(r, &s); err != nil {
				return fmt.Errorf("hftokenizer: pre_tokenizer: %w", err)
			}
			steps = append(steps, s)
		}
	}
	byteLevel := false
	for i, s := range steps {
		switch s.Type {
		case "Split":
			if byteLevel {
				return unsupported("pre-tokenizer Split after ByteLevel")
			}
			if s.Invert {
				return unsupported("pre-tokenizer Split with invert")
			}
			if s.Behavior != "Isolated" {
				return unsupported("pre-tokenizer Split with behavior %q", s.Behavior)
			}
			if s.Pattern == nil || (s.Pattern.Regex == nil) == (s.Pattern.String == nil) {
				return fmt.Errorf("hftokenizer: pre_tokenizer: Split without a pattern")
			}
			expr := ""
			if s.Pattern.Regex != nil {
				expr = *s.Pattern.Regex
			} else {
				expr = regexp2.Escape(*s.Pattern.String)
			}
			re, err := regexp2.Compile(loopPattern(expr), regexp2.None)
			if err != nil {
				return unsupported("pre-tokenizer Split pattern %q: %v", expr, err)
			}
			t.splits = append(t.splits, re)
		case "ByteLevel":
			if i != len(steps)-1 {
				return unsupported("pre-tokenizer ByteLevel before other pre-tokenizers")
			}
			if s.AddPrefixSpace != nil && *s.AddPrefixSpace {
				return unsupported("pre-tokenizer ByteLevel with add_prefix_space")
			}
			if s.UseRegex == nil || *s.UseRegex {
				t.splits = append(t.splits, regexp2.MustCompile(loopPattern(gpt2Pattern), regexp2.None))
			}
			byteLevel = true
		default:
			return unsupported("pre-tokenizer %q", s.Type)
		}
	}
	if !byteLevel {
		return unsupported("BPE without a ByteLevel pre-tokenizer (not byte-level)")
	}
	return nil
}

func (t *Tokenizer) buildPostProcessor(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("hftokenizer: post_processor: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return nil // changes offsets only
	case "Sequence":
		for _, p := range c.Processors {
			if err := t.buildPostProcessor(p); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		if t.postSet {
			return unsupported("post-processor with two templates")
		}
		t.postSet = true
		seen := false
		for _, p := range c.Single {
			switch {
			case p.SpecialToken != nil:
				st, ok := c.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("hftokenizer: post_processor: special token %q not defined", p.SpecialToken.ID)
				}
				if seen {
					t.suffix = append(t.suffix, st.IDs...)
				} else {
					t.prefix = append(t.prefix, st.IDs...)
				}
			case p.Sequence != nil:
				if seen || p.Sequence.ID != "A" {
					return unsupported("post-processor template with sequence %q", p.Sequence.ID)
				}
				seen = true
			}
		}
		if !seen {
			return unsupported("post-processor template without its sequence")
		}
		return nil
	}
	return unsupported("post-processor %q", c.Type)
}

func checkDecoder(raw json.RawMessage) error {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("hftokenizer: decoder: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		for _, d := range c.Decoders {
			if err := checkDecoder(d); err != nil {
				return err
			}
		}
		return nil
	}
	return unsupported("decoder %q", c.Type)
}

func (t *Tokenizer) buildAdded(list []addedTokenJSON) error {
	t.special = make(map[int32]bool)
	t.addedContent = make(map[int32]string)
	for _, a := range list {
		switch {
		case a.Content == "":
			return fmt.Errorf("hftokenizer: added token %d is empty", a.ID)
		case a.SingleWord || a.LStrip || a.RStrip:
			return unsupported("added token %q with single_word, lstrip or rstrip", a.Content)
		case a.ID < 0:
			return fmt.Errorf("hftokenizer: added token %q has id %d", a.Content, a.ID)
		}
		if a.Special {
			t.special[a.ID] = true
		}
		t.addedContent[a.ID] = a.Content
		if a.Normalized {
			// Matched on the normalized text, as its normalized form.
			t.addedNormalized.add(t.normalize(a.Content), a.ID)
		} else {
			t.addedRaw.add(a.Content, a.ID)
		}
	}
	return nil
}

package hftokenizer

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode checks that encoding never panics and that decoding gives the
// text back: as given for Llama 3's tokenizers, in NFC for Qwen3's, whose
// normalizer is NFC.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "hello world", " \n\t\r\n  ", "I'M 12345 <|eot_id|><|im_end|>", "👨‍👩‍👧‍👦 e\u0301", "\xff\xfe", strings.Repeat("ab ", 100)} {
		f.Add(s)
	}
	toks := models(f)
	f.Fuzz(func(t *testing.T, s string) {
		for _, name := range goldenModels {
			tok := toks[name]
			_ = tok.Encode(s, true)
			ids := tok.Encode(s, false)
			if !utf8.ValidString(s) {
				continue
			}
			want := s
			if tok.nfc {
				want = norm.NFC.String(s)
			}
			if got := tok.Decode(ids, false); got != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", name, s, got)
			}
		}
	})
}

func TestDecodeSkipsSpecialTokens(t *testing.T) {
	tok := models(t)["llama3_1"]
	ids := tok.Encode("<|start_header_id|>user<|end_header_id|>hi", true)
	if got := tok.Decode(ids, true); got != "userhi" {
		t.Errorf("Decode(skip special) = %q", got)
	}
	if got := tok.Decode(ids, false); got != "<|begin_of_text|><|start_header_id|>user<|end_header_id|>hi" {
		t.Errorf("Decode = %q", got)
	}
}

// TestUnsupported checks that a tokenizer of another kind is refused, its
// model type or component named.
func TestUnsupported(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}`, `model type "Unigram"`},
		{`{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`, `model type "WordPiece"`},
		{`{"model": {"type": "WordLevel", "vocab": {"a": 0}}}`, `model type "WordLevel"`},
		{`{"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0}, "merges": []},
		  "pre_tokenizer": {"type": "Metaspace"}}`, `byte_fallback`},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
		  "pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}}`, `pre-tokenizer "Metaspace"`},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
		  "pre_tokenizer": {"type": "BertPreTokenizer"}}`, `pre-tokenizer "BertPreTokenizer"`},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"},
		  "normalizer": {"type": "Lowercase"}}`, `normalizer "Lowercase"`},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"},
		  "post_processor": {"type": "RobertaProcessing"}}`, `post-processor "RobertaProcessing"`},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true}}`, `add_prefix_space`},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}}`, `byte-level token for byte`},
	} {
		_, err := Load([]byte(c.json), nil)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%s) = %v, want ErrUnsupported naming %s", c.json, err, c.want)
		}
	}
}

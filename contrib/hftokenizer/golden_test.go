package hftokenizer

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// The models of the golden data (scripts/hftokenizer-golden): testdata/<name>.
var goldenModels = []string{"llama3", "llama3_1", "qwen3"}

var (
	loadOnce sync.Once
	loaded   map[string]*Tokenizer
	loadErr  error
)

// models loads the golden models once for every test.
func models(t testing.TB) map[string]*Tokenizer {
	t.Helper()
	loadOnce.Do(func() {
		loaded = make(map[string]*Tokenizer)
		for _, name := range goldenModels {
			tok, err := loadModel(name)
			if err != nil {
				loadErr = err
				return
			}
			loaded[name] = tok
		}
	})
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return loaded
}

// loadModel loads testdata/<name>. A model whose tokenizer.json differs
// from llama3's only in its post-processor (llama3_1, whose post-processor
// adds Llama 3.1's BOS) keeps that post-processor alone, as
// post_processor.json, and no tokenizer.json of its own (gen.cjs checks
// that nothing else differs): its tokenizer.json is llama3's with that
// post-processor.
func loadModel(name string) (*Tokenizer, error) {
	dir := filepath.Join("testdata", name)
	post, err := os.ReadFile(filepath.Join(dir, "post_processor.json"))
	if errors.Is(err, os.ErrNotExist) {
		return LoadDir(dir)
	}
	if err != nil {
		return nil, err
	}
	base, err := os.ReadFile(filepath.Join("testdata", "llama3", "tokenizer.json.gz"))
	if err != nil {
		return nil, err
	}
	if base, err = gunzipped(base); err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(base, &fields); err != nil {
		return nil, err
	}
	fields["post_processor"] = post
	tok, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json.gz"))
	if err != nil {
		return nil, err
	}
	return Load(tok, cfg)
}

// readJSONL decodes each line of a gzipped JSON-lines file into a new T.
func readJSONL[T any](t testing.TB, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	sc := bufio.NewScanner(z)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

type encodeCase struct {
	Text    string             `json:"text"`
	IDs     map[string][]int32 `json:"ids"`
	Special map[string][]int32 `json:"special"`
}

// TestEncodeGolden checks every string of the corpus against the ids Hugging
// Face tokenizers gave, with and without special tokens, for each model.
func TestEncodeGolden(t *testing.T) {
	toks := models(t)
	cases := readJSONL[encodeCase](t, "testdata/encode.jsonl.gz")
	if len(cases) < 3000 {
		t.Fatalf("the corpus has %d strings", len(cases))
	}
	for _, name := range goldenModels {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			encodeGolden(t, toks[name], name, cases)
		})
	}
}

func encodeGolden(t *testing.T, tok *Tokenizer, name string, cases []encodeCase) {
	{
		bad := 0
		for _, c := range cases {
			want := c.IDs[name]
			if got := tok.Encode(c.Text, false); !slices.Equal(got, want) {
				if bad++; bad <= 10 {
					t.Errorf("%s: Encode(%q, false) =\n%v, want\n%v", name, trim(c.Text), got, want)
				}
			}
			if s, ok := c.Special[name]; ok {
				want = s
			}
			if got := tok.Encode(c.Text, true); !slices.Equal(got, want) {
				if bad++; bad <= 10 {
					t.Errorf("%s: Encode(%q, true) =\n%v, want\n%v", name, trim(c.Text), got, want)
				}
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d encodings differ", name, bad, 2*len(cases))
		}
	}
}

func trim(s string) string {
	if r := []rune(s); len(r) > 80 {
		return string(r[:80]) + "…"
	}
	return s
}

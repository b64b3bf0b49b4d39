package vllmhash

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// repeatSpec is how the fixtures write long inputs: a value repeated.
type repeatSpec struct {
	Value json.RawMessage `json:"value"`
	Count int             `json:"count"`
}

// mooncakeFixture is the shape of Mooncake's hash_golden_vectors*.json.
type mooncakeFixture struct {
	Generator string `json:"generator"`
	Profile   struct {
		Algorithm string `json:"algorithm"`
		Seed      string `json:"python_hash_seed"`
		Root      string `json:"root_digest"`
	} `json:"profile"`
	Roots []struct {
		Seed       string `json:"python_hash_seed"`
		PickleHex  string `json:"pickle_hex"`
		CBORHex    string `json:"canonical_cbor_hex"`
		RootDigest string `json:"root_digest"`
	} `json:"seed_root_vectors"`
	Cases []struct {
		Name        string      `json:"name"`
		BlockSize   int         `json:"block_size"`
		LoRAName    string      `json:"lora_name"`
		LoRARepeat  *repeatSpec `json:"lora_name_repeat"`
		CacheSalt   *string     `json:"cache_salt"`
		TokenIDs    []int32     `json:"token_ids"`
		TokenRepeat *repeatSpec `json:"token_ids_repeat"`
		Expected    []struct {
			Digest    string `json:"digest"`
			PickleHex string `json:"pickle_hex"`
		} `json:"expected"`
	} `json:"cases"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// blockEncoding returns the bytes block i of tokens is hashed over.
func blockEncoding(t *testing.T, h *Hasher, bs int, tokens []int32, extra ExtraKeys, i int) []byte {
	t.Helper()
	c, err := h.NewChain(bs, extra)
	if err != nil {
		t.Fatal(err)
	}
	c.Append(tokens[:i*bs])
	c.extraKeys(i*bs, (i+1)*bs, false)
	if h.alg.usesCBOR() {
		return bytes.Clone(c.encodeCBOR(c.parent(), tokens[i*bs:(i+1)*bs]))
	}
	return bytes.Clone(c.encodePickle(c.parent(), tokens[i*bs:(i+1)*bs]))
}

// TestMooncakeVectors checks the vectors Mooncake's conductor ships,
// produced with vLLM 0.22's recipe (testdata/PROVENANCE.md).
func TestMooncakeVectors(t *testing.T) {
	for _, file := range []string{"testdata/mooncake_hash_golden_vectors_sha256.json", "testdata/mooncake_hash_golden_vectors.json"} {
		var f mooncakeFixture
		readJSON(t, file, &f)
		alg, err := ParseAlgorithm(f.Profile.Algorithm)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(alg.String(), func(t *testing.T) {
			for _, r := range f.Roots {
				h, err := NewHasher(alg, r.Seed)
				if err != nil {
					t.Fatal(err)
				}
				if got := hex.EncodeToString(h.Root()); got != r.RootDigest {
					t.Errorf("seed %q: root %s, want %s", r.Seed, got, r.RootDigest)
				}
				if r.PickleHex != "" {
					var p pickler
					p.begin()
					p.saveStr(r.Seed)
					if got := hex.EncodeToString(p.end()); got != r.PickleHex {
						t.Errorf("seed %q: pickle %s, want %s", r.Seed, got, r.PickleHex)
					}
				}
			}
			h, err := NewHasher(alg, f.Profile.Seed)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(h.Root()); got != f.Profile.Root {
				t.Fatalf("profile root %s, want %s", got, f.Profile.Root)
			}
			for _, c := range f.Cases {
				tokens := c.TokenIDs
				if c.TokenRepeat != nil {
					var v int32
					if err := json.Unmarshal(c.TokenRepeat.Value, &v); err != nil {
						t.Fatal(err)
					}
					tokens = make([]int32, c.TokenRepeat.Count)
					for i := range tokens {
						tokens[i] = v
					}
				}
				extra := ExtraKeys{LoRAName: c.LoRAName}
				if c.LoRARepeat != nil {
					var v string
					if err := json.Unmarshal(c.LoRARepeat.Value, &v); err != nil {
						t.Fatal(err)
					}
					extra.LoRAName = strings.Repeat(v, c.LoRARepeat.Count)
				}
				if c.CacheSalt != nil {
					extra.CacheSalt = *c.CacheSalt
				}
				got, err := h.Hash(c.BlockSize, tokens, extra)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(c.Expected) {
					t.Errorf("%s: %d hashes, want %d", c.Name, len(got), len(c.Expected))
					continue
				}
				for i, e := range c.Expected {
					if g := hex.EncodeToString(got[i]); g != e.Digest {
						t.Errorf("%s: block %d: %s, want %s", c.Name, i, g, e.Digest)
					}
					if e.PickleHex != "" {
						enc := blockEncoding(t, h, c.BlockSize, tokens, extra, i)
						if g := hex.EncodeToString(enc); g != e.PickleHex {
							t.Errorf("%s: block %d pickle:\n got %s\nwant %s", c.Name, i, g, e.PickleHex)
						}
					}
				}
			}
			t.Logf("%s: %d roots, %d cases", file, len(f.Roots), len(f.Cases))
		})
	}
}

// generatedFile is the shape of testdata/generated_vectors.json, written by
// scripts/vllmhash-vectors.py.
type generatedFile struct {
	Python string `json:"python"`
	CBOR2  string `json:"cbor2"`
	XXHash string `json:"xxhash"`
	Roots  []struct {
		Algorithm string `json:"algorithm"`
		Seed      string `json:"seed"`
		Root      string `json:"root"`
	} `json:"roots"`
	Cases []struct {
		Name        string            `json:"name"`
		Algorithm   string            `json:"algorithm"`
		Seed        string            `json:"seed"`
		BlockSize   int               `json:"block_size"`
		Tokens      json.RawMessage   `json:"tokens"`
		LoRA        json.RawMessage   `json:"lora"`
		Salt        json.RawMessage   `json:"salt"`
		MM          []json.RawMessage `json:"mm"`
		Hashes      []string          `json:"hashes"`
		FirstEnc    string            `json:"first_encoding"`
		FirstEncSum string            `json:"first_encoding_sha256"`
	} `json:"cases"`
}

// cycleSpec is the generator's long-input form: a value cycled to a length.
type cycleSpec struct {
	Cycle json.RawMessage `json:"cycle"`
	Count int             `json:"count"`
}

func genTokens(t *testing.T, raw json.RawMessage) []int32 {
	t.Helper()
	var list []int32
	if json.Unmarshal(raw, &list) == nil {
		return list
	}
	var spec cycleSpec
	var cyc []int32
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(spec.Cycle, &cyc); err != nil {
		t.Fatal(err)
	}
	out := make([]int32, spec.Count)
	for i := range out {
		out[i] = cyc[i%len(cyc)]
	}
	return out
}

func genString(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var spec cycleSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(spec.Cycle, &s); err != nil {
		t.Fatal(err)
	}
	return strings.Repeat(s, spec.Count/len(s)+1)[:spec.Count]
}

// TestGeneratedVectors checks vectors computed by CPython's pickle, cbor2
// and xxhash (scripts/vllmhash-vectors.py): every algorithm, several seeds
// and block sizes, LoRA names, cache salts, multimodal items, and the
// pickle's framing of large blocks and strings.
func TestGeneratedVectors(t *testing.T) {
	var f generatedFile
	readJSON(t, "testdata/generated_vectors.json", &f)
	t.Logf("generated by Python %s, cbor2 %s, xxhash %s: %d roots, %d cases", f.Python, f.CBOR2, f.XXHash, len(f.Roots), len(f.Cases))
	if len(f.Cases) < 100 {
		t.Fatalf("only %d cases", len(f.Cases))
	}
	for _, r := range f.Roots {
		alg, err := ParseAlgorithm(r.Algorithm)
		if err != nil {
			t.Fatal(err)
		}
		h, err := NewHasher(alg, r.Seed)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(h.Root()); got != r.Root {
			t.Errorf("%s seed %q: root %s, want %s", alg, r.Seed, got, r.Root)
		}
	}
	for _, c := range f.Cases {
		alg, err := ParseAlgorithm(c.Algorithm)
		if err != nil {
			t.Fatal(err)
		}
		h, err := NewHasher(alg, c.Seed)
		if err != nil {
			t.Fatal(err)
		}
		tokens := genTokens(t, c.Tokens)
		extra := ExtraKeys{LoRAName: genString(t, c.LoRA), CacheSalt: genString(t, c.Salt)}
		for _, m := range c.MM {
			var item []json.RawMessage
			if err := json.Unmarshal(m, &item); err != nil || len(item) != 3 {
				t.Fatalf("%s: bad mm item %s", c.Name, m)
			}
			var mi MultimodalItem
			mi.Identifier = genString(t, item[0])
			if json.Unmarshal(item[1], &mi.Offset) != nil || json.Unmarshal(item[2], &mi.Length) != nil {
				t.Fatalf("%s: bad mm item %s", c.Name, m)
			}
			extra.Multimodal = append(extra.Multimodal, mi)
		}
		name := alg.String() + "/" + c.Name
		got, err := h.Hash(c.BlockSize, tokens, extra)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != len(c.Hashes) {
			t.Errorf("%s: %d hashes, want %d", name, len(got), len(c.Hashes))
			continue
		}
		for i, want := range c.Hashes {
			if g := hex.EncodeToString(got[i]); g != want {
				t.Errorf("%s: block %d: %s, want %s", name, i, g, want)
				break
			}
		}
		if len(c.Hashes) == 0 {
			continue
		}
		enc := blockEncoding(t, h, c.BlockSize, tokens, extra, 0)
		if c.FirstEnc != "" {
			if g := hex.EncodeToString(enc); g != c.FirstEnc {
				t.Errorf("%s: first block encoding:\n got %s\nwant %s", name, g, c.FirstEnc)
			}
		} else {
			sum := sha256.Sum256(enc)
			if g := hex.EncodeToString(sum[:]); g != c.FirstEncSum {
				t.Errorf("%s: first block encoding (%d bytes) has SHA-256 %s, want %s", name, len(enc), g, c.FirstEncSum)
			}
		}
	}
}

// requestFile is the shape of testdata/request_vectors.json, written by
// scripts/vllmhash-vectors.py.
type requestFile struct {
	Python string `json:"python"`
	Cases  []struct {
		Name         string            `json:"name"`
		Algorithm    string            `json:"algorithm"`
		Seed         string            `json:"seed"`
		BlockSize    int               `json:"block_size"`
		Prompt       json.RawMessage   `json:"prompt"`
		Generated    json.RawMessage   `json:"generated"`
		LoRA         string            `json:"lora"`
		Salt         *string           `json:"salt"`
		MM           []json.RawMessage `json:"mm"`
		Hashes       []string          `json:"hashes"`
		PromptBlocks int               `json:"prompt_blocks"`
		Differs      bool              `json:"prompt_path_differs"`
		FirstEnc     string            `json:"first_encoding"`
		FirstEncSum  string            `json:"first_encoding_sha256"`
		GenEnc       string            `json:"generated_encoding"`
		GenEncSum    string            `json:"generated_encoding_sha256"`
	} `json:"cases"`
}

// requestBlockEncoding returns the bytes block i of a request is hashed
// over: the prompt appended, then the generated tokens.
func requestBlockEncoding(t *testing.T, h *Hasher, bs int, prompt, generated []int32, extra ExtraKeys, i int) []byte {
	t.Helper()
	c, err := h.NewChain(bs, extra)
	if err != nil {
		t.Fatal(err)
	}
	start, end := i*bs, (i+1)*bs
	if start <= len(prompt) {
		c.Append(prompt[:start])
	} else {
		c.Append(prompt)
		c.AppendGenerated(generated[:start-len(prompt)]...)
	}
	if c.Len() != i {
		t.Fatalf("chain of %d blocks before block %d", c.Len(), i)
	}
	all := append(append([]int32(nil), prompt...), generated...)
	c.extraKeys(start, end, end > len(prompt))
	if h.alg.usesCBOR() {
		return bytes.Clone(c.encodeCBOR(c.parent(), all[start:end]))
	}
	return bytes.Clone(c.encodePickle(c.parent(), all[start:end]))
}

// checkEncoding compares enc with a vector's encoding, given in full or as
// its SHA-256.
func checkEncoding(t *testing.T, what string, enc []byte, full, sum string) {
	t.Helper()
	switch {
	case full != "":
		if g := hex.EncodeToString(enc); g != full {
			t.Errorf("%s:\n got %s\nwant %s", what, g, full)
		}
	case sum != "":
		s := sha256.Sum256(enc)
		if g := hex.EncodeToString(s[:]); g != sum {
			t.Errorf("%s (%d bytes) has SHA-256 %s, want %s", what, len(enc), g, sum)
		}
	default:
		t.Errorf("%s: the vector has no encoding", what)
	}
}

// TestRequestVectors checks vectors of whole vLLM requests computed by
// CPython (scripts/vllmhash-vectors.py): the prompt hashed as the request
// is made, then generated tokens appended one at a time through vLLM's
// request block hasher, and extra keys repeating strings CPython shares,
// which its pickle writes as memo lookups. Each case is replayed token by
// token and with all generated tokens at once; the encodings of the first
// block and of the first block generated tokens completed are compared
// byte for byte. A case marked prompt_path_differs must hash differently
// as one prompt, so the vectors do exercise the generated-block rule.
func TestRequestVectors(t *testing.T) {
	var f requestFile
	readJSON(t, "testdata/request_vectors.json", &f)
	t.Logf("generated by Python %s: %d cases", f.Python, len(f.Cases))
	differing := map[string]int{}
	for _, c := range f.Cases {
		alg, err := ParseAlgorithm(c.Algorithm)
		if err != nil {
			t.Fatal(err)
		}
		h, err := NewHasher(alg, c.Seed)
		if err != nil {
			t.Fatal(err)
		}
		name := alg.String() + "/" + c.Name
		prompt, generated := genTokens(t, c.Prompt), genTokens(t, c.Generated)
		extra := ExtraKeys{LoRAName: c.LoRA}
		if c.Salt != nil {
			extra.CacheSalt = *c.Salt
		}
		for _, m := range c.MM {
			var item []json.RawMessage
			var mi MultimodalItem
			if json.Unmarshal(m, &item) != nil || len(item) != 3 || json.Unmarshal(item[0], &mi.Identifier) != nil ||
				json.Unmarshal(item[1], &mi.Offset) != nil || json.Unmarshal(item[2], &mi.Length) != nil {
				t.Fatalf("%s: bad mm item %s", name, m)
			}
			extra.Multimodal = append(extra.Multimodal, mi)
		}
		one, err := h.NewChain(c.BlockSize, extra)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		one.Append(prompt)
		if one.Len() != c.PromptBlocks {
			t.Errorf("%s: the prompt filled %d blocks, want %d", name, one.Len(), c.PromptBlocks)
		}
		n := one.Len()
		for _, tok := range generated {
			n += one.AppendGenerated(tok)
		}
		all, err := h.NewChain(c.BlockSize, extra)
		if err != nil {
			t.Fatal(err)
		}
		all.Append(prompt)
		all.AppendGenerated(generated...)
		if n != one.Len() || one.Len() != len(c.Hashes) || all.Len() != len(c.Hashes) {
			t.Errorf("%s: %d blocks (%d counted), %d at once, want %d", name, one.Len(), n, all.Len(), len(c.Hashes))
			continue
		}
		for i, want := range c.Hashes {
			if g := hex.EncodeToString(one.Hash(i)); g != want {
				t.Errorf("%s: block %d: %s, want %s", name, i, g, want)
				break
			}
			if !bytes.Equal(all.Hash(i), one.Hash(i)) {
				t.Errorf("%s: block %d differs with all generated tokens at once", name, i)
				break
			}
		}
		if len(c.Hashes) > 0 {
			checkEncoding(t, name+": block 0 encoding", requestBlockEncoding(t, h, c.BlockSize, prompt, generated, extra, 0), c.FirstEnc, c.FirstEncSum)
		}
		if len(c.Hashes) > c.PromptBlocks {
			checkEncoding(t, name+": first generated block's encoding",
				requestBlockEncoding(t, h, c.BlockSize, prompt, generated, extra, c.PromptBlocks), c.GenEnc, c.GenEncSum)
		}
		asPrompt, err := h.Hash(c.BlockSize, append(append([]int32(nil), prompt...), generated...), extra)
		if err != nil {
			t.Fatal(err)
		}
		same := len(asPrompt) == one.Len()
		for i := 0; same && i < len(asPrompt); i++ {
			same = bytes.Equal(asPrompt[i], one.Hash(i))
		}
		if same == c.Differs {
			t.Errorf("%s: hashed as one prompt, same hashes: %v; the vector says differs: %v", name, same, c.Differs)
		}
		if c.Differs {
			differing[alg.String()]++
		}
	}
	for _, a := range allAlgorithms {
		if differing[a.String()] < 5 {
			t.Errorf("%v: only %d cases where generated blocks hash differently from a prompt's", a, differing[a.String()])
		}
	}
}

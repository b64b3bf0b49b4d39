package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/umbp-go/umbp-go/contrib/hftokenizer"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

// qwen3 is a model's tokenizer files, as the tokenizer's own tests have
// them (gzipped).
const qwen3 = "../../contrib/hftokenizer/testdata/qwen3"

// keyerFor is the keyer the flags -ns demo -seed 0 describe.
func keyerFor(t *testing.T) *umbp.TokenKeyer {
	t.Helper()
	hasher, err := vllmhash.NewHasher(vllmhash.SHA256, "0")
	if err != nil {
		t.Fatal(err)
	}
	k, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{Namespace: "demo", Groups: []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}}, Hasher: hasher})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// key text and key request write the keys the library makes of the
// tokens the model's tokenizer gives, for a prompt's text and for a chat
// request as vLLM renders it.
func TestKeyTextAndRequest(t *testing.T) {
	if _, err := os.Stat(qwen3); err != nil {
		t.Skipf("no tokenizer files at %s (a module alone): %v", qwen3, err)
	}
	tok, err := hftokenizer.LoadDir(qwen3)
	if err != nil {
		t.Fatal(err)
	}
	keyer := keyerFor(t)
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 12)

	want, err := keyer.Keys(tok.Encode(text, true), vllmhash.ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Keys) == 0 {
		t.Fatal("the text makes no full block")
	}
	// Each run loads the tokenizer (seconds under the race detector): the
	// text once from standard input, the request once from a file.
	stdout, _ := mustRun(t, exitOK, text, "key", "text", "-tokenizer", qwen3, "-ns", "demo", "-seed", "0")
	if got := strings.Fields(stdout); strings.Join(got, "\n") != strings.Join(want.Keys, "\n") {
		t.Fatalf("key text:\n%s\nwant\n%s", stdout, strings.Join(want.Keys, "\n"))
	}

	body := `{"model": "qwen3", "messages": [{"role": "system", "content": "` + text + `"}, {"role": "user", "content": "Where does the fox go?"}]}`
	prompts, err := tok.RequestKeys(keyer, []byte(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "request.json")
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, _ = mustRun(t, exitOK, "", "key", "request", "-tokenizer", qwen3, "-ns", "demo", "-seed", "0", file)
	if got := strings.Fields(stdout); strings.Join(got, "\n") != strings.Join(prompts[0].Keys, "\n") {
		t.Fatalf("key request:\n%s\nwant\n%s", stdout, strings.Join(prompts[0].Keys, "\n"))
	}

	// The mistakes a user makes are usage errors that say what is wrong.
	_, stderr := mustRun(t, exitUsage, "x", "key", "text", "-ns", "demo", "-seed", "0", "x")
	mustContain(t, "key text without -tokenizer", stderr, "-tokenizer is required")
	_, stderr = mustRun(t, exitUsage, "", "key", "text", "-tokenizer", t.TempDir(), "-ns", "demo", "-seed", "0", "x")
	mustContain(t, "key text with a directory of no tokenizer", stderr, "-tokenizer", "tokenizer.json")
	_, stderr = mustRun(t, exitUsage, `{"messages": "not a list"}`, "key", "request", "-tokenizer", qwen3, "-ns", "demo", "-seed", "0")
	mustContain(t, "key request with a bad body", stderr, "messages")
	mustRun(t, exitUsage, "", "key", "request", "-tokenizer", qwen3, "-ns", "demo", "-seed", "0", "-special=false", file)
}

package hftokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

type chatCase struct {
	Name    string             `json:"name"`
	Request json.RawMessage    `json:"request"`
	Render  map[string]string  `json:"render"`
	IDs     map[string][]int32 `json:"ids"`
	Error   map[string]string  `json:"error"`
}

// chatSetups are the golden data's chat setups: a tokenizer and the
// engine's options. llama3_1-tools is Llama 3.1's tokenizer with vLLM's
// tool-calling template (testdata/README.md), at the clock the oracle's
// strftime_now had.
func chatSetups(t testing.TB) map[string]struct {
	tok  *Tokenizer
	opts *RequestOptions
} {
	toks := models(t)
	tmpl, err := os.ReadFile("testdata/tool_chat_template_llama3.1_json.jinja")
	if err != nil {
		t.Fatal(err)
	}
	type setup = struct {
		tok  *Tokenizer
		opts *RequestOptions
	}
	return map[string]setup{
		"llama3":   {toks["llama3"], nil},
		"llama3_1": {toks["llama3_1"], nil},
		"qwen3":    {toks["qwen3"], nil},
		"llama3_1-tools": {toks["llama3_1"], &RequestOptions{
			ChatTemplate: string(tmpl),
			Now:          func() time.Time { return time.Date(2024, 7, 26, 12, 0, 0, 0, time.UTC) },
		}},
	}
}

// TestChatGolden checks each chat request's render and ids against the
// oracles' (or that it fails where the template raises).
func TestChatGolden(t *testing.T) {
	cases := readJSONL[chatCase](t, "testdata/chat.jsonl.gz")
	if len(cases) < 20 {
		t.Fatalf("%d chat cases", len(cases))
	}
	bad := map[string]int{}
	for name, s := range chatSetups(t) {
		for _, c := range cases {
			p, err := s.tok.RequestPrompts(c.Request, s.opts)
			if want, ok := c.Error[name]; ok {
				if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), want) {
					bad[name]++
					t.Errorf("%s/%s: err = %v, want the template's %q", name, c.Name, err, want)
				}
				continue
			}
			if err != nil {
				bad[name]++
				t.Errorf("%s/%s: %v", name, c.Name, err)
				continue
			}
			if len(p) != 1 || p[0].Text != c.Render[name] {
				bad[name]++
				t.Errorf("%s/%s: render\n%q\nwant\n%q", name, c.Name, p[0].Text, c.Render[name])
				continue
			}
			if !slices.Equal(p[0].Tokens, c.IDs[name]) {
				bad[name]++
				t.Errorf("%s/%s: ids %v, want %v", name, c.Name, p[0].Tokens, c.IDs[name])
			}
		}
	}
	for name, n := range bad {
		t.Errorf("%s: %d of %d chat cases differ", name, n, len(cases))
	}
}

// TestChatConcurrent renders the golden chats from several goroutines at
// once: tokenizer, templates and caches are shared.
func TestChatConcurrent(t *testing.T) {
	cases := readJSONL[chatCase](t, "testdata/chat.jsonl.gz")
	setups := chatSetups(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(cases))
	for g := range 4 {
		wg.Go(func() {
			name := []string{"qwen3", "llama3_1-tools", "llama3", "qwen3"}[g]
			s := setups[name]
			for i, c := range cases {
				if i%2 != g%2 {
					continue // half the cases each: enough to share everything
				}
				p, err := s.tok.RequestPrompts(c.Request, s.opts)
				if _, fails := c.Error[name]; fails {
					continue
				}
				if err != nil || p[0].Text != c.Render[name] {
					errs <- fmt.Errorf("%s/%s: %v", name, c.Name, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

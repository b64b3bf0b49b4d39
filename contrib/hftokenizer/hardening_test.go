package hftokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/parser"
	"go.uber.org/goleak"
)

// tinyJSON is a tokenizer.json of the 256 byte-level tokens (ids 0 to
// 255), no merges, and the extra vocabulary and added tokens given.
func tinyJSON(t testing.TB, extra map[string]int, added []addedTokenJSON) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := range 256 {
		vocab[string(byteToRune[b])] = b
	}
	maps.Copy(vocab, extra)
	if added == nil {
		added = []addedTokenJSON{}
	}
	b, err := json.Marshal(map[string]any{
		"added_tokens":  added,
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
		"pre_tokenizer": map[string]any{"type": "ByteLevel"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func tinyTokenizer(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Load(tinyJSON(t, nil, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// The word cache keeps copies of the words, not pieces of the text they
// came from (which would keep the whole text alive).
func TestWordCacheKeepsNoText(t *testing.T) {
	tok := tinyTokenizer(t)
	text := strings.Repeat("hello world again ", 3)
	tok.Encode(text, false)
	if len(tok.cache.m) == 0 {
		t.Fatal("nothing cached")
	}
	start := uintptr(unsafe.Pointer(unsafe.StringData(text)))
	for k := range tok.cache.m {
		if p := uintptr(unsafe.Pointer(unsafe.StringData(k))); p >= start && p < start+uintptr(len(text)) {
			t.Errorf("cached word %q points into the encoded text", k)
		}
	}
}

// Arrays and objects nest at most 10000 deep, as in encoding/json; deeper
// is a bad request, not a stack overflow.
func TestDecodeJSONDepth(t *testing.T) {
	nested := func(n int) []byte {
		return []byte(strings.Repeat("[", n) + strings.Repeat("]", n))
	}
	if _, err := decodeJSON(nested(maxNesting), &keyOrder{}); err != nil {
		t.Errorf("%d deep: %v", maxNesting, err)
	}
	if _, err := decodeJSON(nested(maxNesting+1), &keyOrder{}); err == nil {
		t.Errorf("%d deep: no error", maxNesting+1)
	}
	body := append([]byte(`{"prompt": `), bytes.Repeat([]byte("["), 3_000_000)...)
	_, err := tinyTokenizer(t).RequestPrompts(body, nil)
	if !errors.Is(err, ErrRequest) || !strings.Contains(err.Error(), "nested") {
		t.Errorf("3M nested arrays: %v, want a request error", err)
	}
}

// Only whitespace may follow the body's JSON value, as json.loads has it.
func TestRequestTrailingData(t *testing.T) {
	tok := tinyTokenizer(t)
	for _, body := range []string{`{"prompt": "a"} x`, `{"prompt": "a"}}`, `{"prompt": "a"} {}`, `{"prompt": "a"}]`} {
		if _, err := tok.RequestPrompts([]byte(body), nil); !errors.Is(err, ErrRequest) {
			t.Errorf("%s: %v, want a request error", body, err)
		}
	}
	if _, err := tok.RequestPrompts([]byte("{\"prompt\": \"a\"} \n\t\r "), nil); err != nil {
		t.Errorf("trailing whitespace: %v", err)
	}
}

// A token id must be below the number of tokens: a far one would size the
// id table by it.
func TestLoadTokenIDOutOfRange(t *testing.T) {
	added := []addedTokenJSON{{ID: 257, Content: "<x>", Special: true}}
	for _, c := range []struct {
		id int
		ok bool
	}{{256, true}, {257, true}, {258, false}, {-1, false}, {2_000_000_000, false}} {
		_, err := Load(tinyJSON(t, map[string]int{"zz": c.id}, added), nil)
		if c.ok != (err == nil) {
			t.Errorf("token id %d: err = %v", c.id, err)
		}
		if err != nil && !strings.Contains(err.Error(), `token "zz" has id`) {
			t.Errorf("token id %d: err = %v, want it named", c.id, err)
		}
	}
}

func renderChat(t *testing.T, src string) (string, error) {
	t.Helper()
	p, err := tinyTokenizer(t).ChatPrompt([]byte(`[{"role": "user", "content": "hi"}]`), &RequestOptions{ChatTemplate: src})
	return p.Text, err
}

// range gives a list (gonja's gives a channel fed by a goroutine that a
// template not reading it all leaves blocked), of at most maxRange items.
func TestTemplateRange(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for src, want := range map[string]string{
		`{% set r = range(10) %}x`:                            "x",
		`{% for i in range(3) %}{{ i }}{% endfor %}`:          "012",
		`{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}`:   "147",
		`{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}`:   "531",
		`{{ range(3, 1)|length }},{{ range(100000)|length }}`: "0,100000",
	} {
		if got, err := renderChat(t, src); err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", src, got, err, want)
		}
	}
	for _, src := range []string{
		`{{ range(100001)|length }}`,
		`{{ range(-9223372036854775807, 9223372036854775807)|length }}`,
		`{{ range(1, 2, 0) }}`,
		`{{ range("a") }}`,
	} {
		if _, err := renderChat(t, src); !errors.Is(err, ErrTemplate) {
			t.Errorf("%s: err = %v, want a template error", src, err)
		}
	}
}

// What makes gonja panic is the template's error.
func TestTemplatePanics(t *testing.T) {
	for _, src := range []string{`{{ 1 % 0 }}`, `{{ "a" * -1 }}`} {
		_, err := renderChat(t, src)
		if !errors.Is(err, ErrTemplate) {
			t.Errorf("%s: err = %v, want a template error", src, err)
		}
	}
	var re runtime.Error
	if _, err := renderChat(t, `{{ 1 % 0 }}`); !errors.As(err, &re) {
		t.Errorf("1 %% 0: err = %v, want the runtime error", err)
	}
}

// tojson with a negative indent indents by nothing, as json.dumps does.
func TestToJSONNegativeIndent(t *testing.T) {
	got, err := renderChat(t, `{{ messages[0]|tojson(indent=-1) }}`)
	if want := "{\n\"role\": \"user\",\n\"content\": \"hi\"\n}"; err != nil || got != want {
		t.Errorf("tojson(indent=-1) = %q, %v; want %q", got, err, want)
	}
}

// LoadDir reads chat_template.jinja.gz gzipped, and the additional
// templates of a directory whose name is not a pattern.
func TestLoadDirTemplates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "model[1]")
	write := func(name string, b []byte) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tokenizer.json", tinyJSON(t, nil, nil))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("default: {{ messages[0].content }}"))
	zw.Close()
	write("chat_template.jinja.gz", gz.Bytes())
	write("additional_chat_templates/tool_use.jinja", []byte("tools: {{ messages[0].content }}"))
	write("additional_chat_templates/README.md", []byte("not a template"))
	tok, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"default": "default: {{ messages[0].content }}", "tool_use": "tools: {{ messages[0].content }}"}
	if !maps.Equal(tok.config.templates, want) {
		t.Errorf("templates %q, want %q", tok.config.templates, want)
	}
	for _, c := range []struct{ body, want string }{
		{`{"messages": [{"role": "user", "content": "hi"}]}`, "default: hi"},
		{`{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}`, "tools: hi"},
	} {
		p, err := tok.RequestPrompts([]byte(c.body), nil)
		if err != nil || p[0].Text != c.want {
			t.Errorf("%s: %v, %v; want %q", c.body, p, err, c.want)
		}
	}

	// additional_chat_templates that cannot be listed is an error.
	if err := os.RemoveAll(filepath.Join(dir, "additional_chat_templates")); err != nil {
		t.Fatal(err)
	}
	write("additional_chat_templates", []byte("a file"))
	if _, err := LoadDir(dir); err == nil {
		t.Error("additional_chat_templates is a file: no error")
	}
}

// Errors say "hftokenizer" once, and wrap gonja's for errors.As.
func TestTemplateErrorWrapping(t *testing.T) {
	_, err := Load(tinyJSON(t, nil, nil), []byte(`{"chat_template": "{% if %}"}`))
	var syntax *parser.SyntaxError
	if !errors.Is(err, ErrTemplate) || !errors.As(err, &syntax) ||
		strings.Count(err.Error(), "hftokenizer") != 1 ||
		!strings.HasPrefix(err.Error(), `hftokenizer: tokenizer_config.json: chat template "default": `) {
		t.Errorf("Load: %v", err)
	}
	_, err = renderChat(t, `{% if %}`)
	if !errors.Is(err, ErrTemplate) || !errors.As(err, &syntax) {
		t.Errorf("request's template: %v", err)
	}
	_, err = renderChat(t, `{{ raise_exception("boom") }}`)
	var value *exec.Value
	if !errors.Is(err, ErrTemplate) || !errors.As(err, &value) || !strings.Contains(err.Error(), "boom") {
		t.Errorf("raise_exception: %v", err)
	}
}

// A template's content format is detected once, when it is compiled.
func TestTemplateFormatCompiled(t *testing.T) {
	for _, src := range []string{
		`{% for m in messages %}{{ m.content }}{% endfor %}`,
		`{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}`,
	} {
		c, err := cachedTemplate(src)
		if err != nil {
			t.Fatal(err)
		}
		if want := detectContentFormat(src); c.format != want {
			t.Errorf("%s: format %q, want %q", src, c.format, want)
		}
	}
	for name, tok := range models(t) {
		for tn, c := range tok.config.compiled {
			if want := detectContentFormat(tok.config.templates[tn]); c.format != want {
				t.Errorf("%s/%s: format %q, want %q", name, tn, c.format, want)
			}
		}
	}
}

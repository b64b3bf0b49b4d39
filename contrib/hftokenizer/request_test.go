package hftokenizer

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPyDumps checks tojson against what Python's json.dumps writes for
// the same values (written out from Python 3's rules: key order kept,
// ", " and ": " without an indent, "," with one, floats as repr, no HTML
// escaping, ensure_ascii=False as transformers passes it).
func TestPyDumps(t *testing.T) {
	order := &keyOrder{}
	defer order.release()
	v, err := decodeJSON([]byte(`{"z": 1, "a": [1.0, 2.50, 1e16, 1.5e-5, 0.0001, -0.0, 123456789012, 1E2, 123456789012345678901234567890],
		"s": "<&>'\"\\\n\t\u0001\u007f\u2028é😀", "n": null, "t": true, "e": {}, "l": []}`), order)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pyDumps(v, dumpOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"z": 1, "a": [1.0, 2.5, 1e+16, 1.5e-05, 0.0001, -0.0, 123456789012, 100.0, 123456789012345678901234567890], "s": "<&>'\"\\\n\t\u0001` + "\u007f\u2028é😀" + `", "n": null, "t": true, "e": {}, "l": []}`
	if got != want {
		t.Errorf("json.dumps:\n%s\nwant\n%s", got, want)
	}
	got, _ = pyDumps(v, dumpOptions{ensureASCII: true})
	if !strings.Contains(got, `"<&>'\"\\\n\t\u0001\u007f\u2028\u00e9\ud83d\ude00"`) {
		t.Errorf("ensure_ascii: %s", got)
	}
	ind := "  "
	v, _ = decodeJSON([]byte(`{"b": [1, {"c": []}], "a": {}}`), order)
	got, _ = pyDumps(v, dumpOptions{indent: &ind})
	if want := "{\n  \"b\": [\n    1,\n    {\n      \"c\": []\n    }\n  ],\n  \"a\": {}\n}"; got != want {
		t.Errorf("indent=2:\n%s\nwant\n%s", got, want)
	}
}

func TestDetectContentFormat(t *testing.T) {
	for src, want := range map[string]ContentFormat{
		`{% for message in messages %}{{ message['content'] }}{% endfor %}`:                                                 ContentFormatString,
		`{% for message in messages %}{% for c in message['content'] %}{{ c.text }}{% endfor %}{% endfor %}`:                ContentFormatOpenAI,
		`{%- set loop_messages = messages %}{%- for m in loop_messages %}{%- for c in m.content %}{% endfor %}{% endfor %}`: ContentFormatOpenAI,
		`{% for x in other %}{% for c in x['content'] %}{% endfor %}{% endfor %}`:                                           ContentFormatString,
	} {
		if got := detectContentFormat(src); got != want {
			t.Errorf("detectContentFormat(%s) = %s, want %s", src, got, want)
		}
	}
}

func TestCompletionPrompts(t *testing.T) {
	tok := models(t)["llama3_1"]
	hello := tok.Encode("hello", true)
	if hello[0] != 128000 {
		t.Fatalf("Llama 3.1's tokenizer adds no BOS: %v", hello)
	}
	for body, want := range map[string][][]int32{
		`{"prompt": "hello"}`:                                {hello},
		`{"prompt": "hello", "add_special_tokens": false}`:   {hello[1:]},
		`{"prompt": ["hello", "hello"]}`:                     {hello, hello},
		`{"prompt": [1, 2, 3]}`:                              {{1, 2, 3}},
		`{"prompt": [[1, 2], [3]]}`:                          {{1, 2}, {3}},
		`{"prompt": "hello", "truncate_prompt_tokens": 1}`:   {hello[len(hello)-1:]},
		`{"prompt": [5, 6, 7], "truncate_prompt_tokens": 2}`: {{6, 7}},
	} {
		p, err := tok.RequestPrompts([]byte(body), nil)
		if err != nil {
			t.Errorf("%s: %v", body, err)
			continue
		}
		got := make([][]int32, len(p))
		for i := range p {
			got[i] = p[i].Tokens
		}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%s: %v, want %v", body, got, want)
		}
	}
	p, err := tok.RequestPrompts([]byte(`{"model": "adapter-1", "prompt": "hi", "cache_salt": "s"}`),
		&RequestOptions{LoRA: func(m string) string { return strings.TrimPrefix(m, "adapter-") }})
	if err != nil || p[0].Extra.CacheSalt != "s" || p[0].Extra.LoRAName != "1" {
		t.Errorf("extra keys: %+v, %v", p, err)
	}
}

func TestRequestRefused(t *testing.T) {
	tok := models(t)["qwen3"]
	for _, body := range []string{
		`[]`,
		`{}`,
		`{"prompt": []}`,
		`{"prompt": [1, "a"]}`,
		`{"prompt": [-1]}`,
		`{"prompt": "x", "prompt_embeds": "AAAA"}`,
		`{"prompt": "x", "truncate_prompt_tokens": -1}`,
		`{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}`,
		`{"messages": [{"role": "user", "content": "hi"}], "continue_final_message": true}`,
		`{"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages }}"}`,
		`{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"tokenize": true}}`,
		`{"messages": [{"content": "hi"}]}`,
		`{"prompt": "x", "cache_salt": ""}`,
		`{"prompt": "x", "cache_salt": 5}`,
	} {
		if _, err := tok.RequestPrompts([]byte(body), nil); !errors.Is(err, ErrRequest) {
			t.Errorf("%s: err = %v, want ErrRequest", body, err)
		}
	}
	// A template that raises fails with ErrTemplate.
	_, err := tok.RequestPrompts([]byte(`{"messages": [{"role": "user", "content": "hi"}]}`),
		&RequestOptions{ChatTemplate: `{{ raise_exception("no") }}`})
	if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), "no") {
		t.Errorf("raise_exception: %v", err)
	}
	// A trusted request template is used.
	p, err := tok.RequestPrompts([]byte(`{"messages": [{"role": "user", "content": "hi"}], "chat_template": "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}"}`),
		&RequestOptions{TrustRequestChatTemplate: true})
	if err != nil || p[0].Text != "user:hi" {
		t.Errorf("request template: %+v, %v", p, err)
	}
}

func TestStrftimeNow(t *testing.T) {
	tok := models(t)["qwen3"]
	p, err := tok.RequestPrompts([]byte(`{"messages": []}`), &RequestOptions{
		ChatTemplate: `{{ strftime_now("%d %b %Y %H:%M") }}`,
		Now:          func() time.Time { return time.Date(2026, 12, 6, 4, 5, 0, 0, time.UTC) },
	})
	if err != nil || p[0].Text != "06 Dec 2026 04:05" {
		t.Errorf("strftime_now: %+v, %v", p, err)
	}
}

// TestItemsOrder checks that a template iterating over a request's object
// sees its keys in the request's order, as Python's dicts keep it.
func TestItemsOrder(t *testing.T) {
	tok := models(t)["qwen3"]
	body := `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f",
		"parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}, "mid": {}}}}}]}`
	tmpl := `{% for t in tools %}{% for k, v in t.function.parameters.properties.items() %}{{ k }} {% endfor %}|` +
		`{% for k, v in t.function.parameters.properties|items %}{{ k }} {% endfor %}|` +
		`{{ t.function.parameters.properties.keys()|join(",") }}|{{ t.function|tojson }}{% endfor %}`
	p, err := tok.RequestPrompts([]byte(body), &RequestOptions{ChatTemplate: tmpl})
	if err != nil {
		t.Fatal(err)
	}
	want := `zeta alpha mid |zeta alpha mid |zeta,alpha,mid|{"name": "f", "description": null, "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}, "mid": {}}}}`
	if p[0].Text != want {
		t.Errorf("render\n%s\nwant\n%s", p[0].Text, want)
	}
}

// TestLstripBlocks checks lstrip_blocks as Jinja applies it: whitespace
// before a block is stripped from the start of a line only.
func TestLstripBlocks(t *testing.T) {
	tok := models(t)["qwen3"]
	for tmpl, want := range map[string]string{
		`{% for k in [1, 2] %}{{ k }} {% endfor %}`:             "1 2 ",
		`{% if true %} {% endif %}x`:                            " x",
		"a\n  {% if true %}b{% endif %}\n":                      "a\nb",
		"{% if true %}\n  {% if true %}c{% endif %}{% endif %}": "c",
		`{{ "x" }}  {%- if true %}y{% endif %}`:                 "xy",
		`{{ "x" }} {%+ if true %}y{% endif %}`:                  "x y",
		`{{ "x" }} {# note #}y`:                                 "x y",
		`{{ "a}}b" }} {% if true %}c{% endif %}`:                "a}}b c",
		`{% raw %}{{ x }} {% endraw %}`:                         "{{ x }} ",
	} {
		p, err := tok.RequestPrompts([]byte(`{"messages": []}`), &RequestOptions{ChatTemplate: tmpl})
		if err != nil {
			t.Errorf("%q: %v", tmpl, err)
			continue
		}
		if p[0].Text != want {
			t.Errorf("%q renders %q, want %q", tmpl, p[0].Text, want)
		}
	}
}

// TestToJSONArguments checks tojson's keyword arguments in a template, as
// json.dumps takes them.
func TestToJSONArguments(t *testing.T) {
	tok := models(t)["qwen3"]
	body := `{"messages": [{"role": "user", "content": "é"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [1, 2]}}}]}`
	for tmpl, want := range map[string]string{
		`{{ tools[0].function.parameters | tojson }}`:                                  `{"b": 1, "a": [1, 2]}`,
		`{{ tools[0].function.parameters | tojson(sort_keys=true) }}`:                  `{"a": [1, 2], "b": 1}`,
		`{{ tools[0].function.parameters | tojson(separators=(",", ":")) }}`:           `{"b":1,"a":[1,2]}`,
		`{{ tools[0].function.parameters | tojson(indent=1, separators=(";", "=")) }}`: "{\n \"b\"=1;\n \"a\"=[\n  1;\n  2\n ]\n}",
		`{{ messages[0] | tojson(ensure_ascii=true) }}`:                                `{"role": "user", "content": "\u00e9"}`,
		`{{ {"z": 1, "a": "<"} | tojson }}`:                                            `{"z": 1, "a": "<"}`,
		`{{ {"z": 1, "a": 2} | tojson(sort_keys=true) }}`:                              `{"a": 2, "z": 1}`,
	} {
		p, err := tok.RequestPrompts([]byte(body), &RequestOptions{ChatTemplate: tmpl})
		if err != nil {
			t.Errorf("%s: %v", tmpl, err)
			continue
		}
		if p[0].Text != want {
			t.Errorf("%s renders %q, want %q", tmpl, p[0].Text, want)
		}
	}
}

// TestChatTemplateFile checks that a chat_template.jinja beside the
// tokenizer files is the template.
func TestChatTemplateFile(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"tokenizer.json.gz", "tokenizer_config.json.gz"} {
		b, err := os.ReadFile("testdata/qwen3/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dir+"/"+f, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(dir+"/chat_template.jinja", []byte("{% for m in messages %}[{{ m.content }}]{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir+"/additional_chat_templates", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/additional_chat_templates/tool_use.jinja", []byte("tools: {{ tools|length }}"), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tok.RequestPrompts([]byte(`{"messages": [{"role": "user", "content": "hi"}]}`), nil)
	if err != nil || p[0].Text != "[hi]" {
		t.Errorf("render %+v, %v", p, err)
	}
	p, err = tok.RequestPrompts([]byte(`{"messages": [{"role": "user", "content": "hi"}], "tools": []}`), nil)
	if err != nil || p[0].Text != "tools: 0" {
		t.Errorf("tool_use render %+v, %v", p, err)
	}
}

func TestChatPrompt(t *testing.T) {
	tok := models(t)["qwen3"]
	msgs := `[{"role": "user", "content": "hi"}]`
	p, err := tok.ChatPrompt([]byte(msgs), nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := tok.RequestPrompts([]byte(`{"model": "x", "messages": `+msgs+`}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Text != "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" || !slices.Equal(p.Tokens, want[0].Tokens) {
		t.Errorf("ChatPrompt = %+v, want %+v", p, want[0])
	}
	if _, err := tok.ChatPrompt([]byte(`{"role": "user"}`), nil); !errors.Is(err, ErrRequest) {
		t.Errorf("messages that are not a list: %v", err)
	}
}

package hftokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/lestrrat-go/strftime"
	"github.com/nikolalohinski/gonja/v2"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// ErrTemplate is matched by the error of a chat template that does not
// compile or that fails while rendering, raise_exception's included.
var ErrTemplate = errors.New("hftokenizer: chat template")

// chatConfig is what tokenizer_config.json gives the chat: its templates
// and the special tokens transformers passes to them.
type chatConfig struct {
	templates map[string]string // by name; a single template is "default"
	special   map[string]any    // bos_token, eos_token, …: the special_tokens_map
	compiled  map[string]*compiledTemplate
}

// compiledTemplate is a chat template compiled, with what its text alone
// decides.
type compiledTemplate struct {
	tmpl   *exec.Template
	format ContentFormat // detectContentFormat's, for ContentFormatAuto
}

// templateError is an error of a chat template that matches ErrTemplate
// (and what it wraps) without repeating ErrTemplate's "hftokenizer: " in
// its message, for an error whose caller names the package already.
type templateError struct{ err error }

func (e templateError) Error() string   { return e.err.Error() }
func (e templateError) Unwrap() []error { return []error{ErrTemplate, e.err} }

func parseConfig(b []byte) (*chatConfig, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	c := &chatConfig{templates: map[string]string{}, special: map[string]any{}, compiled: map[string]*compiledTemplate{}}
	if t, ok := raw["chat_template"]; ok && !isNull(t) {
		var s string
		var named []struct{ Name, Template string }
		switch {
		case json.Unmarshal(t, &s) == nil:
			c.templates["default"] = s
		case json.Unmarshal(t, &named) == nil:
			for _, n := range named {
				c.templates[n.Name] = n.Template
			}
		default:
			return nil, fmt.Errorf("chat_template is neither a string nor a list of named templates")
		}
	}
	// transformers' special_tokens_map: each attribute that is set, as a
	// string (an AddedToken written as an object gives its content).
	content := func(m json.RawMessage) (string, bool) {
		var s string
		if json.Unmarshal(m, &s) == nil {
			return s, true
		}
		var t struct{ Content *string }
		if json.Unmarshal(m, &t) == nil && t.Content != nil {
			return *t.Content, true
		}
		return "", false
	}
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"} {
		if m, ok := raw[k]; ok {
			if s, ok := content(m); ok {
				c.special[k] = s
			}
		}
	}
	if m, ok := raw["additional_special_tokens"]; ok && !isNull(m) {
		var list []json.RawMessage
		if err := json.Unmarshal(m, &list); err != nil {
			return nil, fmt.Errorf("additional_special_tokens: %w", err)
		}
		var out []any
		for _, e := range list {
			if s, ok := content(e); ok {
				out = append(out, s)
			}
		}
		c.special["additional_special_tokens"] = out
	}
	for name, src := range c.templates {
		tmpl, err := compileTemplate(src)
		if err != nil {
			// Load names the package and the file.
			return nil, templateError{fmt.Errorf("chat template %q: %w", name, err)}
		}
		c.compiled[name] = tmpl
	}
	return c, nil
}

// environment is transformers' chat template environment
// (transformers/utils/chat_template_utils.py, _compile_jinja_template):
// trim_blocks and lstrip_blocks, the globals raise_exception and
// strftime_now, and tojson as json.dumps with ensure_ascii=False and no
// HTML escaping; range gives a list, of at most maxRange items.
func environment() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{})
	filters.Update(builtins.Filters)
	if err := filters.Replace("tojson", toJSONFilter); err != nil {
		panic(err)
	}
	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	ctx.Set("range", rangeFunction)
	ctx.Set("raise_exception", func(msg string) (string, error) {
		return "", fmt.Errorf("raise_exception: %s", msg)
	})
	if err := filters.Replace("items", itemsFilter); err != nil {
		panic(err)
	}
	methods := builtins.Methods
	methods.Dict = dictMethods()
	return &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           methods,
	}
}

// maxRange is the most items range gives, as in Jinja's sandbox
// (jinja2/sandbox.py, MAX_RANGE).
const maxRange = 100000

// rangeFunction is Python's range, as a list: gonja's sends the numbers
// from a goroutine of its own, which stays blocked for good when the
// template does not take them all ({% set r = range(10) %}).
func rangeFunction(_ *exec.Evaluator, params *exec.VarArgs) ([]int, error) {
	start, stop, step := 0, 0, 1
	args := params.Args
	for _, a := range args {
		if !a.IsInteger() {
			args = nil // refused below
		}
	}
	switch len(args) {
	case 1:
		stop = args[0].Integer()
	case 2:
		start, stop = args[0].Integer(), args[1].Integer()
	case 3:
		start, stop, step = args[0].Integer(), args[1].Integer(), args[2].Integer()
	default:
		return nil, exec.ErrInvalidCall(errors.New("expected signature is [start, ]stop[, step] where all arguments are integers"))
	}
	if len(params.KwArgs) > 0 {
		return nil, exec.ErrInvalidCall(errors.New("range takes no keyword arguments"))
	}
	if step == 0 {
		return nil, exec.ErrInvalidCall(errors.New("step cannot be 0"))
	}
	// The count, in uint64: stop-start may overflow an int.
	var n uint64
	switch {
	case step > 0 && start < stop:
		n = (uint64(stop)-uint64(start)-1)/uint64(step) + 1
	case step < 0 && start > stop:
		n = (uint64(start)-uint64(stop)-1)/(-uint64(step)) + 1
	}
	if n > maxRange {
		return nil, fmt.Errorf("range has %d items, more than %d", n, maxRange)
	}
	out := make([]int, n)
	for i := range out {
		out[i] = start + i*step
	}
	return out, nil
}

// dictMethods are gonja's dict methods, with keys(), values() and items()
// in the request's key order (keysOf) as Python gives them.
func dictMethods() *exec.MethodSet[map[string]any] {
	set := map[string]exec.Method[map[string]any]{}
	for _, name := range []string{"get", "pop", "setdefault", "update", "copy", "clear"} {
		if m, ok := builtins.Methods.Dict.Get(name); ok {
			set[name] = m
		}
	}
	ordered := func(f func(m map[string]any, k string) any) exec.Method[map[string]any] {
		return func(self map[string]any, selfValue *exec.Value, args *exec.VarArgs) (any, error) {
			if err := args.Take(); err != nil {
				return nil, exec.ErrInvalidCall(err)
			}
			// gonja passes a copy of the map; its value has the map itself.
			if m, ok := selfValue.Interface().(map[string]any); ok {
				self = m
			}
			out := make([]any, 0, len(self))
			for _, k := range keysOf(self) {
				out = append(out, f(self, k))
			}
			return out, nil
		}
	}
	set["keys"] = ordered(func(_ map[string]any, k string) any { return k })
	set["values"] = ordered(func(m map[string]any, k string) any { return m[k] })
	set["items"] = ordered(func(m map[string]any, k string) any { return []any{k, m[k]} })
	return exec.NewMethodSet(set)
}

// itemsFilter is Jinja's items filter, in the request's key order.
func itemsFilter(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if err := params.Take(); err != nil {
		return exec.AsValue(exec.ErrInvalidCall(err))
	}
	m, ok := in.Interface().(map[string]any)
	if !ok {
		if in.IsNil() {
			return exec.AsValue([]any{})
		}
		return exec.AsValue(errors.New("items requires a mapping"))
	}
	out := make([]any, 0, len(m))
	for _, k := range keysOf(m) {
		out = append(out, []any{k, m[k]})
	}
	return exec.AsValue(out)
}

var templateConfig = func() *config.Config {
	c := gonja.DefaultConfig.Inherit()
	c.TrimBlocks = true
	c.LeftStripBlocks = true
	c.KeepTrailingNewline = false
	return c
}()

// templates caches the templates given by options and trusted requests,
// compiled, by their text: a few an engine's worth.
var templates struct {
	sync.Mutex
	m map[string]*compiledTemplate
}

const templateCacheSize = 64

func cachedTemplate(src string) (*compiledTemplate, error) {
	templates.Lock()
	tmpl, ok := templates.m[src]
	templates.Unlock()
	if ok {
		return tmpl, nil
	}
	tmpl, err := compileTemplate(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	templates.Lock()
	if templates.m == nil || len(templates.m) >= templateCacheSize {
		templates.m = make(map[string]*compiledTemplate)
	}
	templates.m[src] = tmpl
	templates.Unlock()
	return tmpl, nil
}

// compileTemplate compiles a template's text. A panic of gonja's parser
// is its error.
func compileTemplate(src string) (c *compiledTemplate, err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, panicError(r)
		}
	}()
	loader, err := loaders.NewShiftedLoader("chat_template", strings.NewReader(keepInlineWhitespace(src)), loaders.MustNewMemoryLoader(nil))
	if err != nil {
		return nil, err
	}
	tmpl, err := exec.NewTemplate("chat_template", templateConfig, loader, environment())
	if err != nil {
		return nil, err
	}
	return &compiledTemplate{tmpl: tmpl, format: detectContentFormat(src)}, nil
}

// panicError is the error of a recovered panic of gonja's.
func panicError(r any) error {
	if err, ok := r.(error); ok {
		return fmt.Errorf("panic: %w", err)
	}
	return fmt.Errorf("panic: %v", r)
}

func toJSONFilter(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	var indent, separators *exec.Value
	opts := dumpOptions{}
	if err := params.Take(
		exec.KeywordArgument("ensure_ascii", exec.AsValue(false), func(v *exec.Value) error { opts.ensureASCII = v.IsTrue(); return nil }),
		exec.KeywordArgument("indent", exec.AsValue(nil), func(v *exec.Value) error { indent = v; return nil }),
		exec.KeywordArgument("separators", exec.AsValue(nil), func(v *exec.Value) error { separators = v; return nil }),
		exec.KeywordArgument("sort_keys", exec.AsValue(false), func(v *exec.Value) error { opts.sortKeys = v.IsTrue(); return nil }),
	); err != nil {
		return exec.AsValue(exec.ErrInvalidCall(err))
	}
	switch {
	case indent.IsNil():
	case indent.IsInteger():
		s := strings.Repeat(" ", max(indent.Integer(), 0)) // Python's " " * n: "" for n < 0
		opts.indent = &s
	case indent.IsString():
		s := indent.String()
		opts.indent = &s
	default:
		return exec.AsValue(fmt.Errorf("tojson: indent %s", indent.String()))
	}
	if !separators.IsNil() {
		if !separators.IsList() || separators.Len() != 2 || !separators.Index(0).IsString() || !separators.Index(1).IsString() {
			return exec.AsValue(fmt.Errorf("tojson: separators %s is not two strings", separators.String()))
		}
		opts.itemSep, opts.keySep = separators.Index(0).String(), separators.Index(1).String()
	}
	s, err := pyDumps(in.Interface(), opts)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(s)
}

// chatTemplate returns the tokenizer's chat template as vLLM and
// transformers pick it (tokenizer.get_chat_template): the one named
// "tool_use" when the request has tools and the tokenizer has such a
// template, else "default".
func (t *Tokenizer) chatTemplate(tools bool) (*compiledTemplate, error) {
	if t.config == nil || len(t.config.templates) == 0 {
		return nil, fmt.Errorf("%w: the tokenizer has no chat template", ErrTemplate)
	}
	name := "default"
	if _, ok := t.config.templates["tool_use"]; tools && ok {
		name = "tool_use"
	}
	tmpl, ok := t.config.compiled[name]
	if !ok {
		return nil, fmt.Errorf("%w: the tokenizer has no template named %q", ErrTemplate, name)
	}
	return tmpl, nil
}

// ContentFormat is how message content reaches a chat template, as vLLM's
// --chat-template-content-format has it.
type ContentFormat string

const (
	// ContentFormatAuto detects the format from the template, as vLLM
	// does: "openai" when it loops over a message's content.
	ContentFormatAuto ContentFormat = "auto"
	// ContentFormatString joins a message's text parts with "\n".
	ContentFormatString ContentFormat = "string"
	// ContentFormatOpenAI passes a message's content as a list of
	// {"type": "text", "text": …} parts.
	ContentFormatOpenAI ContentFormat = "openai"
)

var (
	setFromRE    = regexp.MustCompile(`\{%-?\s*set\s+(\w+)\s*=\s*(\w+)\b`)
	forInRE      = regexp.MustCompile(`\{%-?\s*for\s+(\w+)\s+in\s+(\w+)\b`)
	contentForRE = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+(\w+)\s*(?:\[\s*['"]content['"]\s*\]|\.content\b)`)
)

// detectContentFormat is vLLM's _detect_content_format
// (vllm/renderers/hf.py): "openai" when the template loops over the
// content of a message (for … in message['content'], message being a
// loop variable over messages or over a variable set from it), "string"
// otherwise. vLLM walks the template's syntax tree; this reads its text
// for the same statements.
func detectContentFormat(src string) ContentFormat {
	related := map[string]bool{"messages": true}
	for changed := true; changed; {
		changed = false
		for _, m := range setFromRE.FindAllStringSubmatch(src, -1) {
			if related[m[2]] && !related[m[1]] {
				related[m[1]], changed = true, true
			}
		}
	}
	loopVars := map[string]bool{}
	for _, m := range forInRE.FindAllStringSubmatch(src, -1) {
		if related[m[2]] {
			loopVars[m[1]] = true
		}
	}
	for _, m := range contentForRE.FindAllStringSubmatch(src, -1) {
		if loopVars[m[1]] {
			return ContentFormatOpenAI
		}
	}
	return ContentFormatString
}

// renderVars are a render's variables.
type renderVars struct {
	messages            []any
	tools               []any // nil: None
	documents           []any // nil: None
	addGenerationPrompt bool
	kwargs              map[string]any
	now                 func() time.Time
}

// render renders the template as transformers' apply_chat_template does
// (render_jinja_template): the special tokens, then the request's
// chat_template_kwargs, then messages, tools, documents and
// add_generation_prompt. A panic of gonja's (1 % 0, "a" * -1) is the
// template's error.
func (t *Tokenizer) render(tmpl *compiledTemplate, v renderVars) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("%w: %w", ErrTemplate, panicError(r))
		}
	}()
	ctx := exec.NewContext(map[string]any{})
	if t.config != nil {
		for k, val := range t.config.special {
			ctx.Set(k, val)
		}
	}
	for k, val := range v.kwargs {
		ctx.Set(k, val)
	}
	ctx.Set("messages", v.messages)
	if v.tools == nil {
		ctx.Set("tools", nil)
	} else {
		ctx.Set("tools", v.tools)
	}
	if v.documents == nil {
		ctx.Set("documents", nil)
	} else {
		ctx.Set("documents", v.documents)
	}
	ctx.Set("add_generation_prompt", v.addGenerationPrompt)
	now := v.now
	if now == nil {
		now = time.Now
	}
	ctx.Set("strftime_now", func(format string) (string, error) {
		return strftime.Format(format, now())
	})
	out, err = tmpl.tmpl.ExecuteToString(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	return out, nil
}

// keepInlineWhitespace rewrites the spaces and tabs between a tag and the
// block or comment tag after it on the same line ("{{ x }} {% endif %}")
// as an expression that prints them. Jinja's lstrip_blocks strips
// whitespace before a block only from the start of a line (jinja2/lexer.py:
// the text after its last newline, or all of it when the previous token
// ended a line); gonja strips it wherever it is the whole text before the
// block. Whitespace before "{%-" is left for the "-" to strip, before "{%+"
// for the "+" to keep.
func keepInlineWhitespace(src string) string {
	var b strings.Builder
	i := 0
	afterTag := false // the text at i follows a tag that did not end a line
	for i < len(src) {
		open := strings.Index(src[i:], "{")
		for open >= 0 && i+open+1 < len(src) && !strings.ContainsRune("{%#", rune(src[i+open+1])) {
			next := strings.Index(src[i+open+1:], "{")
			if next < 0 {
				open = -1
				break
			}
			open += next + 1
		}
		if open < 0 || i+open+1 >= len(src) {
			b.WriteString(src[i:])
			break
		}
		text := src[i : i+open]
		kind := src[i+open+1]
		inline := afterTag && text != "" && strings.Trim(text, " \t") == "" && kind != '{' &&
			(i+open+2 >= len(src) || src[i+open+2] != '-' && src[i+open+2] != '+')
		if inline {
			b.WriteString(`{{ "` + text + `" }}`)
		} else {
			b.WriteString(text)
		}
		i += open
		end := tagEnd(src, i, kind)
		if end < 0 {
			b.WriteString(src[i:])
			break
		}
		tag := src[i:end]
		b.WriteString(tag)
		i = end
		// A block or comment tag followed by a newline ends the line
		// (trim_blocks removes it); so does a tag that ends with "-".
		afterTag = !(kind != '{' && i < len(src) && src[i] == '\n') && !strings.HasSuffix(strings.TrimRight(tag[:len(tag)-2], " \t\n"), "-")
		if kind == '%' && isRawTag(tag) {
			// Everything up to endraw is text.
			if j := strings.Index(src[i:], "endraw"); j >= 0 {
				if k := strings.Index(src[i+j:], "%}"); k >= 0 {
					b.WriteString(src[i : i+j+k+2])
					i += j + k + 2
				}
			}
		}
	}
	return b.String()
}

// tagEnd returns the end of the tag opened at src[i] ("{{", "{%" or
// "{#"), past strings within it; -1 when it does not end.
func tagEnd(src string, i int, kind byte) int {
	closing := map[byte]string{'{': "}}", '%': "%}", '#': "#}"}[kind]
	if kind == '#' {
		j := strings.Index(src[i+2:], closing)
		if j < 0 {
			return -1
		}
		return i + 2 + j + 2
	}
	var quote byte
	for j := i + 2; j < len(src); j++ {
		c := src[j]
		switch {
		case quote != 0:
			if c == '\\' {
				j++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case strings.HasPrefix(src[j:], closing):
			return j + 2
		}
	}
	return -1
}

func isRawTag(tag string) bool {
	s := strings.Trim(tag[2:len(tag)-2], "-+ \t\n")
	return s == "raw"
}

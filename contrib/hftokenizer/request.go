package hftokenizer

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

// ErrRequest is matched by the error of a request body vLLM would refuse,
// or that asks for what this package does not compute (images and other
// media, prompt embeddings): its tokens, and so its keys, are unknown.
var ErrRequest = errors.New("hftokenizer: request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrRequest}, args...)...)
}

// RequestOptions are an engine's settings that change what a request's
// tokens are. The zero value is vLLM's defaults.
type RequestOptions struct {
	// ContentFormat is the engine's --chat-template-content-format; ""
	// is "auto".
	ContentFormat ContentFormat
	// ChatTemplate is the engine's --chat-template, the template's text;
	// "" means the tokenizer's own.
	ChatTemplate string
	// TrustRequestChatTemplate is --trust-request-chat-template: without
	// it a request that brings its own chat_template is refused.
	TrustRequestChatTemplate bool
	// ExcludeToolsWhenToolChoiceNone is
	// --exclude-tools-when-tool-choice-none.
	ExcludeToolsWhenToolChoiceNone bool
	// LoRA names the LoRA adapter a request's model field selects, ""
	// for the base model; nil means no adapters are loaded.
	LoRA func(model string) string
	// Now is the clock of the templates' strftime_now; nil is time.Now.
	Now func() time.Time
}

// Prompt is one prompt of a request: its token ids, as the engine computes
// them, and what else goes into its block hashes.
type Prompt struct {
	// Tokens are the prompt's token ids.
	Tokens []int32
	// Text is the text the tokens were encoded from: the rendered chat
	// for a chat request; "" for a prompt given as token ids.
	Text string
	// Extra carries the request's cache_salt and LoRA adapter.
	Extra vllmhash.ExtraKeys
}

// RequestPrompts returns the prompts of an OpenAI-style request body as a
// vLLM engine serving this tokenizer computes them: a /v1/chat/completions
// body (it has "messages") gives one prompt, a /v1/completions body
// ("prompt") one per prompt it lists.
//
// A completion's prompt text is encoded with add_special_tokens (default
// true, CompletionRequest in vllm/entrypoints/openai/protocol.py: the
// tokenizer's BOS, where its post-processor adds one); a prompt given as
// token ids is taken as it is. A chat is turned into a conversation as
// vllm/entrypoints/chat_utils.py does (parse_chat_messages,
// _parse_chat_message_content, _postprocess_messages: text parts joined
// with "\n" or kept as parts by the content format that
// vllm/renderers/hf.py's _detect_content_format finds in the template,
// tool call arguments decoded), the tools dumped as
// ChatCompletionToolsParam.model_dump() gives them, rendered as
// vllm/renderers/hf.py's safe_apply_chat_template has transformers render
// it (the tokenizer's template, or the one named "tool_use" for a request
// with tools), and encoded with add_special_tokens (default false,
// ChatCompletionRequest: the template writes the special tokens). A
// request with truncate_prompt_tokens keeps that many of its last tokens.
// The request's cache_salt, and the LoRA adapter its model names
// (RequestOptions.LoRA), go into Prompt.Extra.
//
// Refused, with an error matching ErrRequest, as vLLM refuses them or
// because their tokens cannot be known here: a body that is neither; a
// prompt_embeds field; content parts other than text (images, audio,
// video: their placeholder tokens come from the model's processor); both
// add_generation_prompt and continue_final_message
// (ChatCompletionRequest.check_generation_prompt); a cache_salt that is not
// a non-empty string (check_cache_salt_support); a chat_template without
// TrustRequestChatTemplate; chat_template_kwargs naming chat_template or
// tokenize (resolve_chat_template_kwargs); truncate_prompt_tokens of -1
// (the model's length, unknown here). A template that fails
// (raise_exception included) gives an error matching ErrTemplate.
func (t *Tokenizer) RequestPrompts(body []byte, opts *RequestOptions) ([]Prompt, error) {
	if opts == nil {
		opts = &RequestOptions{}
	}
	order := &keyOrder{}
	defer order.release()
	v, err := decodeJSON(body, order)
	if err != nil {
		return nil, badRequest("body: %v", err)
	}
	req, ok := v.(map[string]any)
	if !ok {
		return nil, badRequest("body is not a JSON object")
	}
	var extra vllmhash.ExtraKeys
	// check_cache_salt_support: a salt is a non-empty string.
	if s, ok := req["cache_salt"].(string); ok && s != "" {
		extra.CacheSalt = s
	} else if req["cache_salt"] != nil {
		return nil, badRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
	}
	if m, ok := req["model"].(string); ok && opts.LoRA != nil {
		extra.LoRAName = opts.LoRA(m)
	}
	if e, ok := req["prompt_embeds"]; ok && e != nil {
		return nil, badRequest("prompt_embeds: the prompt is not tokens")
	}
	var prompts []Prompt
	switch {
	case req["messages"] != nil:
		p, err := t.chatPrompt(req, order, opts)
		if err != nil {
			return nil, err
		}
		prompts = []Prompt{p}
	case req["prompt"] != nil:
		if prompts, err = t.completionPrompts(req); err != nil {
			return nil, err
		}
	default:
		return nil, badRequest("neither messages nor prompt")
	}
	if n, ok := req["truncate_prompt_tokens"]; ok && n != nil {
		k, ok := n.(int)
		switch {
		case !ok || k < -1 || k == 0:
			return nil, badRequest("truncate_prompt_tokens %v", n)
		case k == -1:
			return nil, badRequest("truncate_prompt_tokens -1 (the model's length) is not known here")
		}
		for i := range prompts {
			if len(prompts[i].Tokens) > k {
				prompts[i].Tokens = prompts[i].Tokens[len(prompts[i].Tokens)-k:]
			}
		}
	}
	for i := range prompts {
		prompts[i].Extra = extra
	}
	return prompts, nil
}

// ChatPrompt returns the prompt of a chat given as its messages alone (a
// JSON array of OpenAI-style messages), as [Tokenizer.RequestPrompts]
// gives it for a /v1/chat/completions body with those messages and
// nothing else: vLLM's defaults, a generation prompt added.
func (t *Tokenizer) ChatPrompt(messages []byte, opts *RequestOptions) (Prompt, error) {
	body := make([]byte, 0, len(messages)+16)
	body = append(append(append(body, `{"messages": `...), messages...), '}')
	p, err := t.RequestPrompts(body, opts)
	if err != nil {
		return Prompt{}, err
	}
	return p[0], nil
}

func boolField(req map[string]any, name string, def bool) (bool, error) {
	v, ok := req[name]
	if !ok || v == nil {
		return def, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, badRequest("%s is not a boolean", name)
	}
	return b, nil
}

// completionPrompts follows vLLM's /v1/completions: prompt is a string, a
// list of strings, a list of token ids or a list of such lists.
func (t *Tokenizer) completionPrompts(req map[string]any) ([]Prompt, error) {
	special, err := boolField(req, "add_special_tokens", true)
	if err != nil {
		return nil, err
	}
	text := func(s string) Prompt { return Prompt{Tokens: t.Encode(s, special), Text: s} }
	ids := func(l []any) (Prompt, error) {
		out := make([]int32, len(l))
		for i, e := range l {
			n, ok := e.(int)
			if !ok || n < 0 || n > 1<<31-1 {
				return Prompt{}, badRequest("prompt token %v is not a token id", e)
			}
			out[i] = int32(n)
		}
		return Prompt{Tokens: out}, nil
	}
	switch p := req["prompt"].(type) {
	case string:
		return []Prompt{text(p)}, nil
	case []any:
		if len(p) == 0 {
			return nil, badRequest("prompt is an empty list")
		}
		switch p[0].(type) {
		case int:
			pr, err := ids(p)
			return []Prompt{pr}, err
		case string:
			out := make([]Prompt, len(p))
			for i, e := range p {
				s, ok := e.(string)
				if !ok {
					return nil, badRequest("prompt mixes strings and other values")
				}
				out[i] = text(s)
			}
			return out, nil
		case []any:
			out := make([]Prompt, len(p))
			for i, e := range p {
				l, ok := e.([]any)
				if !ok {
					return nil, badRequest("prompt mixes token lists and other values")
				}
				if out[i], err = ids(l); err != nil {
					return nil, err
				}
			}
			return out, nil
		}
	}
	return nil, badRequest("prompt is neither text nor token ids")
}

// chatPrompt follows vLLM's /v1/chat/completions.
func (t *Tokenizer) chatPrompt(req map[string]any, order *keyOrder, opts *RequestOptions) (Prompt, error) {
	genPrompt, err := boolField(req, "add_generation_prompt", true)
	if err != nil {
		return Prompt{}, err
	}
	cont, err := boolField(req, "continue_final_message", false)
	if err != nil {
		return Prompt{}, err
	}
	special, err := boolField(req, "add_special_tokens", false)
	if err != nil {
		return Prompt{}, err
	}
	if genPrompt && cont {
		return Prompt{}, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	msgs, ok := req["messages"].([]any)
	if !ok {
		return Prompt{}, badRequest("messages is not a list")
	}
	var tools []any
	if tl, ok := req["tools"]; ok && tl != nil {
		list, ok := tl.([]any)
		if !ok {
			return Prompt{}, badRequest("tools is not a list")
		}
		if !(opts.ExcludeToolsWhenToolChoiceNone && req["tool_choice"] == "none") {
			tools = make([]any, len(list))
			for i, tool := range list {
				if tools[i], err = toolDump(tool, order); err != nil {
					return Prompt{}, err
				}
			}
		}
	}
	kwargs := map[string]any{}
	if k, ok := req["chat_template_kwargs"]; ok && k != nil {
		m, ok := k.(map[string]any)
		if !ok {
			return Prompt{}, badRequest("chat_template_kwargs is not an object")
		}
		for name, val := range m {
			if name == "chat_template" || name == "tokenize" {
				return Prompt{}, badRequest("Found unexpected chat template kwargs from request: %q", name)
			}
			kwargs[name] = val
		}
	}
	var src string
	var tmpl *compiledTemplate
	switch {
	case req["chat_template"] != nil:
		s, ok := req["chat_template"].(string)
		if !ok {
			return Prompt{}, badRequest("chat_template is not a string")
		}
		if !opts.TrustRequestChatTemplate {
			return Prompt{}, badRequest("Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.")
		}
		src = s
	case opts.ChatTemplate != "":
		src = opts.ChatTemplate
	}
	if src != "" {
		if tmpl, err = cachedTemplate(src); err != nil {
			return Prompt{}, err
		}
	} else if tmpl, err = t.chatTemplate(tools != nil); err != nil {
		return Prompt{}, err
	}
	format := opts.ContentFormat
	if format == "" || format == ContentFormatAuto {
		format = tmpl.format
	}
	conv := make([]any, len(msgs))
	for i, m := range msgs {
		if conv[i], err = conversationMessage(m, format, order); err != nil {
			return Prompt{}, err
		}
	}
	postprocessMessages(conv, order)
	var documents []any
	if d, ok := req["documents"]; ok && d != nil {
		if documents, ok = d.([]any); !ok {
			return Prompt{}, badRequest("documents is not a list")
		}
	}
	text, err := t.render(tmpl, renderVars{
		messages:            conv,
		tools:               tools,
		documents:           documents,
		addGenerationPrompt: genPrompt,
		kwargs:              kwargs,
		now:                 opts.Now,
	})
	if err != nil {
		return Prompt{}, err
	}
	if cont {
		if text, err = continueFinalMessage(text, conv); err != nil {
			return Prompt{}, err
		}
	}
	return Prompt{Tokens: t.Encode(text, special), Text: text}, nil
}

// toolDump is ChatCompletionToolsParam.model_dump() (vLLM's
// vllm/entrypoints/openai/protocol.py): type, then function with name,
// description and parameters (None when absent), then the fields the
// request added, as given.
func toolDump(v any, order *keyOrder) (any, error) {
	tool, ok := v.(map[string]any)
	if !ok {
		return nil, badRequest("a tool is not an object")
	}
	fn, ok := tool["function"].(map[string]any)
	if !ok {
		return nil, badRequest("a tool has no function")
	}
	if _, ok := fn["name"].(string); !ok {
		return nil, badRequest("a tool's function has no name")
	}
	outFn := map[string]any{"name": fn["name"], "description": fn["description"], "parameters": fn["parameters"]}
	fnKeys := []string{"name", "description", "parameters"}
	for _, k := range keysOf(fn) {
		if _, done := outFn[k]; !done {
			outFn[k] = fn[k]
			fnKeys = append(fnKeys, k)
		}
	}
	typ := tool["type"]
	if typ == nil {
		typ = "function"
	}
	out := map[string]any{"type": typ, "function": outFn}
	keys := []string{"type", "function"}
	for _, k := range keysOf(tool) {
		if _, done := out[k]; !done {
			out[k] = tool[k]
			keys = append(keys, k)
		}
	}
	order.set(outFn, fnKeys)
	order.set(out, keys)
	return out, nil
}

// conversationMessage is vLLM's _parse_chat_message_content
// (vllm/entrypoints/chat_utils.py): the content's text parts joined with
// "\n" ("string") or kept as text parts ("openai"); an assistant's
// tool_calls and reasoning, a tool's tool_call_id and text content, and a
// name.
func conversationMessage(v any, format ContentFormat, order *keyOrder) (any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, badRequest("a message is not an object")
	}
	role, ok := m["role"].(string)
	if !ok {
		return nil, badRequest("a message has no role")
	}
	var parts []any
	switch c := m["content"].(type) {
	case nil:
	case string:
		parts = []any{c}
	case []any:
		for _, p := range c {
			text, keep, err := textPart(p)
			if err != nil {
				return nil, err
			}
			if keep {
				parts = append(parts, text)
			}
		}
	default:
		return nil, badRequest("a message's content is neither text nor a list of parts")
	}
	out := map[string]any{"role": role}
	keys := []string{"role", "content"}
	if format == ContentFormatOpenAI {
		list := make([]any, len(parts))
		for i, p := range parts {
			part := map[string]any{"type": "text", "text": p}
			order.set(part, []string{"type", "text"})
			list[i] = part
		}
		out["content"] = list
	} else {
		texts := make([]string, len(parts))
		for i, p := range parts {
			texts[i] = p.(string)
		}
		out["content"] = strings.Join(texts, "\n")
	}
	switch role {
	case "assistant":
		if tc, ok := m["tool_calls"]; ok && tc != nil {
			list, ok := tc.([]any)
			if !ok {
				return nil, badRequest("tool_calls is not a list")
			}
			out["tool_calls"] = list
			keys = append(keys, "tool_calls")
		}
		if r, ok := m["reasoning"]; ok && r != nil {
			out["reasoning"], out["reasoning_content"] = r, r
			keys = append(keys, "reasoning", "reasoning_content")
		}
	case "tool":
		if id, ok := m["tool_call_id"]; ok {
			out["tool_call_id"] = id
			keys = append(keys, "tool_call_id")
		}
		// A tool's content given as text parts is text.
		if l, ok := out["content"].([]any); ok {
			texts := make([]string, len(l))
			for i, p := range l {
				texts[i] = p.(map[string]any)["text"].(string)
			}
			out["content"] = strings.Join(texts, "\n")
		}
	}
	if name, ok := m["name"].(string); ok {
		out["name"] = name
		keys = append(keys, "name")
	}
	if task, ok := m["task"].(string); ok {
		out["task"] = task
		keys = append(keys, "task")
	}
	if role == "developer" {
		out["tools"] = m["tools"]
		keys = append(keys, "tools")
	}
	order.set(out, keys)
	return out, nil
}

// textPart is one content part's text (vLLM's MM_PARSER_MAP): false for a
// text part without text, which vLLM skips; an error for a part that is
// not text.
func textPart(p any) (string, bool, error) {
	if s, ok := p.(string); ok {
		return s, true, nil
	}
	m, ok := p.(map[string]any)
	if !ok {
		return "", false, badRequest("a content part is neither text nor an object")
	}
	typ, _ := m["type"].(string)
	field := ""
	switch typ {
	case "text", "input_text", "output_text":
		field = "text"
	case "refusal":
		field = "refusal"
	case "thinking":
		field = "thinking"
	case "":
		return "", false, badRequest("a content part has no type")
	default:
		return "", false, badRequest("content part of type %q: only text is tokenized here", typ)
	}
	if _, ok := m["uuid"]; ok && m["uuid"] != nil {
		return "", false, badRequest("content part of type %q with a uuid", typ)
	}
	s, ok := m[field].(string)
	if !ok {
		if m[field] == nil && (typ == "text" || typ == "refusal") {
			return "", false, nil
		}
		return "", false, badRequest("content part of type %q without its %s", typ, field)
	}
	return s, true, nil
}

// postprocessMessages is vLLM's _postprocess_messages: an assistant's
// empty tool_calls are dropped, and each call's arguments given as a JSON
// string become the object they encode ({} when they are not JSON, or
// neither an object nor a list).
func postprocessMessages(conv []any, order *keyOrder) {
	for _, v := range conv {
		m := v.(map[string]any)
		calls, ok := m["tool_calls"].([]any)
		if m["role"] != "assistant" || !ok {
			continue
		}
		if len(calls) == 0 {
			delete(m, "tool_calls")
			continue
		}
		for _, c := range calls {
			call, ok := c.(map[string]any)
			if !ok {
				continue
			}
			fn, ok := call["function"].(map[string]any)
			if !ok {
				continue
			}
			switch a := fn["arguments"].(type) {
			case string:
				if v, err := decodeJSON([]byte(a), order); err == nil {
					fn["arguments"] = v
				} else {
					fn["arguments"] = map[string]any{}
				}
			case map[string]any, []any:
			default:
				fn["arguments"] = map[string]any{}
			}
		}
	}
}

// continueFinalMessage cuts the render after the final message's content,
// as transformers' apply_chat_template does with continue_final_message:
// the final message stays open for the model to continue.
func continueFinalMessage(rendered string, conv []any) (string, error) {
	if len(conv) == 0 {
		return "", badRequest("continue_final_message without messages")
	}
	var final string
	switch c := conv[len(conv)-1].(map[string]any)["content"].(type) {
	case string:
		final = c
	case []any:
		found := false
		for i := len(c) - 1; i >= 0; i-- {
			if p, ok := c[i].(map[string]any); ok {
				if s, ok := p["text"].(string); ok {
					final, found = s, true
					break
				}
			}
		}
		if !found {
			return "", fmt.Errorf("%w: continue_final_message is set but we could not find any text to continue in the final message", ErrTemplate)
		}
	}
	trimmed := strings.TrimFunc(final, pyIsSpace)
	loc := strings.LastIndex(rendered, trimmed)
	if !strings.Contains(rendered, trimmed) {
		return "", fmt.Errorf("%w: continue_final_message is set but the final message does not appear in the chat after applying the chat template", ErrTemplate)
	}
	lstripped := strings.TrimLeftFunc(final, pyIsSpace)
	if loc+len(lstripped) <= len(rendered) && rendered[loc:loc+len(lstripped)] == final {
		return rendered[:loc+len(lstripped)], nil
	}
	return rendered[:loc+len(trimmed)], nil
}

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }

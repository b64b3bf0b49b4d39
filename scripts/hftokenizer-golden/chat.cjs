// The chat cases: OpenAI-style /v1/chat/completions bodies, and the step
// from a body to the chat template's variables as vLLM takes it
// (vllm/entrypoints/chat_utils.py: _parse_chat_message_content,
// _postprocess_messages; the tools as ChatCompletionToolsParam.model_dump();
// transformers' apply_chat_template adds the tokenizer's special tokens).
// contrib/hftokenizer implements the same step in Go; the renders the
// oracle makes from it are the golden data.
"use strict";

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city: <b>°C</b> & \"quotes\" — 東京 too",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "The city, e.g. Zürich" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        days: { type: "integer", minimum: 1, maximum: 14 },
        threshold: { type: "number", default: 0.5 },
      },
      required: ["city"],
    },
  },
};
const search = {
  type: "function",
  function: {
    name: "search",
    parameters: { type: "object", properties: { query: { type: "string" }, filters: { type: "object", properties: { lang: { type: "string" } } } }, required: ["query"] },
  },
};
const noParams = { type: "function", function: { name: "now", description: "The time." } };

function call(id, name, args) {
  return { id, type: "function", function: { name, arguments: args } };
}

function conversations() {
  const c = [];
  const add = (name, request) => c.push({ name, request });
  add("user", { messages: [{ role: "user", content: "Hello!" }] });
  add("system-user", { messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "What is 2+2?" }] });
  add("multi-turn", {
    messages: [
      { role: "system", content: "Be kind." },
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello! How can I help?" },
      { role: "user", content: "Tell me a joke about cats." },
    ],
  });
  add("no-generation-prompt", { messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hey." }], add_generation_prompt: false });
  add("content-parts", { messages: [{ role: "user", content: [{ type: "text", text: "first part" }, { type: "text", text: "second part" }] }] });
  add("content-empty-parts", { messages: [{ role: "user", content: [] }, { role: "assistant", content: "ok" }, { role: "user", content: "" }] });
  add("whitespace", { messages: [{ role: "system", content: "  padded system \n" }, { role: "user", content: "\n\ttabs and newlines\n\n" }] });
  add("unicode", { messages: [{ role: "user", content: "日本語で答えて 👨‍👩‍👧‍👦 e\u0301 Ångström" }] });
  add("special-text", { messages: [{ role: "user", content: "what is <|eot_id|> or <|im_end|> or <think>?" }] });
  add("name-field", { messages: [{ role: "user", name: "alice", content: "Hi, I'm Alice." }] });
  add("tools-user", { messages: [{ role: "user", content: "Weather in Paris?" }], tools: [weather] });
  add("tools-system-user", { messages: [{ role: "system", content: "Use tools." }, { role: "user", content: "Search for Go tokenizers" }], tools: [weather, search, noParams] });
  add("tool-call-round", {
    messages: [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [call("call_1", "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}")] },
      { role: "tool", tool_call_id: "call_1", content: "{\"temp\": 21}" },
    ],
    tools: [weather],
  });
  add("tool-call-with-content", {
    messages: [
      { role: "user", content: "Weather in Paris and Rome?" },
      { role: "assistant", content: "Let me check.", tool_calls: [call("a", "get_weather", "{\"city\":\"Paris\"}"), call("b", "get_weather", "{\"city\":\"Rome\",\"days\":3}")] },
      { role: "tool", tool_call_id: "a", content: "sunny" },
      { role: "tool", tool_call_id: "b", content: [{ type: "text", text: "rain" }, { type: "text", text: "12C" }] },
      { role: "assistant", content: "Paris is sunny; Rome has rain." },
      { role: "user", content: "Thanks" },
    ],
    tools: [weather],
  });
  add("tool-call-bad-arguments", {
    messages: [
      { role: "user", content: "go" },
      { role: "assistant", content: "", tool_calls: [call("x", "search", "not json"), call("y", "now", "")] },
      { role: "tool", tool_call_id: "x", content: "nothing" },
    ],
    tools: [search, noParams],
  });
  add("tool-call-unicode-arguments", {
    messages: [
      { role: "user", content: "東京の天気" },
      { role: "assistant", content: null, tool_calls: [call("t", "get_weather", "{\"city\": \"東京\", \"note\": \"<&>\", \"n\": [1, 2.5, true, null]}")] },
    ],
    tools: [weather],
  });
  add("empty-tool-calls", { messages: [{ role: "user", content: "hi" }, { role: "assistant", content: "hello", tool_calls: [] }, { role: "user", content: "again" }] });
  add("tools-empty-list", { messages: [{ role: "user", content: "hi" }], tools: [] });
  add("think-in-history", {
    messages: [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "<think>\nadd them\n</think>\n\n4" },
      { role: "user", content: "3+3?" },
    ],
  });
  add("think-last", { messages: [{ role: "user", content: "2+2?" }, { role: "assistant", content: "<think>\nsum\n</think>\n\n4" }], add_generation_prompt: false });
  add("reasoning-field", {
    messages: [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "4", reasoning: "two and two" },
      { role: "user", content: "and 3+3?" },
    ],
  });
  add("enable-thinking-off", { messages: [{ role: "user", content: "Quick answer please" }], chat_template_kwargs: { enable_thinking: false } });
  add("continue-final", { messages: [{ role: "user", content: "Write a haiku" }, { role: "assistant", content: "Autumn moonlight—" }], add_generation_prompt: false, continue_final_message: true });
  add("long", { messages: [{ role: "user", content: "lorem ipsum dolor sit amet ".repeat(200) }] });
  add("system-only", { messages: [{ role: "system", content: "Only a system message." }] });
  add("tool-response-wrapped", {
    messages: [
      { role: "user", content: "<tool_response>\nnot a query\n</tool_response>" },
      { role: "user", content: "real question" },
    ],
    tools: [noParams],
  });
  return c;
}

// toolDump is ChatCompletionToolsParam.model_dump(): type, then function
// with name, description and parameters (null when absent), then any extra
// fields as given.
function toolDump(t) {
  const f = t.function || {};
  const fn = { name: f.name, description: f.description === undefined ? null : f.description, parameters: f.parameters === undefined ? null : f.parameters };
  for (const [k, v] of Object.entries(f)) if (!(k in fn)) fn[k] = v;
  const out = { type: t.type === undefined ? "function" : t.type, function: fn };
  for (const [k, v] of Object.entries(t)) if (!(k in out)) out[k] = v;
  return out;
}

// message is _parse_chat_message_content for a content format: "string"
// joins the text parts with "\n", "openai" keeps them as text parts.
function message(m, format) {
  let parts = m.content;
  if (parts === null || parts === undefined) parts = [];
  else if (typeof parts === "string") parts = [{ type: "text", text: parts }];
  const texts = [];
  for (const p of parts) {
    if (typeof p === "string") texts.push(p);
    else if (p.type === "text" && p.text !== null && p.text !== undefined) texts.push(p.text);
  }
  const out = { role: m.role, content: format === "openai" ? texts.map((t) => ({ type: "text", text: t })) : texts.join("\n") };
  if (m.role === "assistant") {
    if (m.tool_calls !== undefined && m.tool_calls !== null) out.tool_calls = JSON.parse(JSON.stringify(m.tool_calls));
    if (m.reasoning !== undefined && m.reasoning !== null) {
      out.reasoning = m.reasoning;
      out.reasoning_content = m.reasoning;
    }
  } else if (m.role === "tool") {
    if (m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
    if (Array.isArray(out.content)) out.content = out.content.map((p) => p.text).join("\n");
  }
  if (typeof m.name === "string") out.name = m.name;
  return out;
}

// postprocess is _postprocess_messages: tool call arguments become objects.
function postprocess(msgs) {
  for (const m of msgs) {
    if (m.role !== "assistant" || !Array.isArray(m.tool_calls)) continue;
    if (m.tool_calls.length === 0) {
      delete m.tool_calls;
      continue;
    }
    for (const tc of m.tool_calls) {
      const a = tc.function.arguments;
      if (typeof a === "string") {
        try {
          tc.function.arguments = JSON.parse(a);
        } catch {
          tc.function.arguments = {};
        }
      } else if (a === null || typeof a !== "object") {
        tc.function.arguments = {};
      }
    }
  }
  return msgs;
}

function specialTokens(cfg) {
  const out = {};
  for (const k of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
    let v = cfg[k];
    if (v && typeof v === "object") v = v.content;
    if (typeof v === "string") out[k] = v;
  }
  if (Array.isArray(cfg.additional_special_tokens)) out.additional_special_tokens = cfg.additional_special_tokens.map((v) => (typeof v === "object" ? v.content : v));
  return out;
}

function toTemplateInput(request, cfg, format) {
  return {
    ...specialTokens(cfg),
    ...(request.chat_template_kwargs || {}),
    messages: postprocess(request.messages.map((m) => message(m, format))),
    tools: request.tools === undefined || request.tools === null ? null : request.tools.map(toolDump),
    documents: null,
    add_generation_prompt: request.add_generation_prompt === undefined ? true : request.add_generation_prompt,
  };
}

// continueFinal is transformers' continue_final_message: the render ends
// where the final message's content does.
function continueFinal(rendered, input) {
  let final = input.messages[input.messages.length - 1].content;
  if (Array.isArray(final)) final = final.filter((p) => "text" in p).map((p) => p.text).pop();
  const trimmed = final.trim();
  if (!rendered.includes(trimmed)) throw new Error("continue_final_message: the final message does not appear in the render");
  const loc = rendered.lastIndexOf(trimmed);
  const lstripped = final.trimStart();
  if (rendered.slice(loc, loc + lstripped.length) === final) return rendered.slice(0, loc + lstripped.length);
  return rendered.slice(0, loc + trimmed.length);
}

module.exports = { conversations, toTemplateInput, continueFinal };

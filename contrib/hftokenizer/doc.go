// Package hftokenizer turns what a router receives — OpenAI-style request
// bodies, chat messages, prompt text — into the token ids a vLLM engine
// computes for them, in pure Go, so that the router can key the prompt's
// KV blocks with umbp's TokenKeyer and ask the pool which node holds them.
// It is a module of its own, so that the core module does not require a
// regular-expression engine, a template engine and x/text.
//
// # From a request to a node
//
//	tok, err := hftokenizer.LoadDir("/models/Qwen3-8B") // tokenizer.json, tokenizer_config.json
//	keyer, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{ /* the engines' connector settings */ })
//	keys, err := tok.RequestKeys(keyer, body, nil) // one *umbp.TokenKeys per prompt
//	s, err := h.Score(ctx, umbp.ScoreRequest{Candidates: nodes, Prompt: keys[0]})
//	// s.Nodes[s.Best] holds the most of the prompt; s.Best < 0: nobody holds its first block
//
// [Tokenizer.RequestPrompts] is the step before the keys: a
// /v1/chat/completions body (one with "messages") is rendered with the
// chat template and encoded, a /v1/completions body ("prompt") encoded, as
// vLLM's OpenAI server does it (see its doc for the rules and the vLLM
// code they follow); [Tokenizer.Encode] encodes text alone. Options
// ([RequestOptions]) carry the engine settings that change the tokens:
// --chat-template, --chat-template-content-format,
// --trust-request-chat-template, --exclude-tools-when-tool-choice-none,
// and which model names are LoRA adapters (hashed into the keys, as the
// request's cache_salt is).
//
// # What a router must keep identical to its engines
//
// The keys match an engine's only if every step matches: the same
// tokenizer.json and tokenizer_config.json (the same revision of the
// model's repository: a changed chat template or added token changes the
// tokens), the same --chat-template where the engines set one, the same
// connector settings in the TokenKeyer (namespace, tensor, context and
// pipeline parallel sizes, KV cache groups and block sizes, hash
// algorithm, PYTHONHASHSEED). A request that differs in any of these
// still routes, to a node chosen without the benefit of the pool.
//
// # Supported tokenizers
//
// Byte-level BPE tokenizers: a BPE model (with or without ignore_merges)
// behind a ByteLevel pre-tokenizer, optionally after Split patterns
// (Isolated), an NFC normalizer or none, added and special tokens without
// lstrip, rstrip or single_word, and a ByteLevel and/or TemplateProcessing
// post-processor (Llama 3.1's BOS). Tested: Llama 3, Llama 3.1, Qwen3;
// Llama 3.2 and 3.3, Qwen2 and Qwen2.5 ship tokenizers of the same kind.
// Every other kind is
// refused by [Load] with an error matching [ErrUnsupported] that names it —
// SentencePiece-style tokenizers (Unigram, WordPiece, WordLevel, BPE with
// byte_fallback: Llama 2, Mistral's, Gemma's), Metaspace, other
// normalizers and processors — never encoded approximately.
//
// Encode gives the ids Hugging Face tokenizers (the Rust library behind
// transformers' fast tokenizers, which vLLM uses) gives: checked against it
// for 5,629 strings chosen to break tokenizers (scripts, whitespace of
// every kind, digits, contractions, emoji sequences, combining marks,
// special-token text, runs of 60,000 characters), with and without special
// tokens, for Llama 3, Llama 3.1 and Qwen3: no difference. Split patterns
// run on github.com/dlclark/regexp2, whose Unicode classes are Go's
// (Unicode 15): a character Unicode assigned later may split differently
// from the Rust library's. Bytes of Go text that are not UTF-8 are encoded
// as U+FFFD, one each.
//
// Merging is O(n log n) in a pre-token's length (a priority queue over the
// word as a linked list, as tokenizers' Word::merge_all does), and words
// under 256 bytes are cached (10,000 of them). On one core of the
// development machine (GOMAXPROCS=1, an Intel Xeon shared with other
// work, its processor time counted) Encode makes 2.3 to 2.6 M tokens a
// second over 1 MiB of mixed text, and the slowest of thirteen
// 60,000-character inputs (runs of letters, spaces, newlines, digits, CJK,
// emoji, combining marks, punctuation; one word; special-token text) takes
// 31 ms: Qwen3's, on a run of emoji (BenchmarkEncode, BenchmarkEncodeLong).
//
// # Chat templates
//
// Templates are rendered with github.com/nikolalohinski/gonja/v2 as
// transformers renders them (transformers/utils/chat_template_utils.py):
// trim_blocks and lstrip_blocks, the tokenizer's special tokens (bos_token,
// eos_token, …) as variables, the request's chat_template_kwargs, messages,
// tools, documents and add_generation_prompt; raise_exception fails the
// render with [ErrTemplate]; strftime_now formats the clock
// ([RequestOptions.Now]); tojson writes as Python's json.dumps with
// ensure_ascii=False: the request's key order kept, ", " and ": " between
// items (",\n" with indent), floats as Python's repr, no HTML escaping.
// Checked for 26 conversations, with and without tools, tool calls and
// tool results, reasoning, continue_final_message and
// chat_template_kwargs, against @huggingface/jinja's renders on Llama 3's,
// Llama 3.1's and Qwen3's templates and on vLLM's Llama 3.1 tool-calling
// template (examples/tool_chat_template_llama3.1_json.jinja), and the
// renders' ids against tokenizers': no difference (scripts/hftokenizer-golden
// makes the data; testdata/README.md lists the files; where
// @huggingface/jinja lacks a filter the script says how the case was made).
// The request's objects keep their key order wherever Python's dicts do:
// tojson, items(), keys(), values(), | items. Where gonja differs from
// Jinja the package corrects it (lstrip_blocks strips whitespace before a
// block only from the start of a line); still different: a for loop over a
// dict itself (for k in d) goes in sorted order, and a dict printed as a
// whole is not written as Python's repr.
//
// # For a command line
//
// [Tokenizer.RequestPrompts] takes a request body as a file or stdin would
// give it and returns each prompt's ids (and the text they were encoded
// from); [Tokenizer.ChatPrompt] takes a chat's messages alone;
// [Tokenizer.Encode] encodes plain text; [Tokenizer.RequestKeys] goes on
// to the keys.
package hftokenizer

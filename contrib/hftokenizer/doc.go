// Package hftokenizer turns what a router receives — prompt text, chat
// messages, OpenAI-style request bodies — into the token ids a vLLM engine
// computes for them, in pure Go, so that the router can key the prompt's KV
// blocks with umbp's TokenKeyer and ask the pool which node holds them.
package hftokenizer

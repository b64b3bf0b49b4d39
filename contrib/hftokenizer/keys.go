package hftokenizer

import (
	"github.com/umbp-go/umbp-go/umbp"
)

// RequestKeys returns the pool keys of each prompt of an OpenAI-style
// request body ([Tokenizer.RequestPrompts]) under keyer: what a router
// gives [umbp.ScoreRequest] as its Prompt to find the node that holds the
// most of the request. The keyer must describe the engines that serve the
// request (namespace, topology, KV cache groups, hash algorithm and seed)
// and the tokenizer must be theirs: the same tokenizer.json and
// tokenizer_config.json (or the same --chat-template), or the keys match
// nothing.
func (t *Tokenizer) RequestKeys(keyer *umbp.TokenKeyer, body []byte, opts *RequestOptions) ([]*umbp.TokenKeys, error) {
	prompts, err := t.RequestPrompts(body, opts)
	if err != nil {
		return nil, err
	}
	out := make([]*umbp.TokenKeys, len(prompts))
	for i, p := range prompts {
		if out[i], err = keyer.Keys(p.Tokens, p.Extra); err != nil {
			return nil, err
		}
	}
	return out, nil
}

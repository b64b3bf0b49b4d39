package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/umbp-go/umbp-go/contrib/hftokenizer"
)

// textFlags are key text's and key request's: the model's tokenizer, and
// how its text becomes tokens.
type textFlags struct {
	tokenizer, chatTemplate string
	special                 bool
}

func (tf *textFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&tf.tokenizer, "tokenizer", "", "text, request: the model's directory holding tokenizer.json and tokenizer_config.json (each may be gzipped), the engines' own files")
	fs.BoolVar(&tf.special, "special", true, "text: add the special tokens (a BOS where the model has one), as /v1/completions does")
	fs.StringVar(&tf.chatTemplate, "chat-template", "", "request: a chat template file, as the engines' --chat-template (default: the model's own)")
}

// load reads the tokenizer -tokenizer names.
func (tf *textFlags) load() (*hftokenizer.Tokenizer, error) {
	if tf.tokenizer == "" {
		return nil, fmt.Errorf("%w: -tokenizer is required: the model's directory with tokenizer.json", errUsage)
	}
	tok, err := hftokenizer.LoadDir(tf.tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%w: -tokenizer %s: %w", errUsage, tf.tokenizer, err)
	}
	return tok, nil
}

// keyText writes the keys of a prompt's text: the arguments joined by
// spaces, or standard input whole.
func keyText(e env, kf *keyerFlags, tf *textFlags, args []string) error {
	keyer, err := kf.keyer("key text")
	if err != nil {
		return err
	}
	tok, err := tf.load()
	if err != nil {
		return err
	}
	var text string
	if len(args) == 0 || len(args) == 1 && args[0] == "-" {
		b, err := io.ReadAll(e.stdin)
		if err != nil {
			return err
		}
		text = string(b)
	} else {
		text = strings.Join(args, " ")
	}
	keys, err := keyer.Keys(tok.Encode(text, tf.special), kf.extra())
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	for _, k := range keys.Keys {
		fmt.Fprintln(e.stdout, k)
	}
	return nil
}

// keyRequest writes the keys of each prompt of an OpenAI-style request
// body (a file, or standard input), a blank line between prompts.
func keyRequest(e env, kf *keyerFlags, tf *textFlags, args []string) error {
	keyer, err := kf.keyer("key request")
	if err != nil {
		return err
	}
	tok, err := tf.load()
	if err != nil {
		return err
	}
	var body []byte
	switch {
	case len(args) > 1:
		return fmt.Errorf("%w: key request takes one request body: a file, or - for standard input", errUsage)
	case len(args) == 0 || args[0] == "-":
		body, err = io.ReadAll(e.stdin)
	default:
		body, err = os.ReadFile(args[0])
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	var opts hftokenizer.RequestOptions
	if tf.chatTemplate != "" {
		src, err := os.ReadFile(tf.chatTemplate)
		if err != nil {
			return fmt.Errorf("%w: -chat-template: %w", errUsage, err)
		}
		opts.ChatTemplate = string(src)
	}
	prompts, err := tok.RequestKeys(keyer, body, &opts)
	switch {
	case errors.Is(err, hftokenizer.ErrRequest), errors.Is(err, hftokenizer.ErrTemplate):
		return fmt.Errorf("%w: %w", errUsage, err)
	case err != nil:
		return err
	}
	for i, p := range prompts {
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		for _, k := range p.Keys {
			fmt.Fprintln(e.stdout, k)
		}
	}
	return nil
}

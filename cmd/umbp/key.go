package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

// The flags each key subcommand takes; any other is refused.
var keySubFlags = map[string][]string{
	"make":    {"ns", "topo", "group"},
	"parse":   {"json"},
	"tokens":  {"ns", "seed", "algo", "topo", "groups", "hash-block-size", "lora", "salt"},
	"text":    {"tokenizer", "special", "ns", "seed", "algo", "topo", "groups", "hash-block-size", "lora", "salt"},
	"request": {"tokenizer", "chat-template", "ns", "seed", "algo", "topo", "groups", "hash-block-size"},
}

const keyUsage = `usage:
  umbp key make   [-ns NS] [-topo tp=RANK/SIZE,...] [-group G] HASH...
  umbp key parse  [-json] KEY...
  umbp key tokens -ns NS -seed SEED [-algo A] [-topo tp=SIZE,...] [-groups ID:BS,...] [TOKEN... | -]
  umbp key text -tokenizer DIR -ns NS -seed SEED [-special=false] [...] [TEXT... | -]
  umbp key request -tokenizer DIR -ns NS -seed SEED [-chat-template FILE] [...] [BODY.json | -]
`

const keyAbout = `make writes the key of each block hash (hex) for one rank; parse decodes keys
(each invalid key is reported, the others decoded); tokens writes the keys
vLLM's UMBP connector stores a prompt's full blocks under, every rank of
every group, in the order a prefix lookup asks for them. Hashes, keys and
tokens come from the arguments, or from standard input when there are none
(or the only one is "-"); tokens may be separated by spaces, commas or
newlines, and brackets are ignored, so a JSON array of token IDs works.
text and request key what an engine would: text encodes a prompt's text
with the model's tokenizer (-tokenizer, the directory of the engines' own
tokenizer.json and tokenizer_config.json), adding the special tokens as
/v1/completions does unless -special=false; request reads an OpenAI-style
/v1/completions or /v1/chat/completions body, renders a chat with the
model's template (or -chat-template's, as the engine's --chat-template),
and writes each prompt's keys, a blank line between prompts. Only
byte-level BPE tokenizers (Llama 3, Qwen) are supported; others are
refused by name.
-topo names one rank as NAME=RANK/SIZE (make) or the engine's sizes as
NAME=SIZE (tokens); each subcommand refuses the other form and the flags it
does not take. A bad hash, key, namespace or token is a usage error
(status 2).
`

func keyHelp(fs *flag.FlagSet) string {
	return keyUsage + "\n" + keyAbout + "\nflags:\n" + flagHelp(fs, nil) +
		"\nRun 'umbp help key SUBCOMMAND' for the flags of one.\n"
}

func keyFlags(fs *flag.FlagSet, _ *common) func(context.Context, env, []string) error {
	var kf keyerFlags
	kf.register(fs)
	group := fs.Int("group", 0, "make: the KV cache group")
	asJSON := fs.Bool("json", false, "parse: print each key's parts as a JSON object")
	var tf textFlags
	tf.register(fs)
	return func(_ context.Context, e env, args []string) error {
		if len(args) == 0 {
			return fmt.Errorf("%w: name a subcommand: make, parse, tokens, text or request", errUsage)
		}
		sub, args := args[0], args[1:]
		names, ok := keySubFlags[sub]
		if !ok {
			return fmt.Errorf("%w: unknown subcommand %q: want make, parse, tokens, text or request", errUsage, sub)
		}
		// Flags may also follow the subcommand.
		switch err := parseFlags(fs, args); {
		case errors.Is(err, flag.ErrHelp):
			return &helpText{text: keySubHelp(sub, fs)}
		case err != nil:
			return err
		}
		if err := onlyFlags(fs, names, "to key "+sub); err != nil {
			return err
		}
		args = fs.Args()
		switch sub {
		case "make":
			return keyMake(e, &kf, *group, args)
		case "parse":
			return keyParse(e, *asJSON, args)
		case "text":
			return keyText(e, &kf, &tf, args)
		case "request":
			return keyRequest(e, &kf, &tf, args)
		}
		return keyTokens(e, &kf, args)
	}
}

// keySubHelp is the usage of one key subcommand, with its flags only.
func keySubHelp(sub string, fs *flag.FlagSet) string {
	var synopsis string
	for l := range strings.Lines(keyUsage) {
		if strings.HasPrefix(strings.TrimSpace(l), "umbp key "+sub+" ") {
			synopsis = strings.Join(strings.Fields(l), " ")
		}
	}
	return "usage: " + synopsis + "\n\n" + keyAbout + "\nflags:\n" + flagHelp(fs, keySubFlags[sub])
}

func keyMake(e env, kf *keyerFlags, group int, args []string) error {
	topo, err := kf.topo.rank("key make")
	if err != nil {
		return err
	}
	codec, err := umbp.NewKeyCodec(kf.namespace, topo)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	hashes, err := words(e.stdin, args)
	if err != nil {
		return err
	}
	// Every hash is checked before any key is written: a bad one is a
	// usage error, as a bad namespace is.
	keys := make([]string, len(hashes))
	for i, h := range hashes {
		if keys[i], err = codec.KeyHex(group, h); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	for _, k := range keys {
		fmt.Fprintln(e.stdout, k)
	}
	return nil
}

// parsedKey is a decoded key as parse -json prints it.
type parsedKey struct {
	Key       string `json:"key"`
	Namespace string `json:"namespace"`
	TPRank    int    `json:"tp_rank"`
	PCPRank   int    `json:"pcp_rank"`
	DCPRank   int    `json:"dcp_rank"`
	PPRank    int    `json:"pp_rank"`
	Group     int    `json:"group"`
	Hash      string `json:"hash"`
}

func keyParse(e env, asJSON bool, args []string) error {
	keys, err := words(e.stdin, args)
	if err != nil {
		return err
	}
	var errs []error
	enc := json.NewEncoder(e.stdout)
	for _, k := range keys {
		p, err := umbp.ParseKey(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if asJSON {
			if err := enc.Encode(parsedKey{k, p.Namespace, p.TPRank, p.PCPRank, p.DCPRank, p.PPRank, p.Group, hex.EncodeToString(p.Hash)}); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(e.stdout, "namespace=%s tp=%d pcp=%d dcp=%d pp=%d group=%d hash=%x\n",
			p.Namespace, p.TPRank, p.PCPRank, p.DCPRank, p.PPRank, p.Group, p.Hash)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errUsage, errors.Join(errs...))
	}
	return nil
}

func keyTokens(e env, kf *keyerFlags, args []string) error {
	keyer, err := kf.keyer("key tokens")
	if err != nil {
		return err
	}
	tokens, err := readTokens(e.stdin, args)
	if err != nil {
		return err
	}
	keys, err := keyer.Keys(tokens, kf.extra())
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err) // as lookup -tokens says it
	}
	for _, k := range keys.Keys {
		fmt.Fprintln(e.stdout, k)
	}
	return nil
}

// keyerFlags describe how the engines key their blocks.
type keyerFlags struct {
	namespace, seed, algo string
	lora, salt            string
	hashBlockSize         int
	topo                  topoFlag
	groups                groupsFlag
}

func (kf *keyerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&kf.namespace, "ns", "", "the connector's key namespace")
	fs.Var(&kf.topo, "topo", "one rank as NAME=RANK/SIZE (key make), or the engine's sizes as NAME=SIZE (the keys of every rank: tokens); NAMEs tp, pcp, dcp, pp, comma-separated; unnamed ones are rank 0 of 1")
	fs.StringVar(&kf.seed, "seed", "", "tokens: the engines' PYTHONHASHSEED (required: without it vLLM's keys are random per process)")
	fs.StringVar(&kf.algo, "algo", "sha256", "tokens: the engines' --prefix-caching-hash-algo: sha256, sha256_cbor, xxhash or xxhash_cbor")
	fs.Var(&kf.groups, "groups", "tokens: the prefix-cacheable KV cache groups as ID:BLOCK_SIZE, comma-separated (default 0:16)")
	fs.IntVar(&kf.hashBlockSize, "hash-block-size", 0, "tokens: vLLM's hash_block_size; 0 means the gcd of the groups' block sizes")
	fs.StringVar(&kf.lora, "lora", "", "tokens: the request's LoRA adapter name")
	fs.StringVar(&kf.salt, "salt", "", "tokens: the request's cache_salt")
}

func (kf *keyerFlags) extra() vllmhash.ExtraKeys {
	return vllmhash.ExtraKeys{LoRAName: kf.lora, CacheSalt: kf.salt}
}

// tokenFlags are the flags that say how tokens are keyed: only commands
// that key tokens take them.
var tokenFlags = []string{"ns", "seed", "algo", "topo", "groups", "hash-block-size", "lora", "salt"}

// keyer builds the token keyer the flags describe, for the command where.
func (kf *keyerFlags) keyer(where string) (*umbp.TokenKeyer, error) {
	topo, err := kf.topo.sizes(where)
	if err != nil {
		return nil, err
	}
	if kf.seed == "" {
		return nil, fmt.Errorf("%w: -seed is required: the engines' PYTHONHASHSEED", errUsage)
	}
	alg, err := vllmhash.ParseAlgorithm(kf.algo)
	if err != nil {
		return nil, fmt.Errorf("%w: -algo: %w", errUsage, err)
	}
	hasher, err := vllmhash.NewHasher(alg, kf.seed)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	groups := []umbp.KVCacheGroup(kf.groups)
	if len(groups) == 0 {
		groups = []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}}
	}
	k, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace:     kf.namespace,
		Topology:      topo,
		Groups:        groups,
		HashBlockSize: kf.hashBlockSize,
		Hasher:        hasher,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return k, nil
}

// topoFlag is a RankTopology as -topo writes it, in one of two forms that
// mean the same everywhere: one rank, every dimension as NAME=RANK/SIZE
// ("tp=1/2,pp=0/2"), or the engine's sizes, every dimension as NAME=SIZE
// ("tp=2"). A command that needs the other form refuses it.
type topoFlag struct {
	umbp.RankTopology
	form topoForm
	text string // as given
}

type topoForm int

const (
	topoUnset topoForm = iota
	topoRank
	topoSizes
)

func (t *topoFlag) String() string {
	if t == nil {
		return ""
	}
	n := t.Normalized()
	if t.form == topoSizes {
		return fmt.Sprintf("tp=%d,pcp=%d,dcp=%d,pp=%d", n.TPSize, n.PCPSize, n.DCPSize, n.PPSize)
	}
	return fmt.Sprintf("tp=%d/%d,pcp=%d/%d,dcp=%d/%d,pp=%d/%d", n.TPRank, n.TPSize, n.PCPRank, n.PCPSize, n.DCPRank, n.DCPSize, n.PPRank, n.PPSize)
}

func (t *topoFlag) Set(v string) error {
	var topo umbp.RankTopology
	form := topoUnset
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, val, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("%q: want NAME=RANK/SIZE or NAME=SIZE", f)
		}
		rank, size := 0, 0
		this := topoSizes
		var err error
		if r, s, ok := strings.Cut(val, "/"); ok {
			this = topoRank
			if rank, err = strconv.Atoi(r); err == nil {
				size, err = strconv.Atoi(s)
			}
		} else {
			size, err = strconv.Atoi(val)
		}
		if err != nil {
			return fmt.Errorf("%q: %w", f, err)
		}
		if form != topoUnset && form != this {
			return fmt.Errorf("%q: write every dimension as NAME=RANK/SIZE (one rank) or every one as NAME=SIZE (the engine's sizes), not both", v)
		}
		form = this
		switch strings.ToLower(name) {
		case "tp":
			topo.TPRank, topo.TPSize = rank, size
		case "pcp":
			topo.PCPRank, topo.PCPSize = rank, size
		case "dcp":
			topo.DCPRank, topo.DCPSize = rank, size
		case "pp":
			topo.PPRank, topo.PPSize = rank, size
		default:
			return fmt.Errorf("%q: unknown dimension %q: want tp, pcp, dcp or pp", f, name)
		}
	}
	if err := topo.Validate(); err != nil {
		return err
	}
	t.RankTopology, t.form, t.text = topo, form, v
	return nil
}

// rank returns the one rank that -topo names, for where, which writes one
// rank's keys: sizes alone are refused.
func (t *topoFlag) rank(where string) (umbp.RankTopology, error) {
	if t.form == topoSizes {
		return umbp.RankTopology{}, fmt.Errorf("%w: -topo %s gives sizes (NAME=SIZE), but %s writes the keys of one rank: name it as NAME=RANK/SIZE (tp=1/2 is rank 1 of 2)",
			errUsage, t.text, where)
	}
	return t.RankTopology, nil
}

// sizes returns the engine's sizes that -topo gives, for where, which keys
// every rank: a rank is refused.
func (t *topoFlag) sizes(where string) (umbp.RankTopology, error) {
	if t.form == topoRank {
		n := t.Normalized()
		return umbp.RankTopology{}, fmt.Errorf("%w: -topo %s names a rank (NAME=RANK/SIZE), but %s keys every rank of the engine: give its sizes as NAME=SIZE (tp=%d)",
			errUsage, t.text, where, n.TPSize)
	}
	return t.RankTopology, nil
}

// groupsFlag is a list of KV cache groups written as "0:16,1:32".
type groupsFlag []umbp.KVCacheGroup

func (g *groupsFlag) String() string {
	if g == nil {
		return ""
	}
	s := make([]string, len(*g))
	for i, x := range *g {
		s[i] = fmt.Sprintf("%d:%d", x.ID, x.BlockSize)
	}
	return strings.Join(s, ",")
}

func (g *groupsFlag) Set(v string) error {
	var out groupsFlag
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		id, bs, ok := strings.Cut(f, ":")
		if !ok {
			return fmt.Errorf("%q: want ID:BLOCK_SIZE", f)
		}
		i, err := strconv.Atoi(id)
		if err != nil {
			return fmt.Errorf("%q: %w", f, err)
		}
		b, err := strconv.Atoi(bs)
		if err != nil {
			return fmt.Errorf("%q: %w", f, err)
		}
		out = append(out, umbp.KVCacheGroup{ID: i, BlockSize: b})
	}
	*g = out
	return nil
}

// words returns the arguments, or the whitespace-separated words of r when
// there are none or the only one is "-".
func words(r io.Reader, args []string) ([]string, error) {
	if len(args) > 0 && !(len(args) == 1 && args[0] == "-") {
		return args, nil
	}
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	sc.Split(bufio.ScanWords)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading standard input: %w", err)
	}
	return out, nil
}

// readTokens reads token IDs from the arguments or standard input (see
// words), separated by spaces, commas or newlines; brackets are ignored.
// tokenForm is what token input looks like, as an error says it.
const tokenForm = "token ids as integers, separated by spaces or commas, or a JSON array such as [1, 2, 3]"

// badToken says why f is no token.
func badToken(f string, err error) string {
	switch {
	case strings.ContainsAny(f, "{}\":"):
		return fmt.Sprintf("token %q: a JSON object or string, not a token id: give %s (for a request's JSON, its token list, e.g. jq -c .prompt_token_ids)", f, tokenForm)
	case errors.Is(err, strconv.ErrRange):
		return fmt.Sprintf("token %q is out of range: token ids are 32-bit integers", f)
	}
	return fmt.Sprintf("token %q is not an integer: give %s", f, tokenForm)
}

func readTokens(r io.Reader, args []string) ([]int32, error) {
	ws, err := words(r, args)
	if err != nil {
		return nil, err
	}
	var out []int32
	for _, w := range ws {
		w = strings.NewReplacer("[", " ", "]", " ", ",", " ").Replace(w)
		for f := range strings.FieldsSeq(w) {
			t, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%w: %s", errUsage, badToken(f, err))
			}
			out = append(out, int32(t))
		}
	}
	return out, nil
}

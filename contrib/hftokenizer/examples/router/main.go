// Command router picks a node for each OpenAI-style request: it turns the
// request body into the tokens a vLLM engine computes for it (the model's
// tokenizer files and chat template), the tokens into the pool's keys, and
// asks MORI's UMBP master which node holds the most of them. It reads one
// request body per line (a /v1/chat/completions or /v1/completions body)
// and prints each decision.
//
// With no -master it starts the test master in-process, with two demo
// nodes: node-a holds the blocks of a first chat turn, node-b nothing.
// Then a second turn of that chat goes to node-a and anything else
// round-robin:
//
//	go run ./examples/router -tokenizer testdata/qwen3 <<'EOF'
//	{"messages": [{"role": "system", "content": "You are a travel agent: short answers, prices in euros."}, {"role": "user", "content": "Plan a weekend in Lyon."}, {"role": "assistant", "content": "Day one: the old town."}, {"role": "user", "content": "And day two?"}]}
//	{"prompt": "Once upon a time"}
//	EOF
//
// Against a real pool, give the master and the engines' key settings:
//
//	go run ./examples/router -tokenizer /models/Qwen3-8B -master 10.0.0.5:50551 \
//	    -namespace prod -block-size 16 -hash sha256 -seed 0 -nodes node-a,node-b
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/umbp-go/umbp-go/contrib/hftokenizer"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

type config struct {
	tokenizer, master, namespace, hash, seed, nodes string
	blockSize                                       int
}

func main() {
	var c config
	flag.StringVar(&c.tokenizer, "tokenizer", "testdata/qwen3", "the model's directory: tokenizer.json and tokenizer_config.json (or .gz)")
	flag.StringVar(&c.master, "master", "", "MORI's UMBP master, host:port; empty starts the test master with demo nodes")
	flag.StringVar(&c.namespace, "namespace", "router-demo", "the engines' UMBP key namespace")
	flag.IntVar(&c.blockSize, "block-size", 16, "the engines' KV block size, in tokens")
	flag.StringVar(&c.hash, "hash", "sha256", "the engines' prefix-cache hash algorithm (vllmhash names)")
	flag.StringVar(&c.seed, "seed", "0", "the engines' PYTHONHASHSEED")
	flag.StringVar(&c.nodes, "nodes", "", "the candidate nodes, comma-separated; empty: the demo nodes, or every node holding a block")
	flag.Parse()
	if err := run(c, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(1)
	}
}

// demoFirstTurn is the chat turn node-a served in the demo.
const demoFirstTurn = `{"messages": [{"role": "system", "content": "You are a travel agent: short answers, prices in euros."}, {"role": "user", "content": "Plan a weekend in Lyon."}]}`

func run(c config, in io.Reader, out io.Writer) error {
	ctx := context.Background()
	tok, err := hftokenizer.LoadDir(c.tokenizer)
	if err != nil {
		return err
	}
	alg, err := vllmhash.ParseAlgorithm(c.hash)
	if err != nil {
		return err
	}
	hasher, err := vllmhash.NewHasher(alg, c.seed)
	if err != nil {
		return err
	}
	keyer, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: c.namespace,
		Groups:    []umbp.KVCacheGroup{{ID: 0, BlockSize: c.blockSize}},
		Hasher:    hasher,
	})
	if err != nil {
		return err
	}
	var candidates []string
	if c.nodes != "" {
		candidates = strings.Split(c.nodes, ",")
	}
	if c.master == "" {
		m, err := umbptest.StartMaster(umbptest.MasterOptions{})
		if err != nil {
			return err
		}
		defer m.Close()
		c.master = m.Addr()
		// node-a served the chat's first turn and holds its blocks.
		served, err := tok.RequestKeys(keyer, []byte(demoFirstTurn), nil)
		if err != nil {
			return err
		}
		for id, keys := range map[string][]string{"node-a": served[0].Keys, "node-b": nil} {
			n, err := umbptest.StartNode(ctx, c.master, umbptest.NodeOptions{
				ID: id, PeerAddress: id + ".local:8000",
				External: map[umbptest.Tier][]string{umbptest.TierHBM: keys},
			})
			if err != nil {
				return err
			}
			defer n.Close()
		}
		if candidates == nil {
			candidates = []string{"node-a", "node-b"}
		}
	}
	rt, err := umbp.NewClusterRuntime(umbp.ClusterConfig{
		Masters: []string{c.master}, LookupTimeout: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	h, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		return err
	}
	defer h.Close()

	next := 0 // round robin for requests nobody holds
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 64<<20)
	for line := 1; sc.Scan(); line++ {
		body := sc.Bytes()
		if strings.TrimSpace(string(body)) == "" {
			continue
		}
		keys, err := tok.RequestKeys(keyer, body, nil)
		if err != nil {
			fmt.Fprintf(out, "request %d: %v\n", line, err)
			continue
		}
		for p, k := range keys {
			s, err := h.Score(ctx, umbp.ScoreRequest{Candidates: candidates, Prompt: k})
			if err != nil {
				fmt.Fprintf(out, "request %d prompt %d: %v\n", line, p, err)
				continue
			}
			switch {
			case s.Best >= 0 && s.Complete:
				b := s.Nodes[s.Best]
				fmt.Fprintf(out, "request %d prompt %d -> %s at %s: holds %d of its first tokens\n", line, p, b.Node, b.PeerAddress, b.Tokens)
			case len(candidates) > 0:
				fmt.Fprintf(out, "request %d prompt %d -> %s (round robin: no node holds its first block)\n", line, p, candidates[next%len(candidates)])
				next++
			default:
				fmt.Fprintf(out, "request %d prompt %d: no node holds its first block\n", line, p)
			}
		}
	}
	return sc.Err()
}

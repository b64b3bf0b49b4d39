package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/umbp-go/umbp-go/umbp"
)

// The cluster command asks MORI's UMBP master, as a router or a
// distributed scheduler would, through the same scheduler handle:
//
//	umbp cluster lookup [-master ADDR] KEY...            which keys does some node hold?
//	umbp cluster lookup -tokens -ns NS -seed S TOKEN...  how much of a prompt does the pool hold?
//	umbp cluster match  HASH... | -tokens ...            which nodes hold the leading blocks, by tier?
//	umbp cluster score  -nodes N1,N2 HASH... | -tokens   rank nodes for a request
//
// -master defaults to $UMBP_MASTER_ADDRESS. Plaintext is allowed to
// loopback only unless -allow-plaintext; -tls-ca (and -tls-cert, -tls-key
// for mutual TLS) give TLS. Nothing here calls RouteGet: it leases.

func clusterFlags(fs *flag.FlagSet, c *common) func(context.Context, env, []string) error {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: umbp cluster lookup|match|score [flags] ARGS...

Ask MORI's UMBP master, as a router or a distributed scheduler would.
  lookup KEY...                  which keys some node holds (BatchLookup)
  lookup -tokens TOKEN...        how much of a prompt the pool holds
  match HASH... | -tokens ...    which nodes hold the leading blocks, by tier (MatchExternalKv)
  score -nodes N1,N2 HASH...     rank candidate nodes for a request

Run 'umbp cluster SUBCOMMAND -h' for its flags.
`)
	}
	return func(ctx context.Context, e env, args []string) error {
		if len(args) == 0 {
			return fmt.Errorf("%w: name a subcommand: lookup, match or score", errUsage)
		}
		sub, rest := args[0], args[1:]
		switch sub {
		case "lookup", "match", "score":
		default:
			return fmt.Errorf("%w: unknown subcommand %q", errUsage, sub)
		}
		sfs := flag.NewFlagSet("umbp cluster "+sub, flag.ContinueOnError)
		sfs.SetOutput(e.stderr)
		var cf clusterCommon
		cf.register(sfs)
		var kf keyerFlags
		kf.register(sfs)
		sfs.BoolVar(&c.verbose, "v", false, "log the client library's debug messages on stderr")
		tokens := sfs.Bool("tokens", false, "the arguments (or standard input) are a prompt's token IDs, keyed as -ns, -seed, -algo, -topo and -groups say")
		asJSON := sfs.Bool("json", false, "print the answer as JSON")
		var nodes *string
		var w umbp.TierWeights
		if sub != "lookup" {
			sfs.Float64Var(&w.HBM, "w-hbm", 1, "weight of a leading block on HBM")
			sfs.Float64Var(&w.DRAM, "w-dram", 1, "weight of a leading block on DRAM")
			sfs.Float64Var(&w.SSD, "w-ssd", 1, "weight of a leading block on SSD")
		}
		if sub == "score" {
			nodes = sfs.String("nodes", "", "the candidate node ids, comma-separated (required)")
		}
		if err := sfs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return errFlagsReported
		}
		h, err := cf.handle(ctx, c.logger(e.stderr))
		if err != nil {
			return err
		}
		defer func() {
			if err := h.Close(); err != nil {
				fmt.Fprintln(e.stderr, "umbp cluster:", err)
			}
		}()
		var keys *umbp.TokenKeys
		var items []string
		if *tokens {
			keyer, err := kf.keyer()
			if err != nil {
				return err
			}
			toks, err := readTokens(e.stdin, sfs.Args())
			if err != nil {
				return err
			}
			if keys, err = keyer.Keys(toks, kf.extra()); err != nil {
				return fmt.Errorf("%w: %w", errUsage, err)
			}
			items = keys.Keys
		} else if items, err = words(e.stdin, sfs.Args()); err != nil {
			return err
		}
		if len(items) == 0 {
			return fmt.Errorf("%w: name the keys, hashes or tokens", errUsage)
		}
		before := h.Stats()
		if sub == "lookup" {
			return clusterLookup(ctx, e, c, h, before, cf.timeout, items, keys, *asJSON)
		}
		req := umbp.ScoreRequest{BlockHashes: items, Weights: w}
		if sub == "score" {
			if *nodes == "" {
				return fmt.Errorf("%w: -nodes is required", errUsage)
			}
			req.Candidates = strings.Split(*nodes, ",")
		}
		s, err := h.Score(ctx, req)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		if err := answeredWithin(ctx, c, h, before, cf.timeout); err != nil {
			return err
		}
		if !s.Complete {
			return errors.New("the master's answer was incomplete (the reason is logged)")
		}
		return printScores(e, s, keys, *asJSON)
	}
}

type clusterCommon struct {
	master, ca, cert, key, serverName string
	allowPlaintext                    bool
	timeout                           time.Duration
}

func (cf *clusterCommon) register(fs *flag.FlagSet) {
	fs.StringVar(&cf.master, "master", os.Getenv("UMBP_MASTER_ADDRESS"), "the master's host:port (default $UMBP_MASTER_ADDRESS)")
	fs.DurationVar(&cf.timeout, "timeout", 5*time.Second, "how long to wait for the master at start, and for each call")
	fs.BoolVar(&cf.allowPlaintext, "allow-plaintext", false, "allow plaintext to a master that is not on loopback (anyone on the path can read and forge)")
	fs.StringVar(&cf.ca, "tls-ca", "", "PEM file of the CA that signed the master's certificate: use TLS")
	fs.StringVar(&cf.cert, "tls-cert", "", "PEM client certificate, for mutual TLS (with -tls-key)")
	fs.StringVar(&cf.key, "tls-key", "", "PEM client key, for mutual TLS")
	fs.StringVar(&cf.serverName, "tls-server-name", "", "the name the master's certificate must hold (default: the host of -master)")
}

func (cf *clusterCommon) creds() (credentials.TransportCredentials, error) {
	if cf.ca == "" {
		if cf.cert != "" || cf.key != "" {
			return nil, fmt.Errorf("%w: -tls-cert and -tls-key need -tls-ca", errUsage)
		}
		return nil, nil
	}
	pem, err := os.ReadFile(cf.ca)
	if err != nil {
		return nil, fmt.Errorf("%w: -tls-ca: %w", errUsage, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: -tls-ca: %s holds no PEM certificate", errUsage, cf.ca)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: cf.serverName, MinVersion: tls.VersionTLS12}
	if cf.cert != "" || cf.key != "" {
		pair, err := tls.LoadX509KeyPair(cf.cert, cf.key)
		if err != nil {
			return nil, fmt.Errorf("%w: -tls-cert, -tls-key: %w", errUsage, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg), nil
}

func (cf *clusterCommon) handle(ctx context.Context, log *slog.Logger) (*umbp.SchedulerHandle, error) {
	if cf.master == "" {
		return nil, fmt.Errorf("%w: -master (or $UMBP_MASTER_ADDRESS) is required", errUsage)
	}
	if cf.timeout <= 0 {
		return nil, fmt.Errorf("%w: -timeout must be positive", errUsage)
	}
	creds, err := cf.creds()
	if err != nil {
		return nil, err
	}
	cfg := umbp.ClusterConfig{
		Master: cf.master, TransportCredentials: creds, AllowPlaintext: cf.allowPlaintext,
		LookupTimeout: cf.timeout, Timeout: cf.timeout, StartupTimeout: cf.timeout,
		LoadFailureQuarantine: -1, Logger: log,
	}
	rt, err := umbp.NewClusterRuntime(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return rt.NewSchedulerHandle(ctx)
}

type clusterLookupAnswer struct {
	Keys       []keyAnswer `json:"keys,omitempty"`
	Held       int         `json:"held"`
	Leading    int         `json:"leading"`
	HeldTokens *int        `json:"held_tokens,omitempty"`
}

func clusterLookup(ctx context.Context, e env, c *common, h *umbp.SchedulerHandle, before umbp.Stats, timeout time.Duration, keys []string, tk *umbp.TokenKeys, asJSON bool) error {
	hits := h.Lookup(ctx, keys)
	if err := answeredWithin(ctx, c, h, before, timeout); err != nil {
		return err
	}
	var ans clusterLookupAnswer
	for i, k := range keys {
		if hits[i] {
			ans.Held++
		}
		if ans.Leading == i && hits[i] {
			ans.Leading++
		}
		if tk == nil {
			ans.Keys = append(ans.Keys, keyAnswer{Key: k, Held: hits[i]})
		}
	}
	if tk != nil {
		t := tk.Tokens(ans.Leading)
		ans.HeldTokens = &t
	}
	if asJSON {
		return printJSON(e, ans)
	}
	for _, k := range ans.Keys {
		mark := "-"
		if k.Held {
			mark = "held"
		}
		fmt.Fprintf(e.stdout, "%-4s  %s\n", mark, k.Key)
	}
	fmt.Fprintf(e.stdout, "%d of %d keys held, the leading %d\n", ans.Held, len(keys), ans.Leading)
	if ans.HeldTokens != nil {
		fmt.Fprintf(e.stdout, "held      %d tokens of the prompt\n", *ans.HeldTokens)
	}
	return nil
}

type scoreAnswer struct {
	Nodes      []nodeAnswer `json:"nodes"`
	Best       string       `json:"best,omitempty"`
	PoolPrefix int          `json:"pool_prefix"`
}

type nodeAnswer struct {
	Node   string  `json:"node"`
	Peer   string  `json:"peer_address,omitempty"`
	Prefix int     `json:"prefix"`
	HBM    int     `json:"hbm"`
	DRAM   int     `json:"dram"`
	SSD    int     `json:"ssd"`
	Held   int     `json:"held"`
	Tokens *int    `json:"tokens,omitempty"`
	Score  float64 `json:"score"`
}

func printScores(e env, s umbp.Scores, tk *umbp.TokenKeys, asJSON bool) error {
	ans := scoreAnswer{PoolPrefix: s.PoolPrefix, Nodes: []nodeAnswer{}}
	if s.Best >= 0 {
		ans.Best = s.Nodes[s.Best].Node
	}
	for _, n := range s.Nodes {
		a := nodeAnswer{Node: n.Node, Peer: n.PeerAddress, Prefix: n.Prefix, HBM: n.HBM, DRAM: n.DRAM, SSD: n.SSD, Held: n.Held, Score: n.Score}
		if tk != nil {
			t := tk.Tokens(n.Prefix)
			a.Tokens = &t
		}
		ans.Nodes = append(ans.Nodes, a)
	}
	if asJSON {
		return printJSON(e, ans)
	}
	fmt.Fprintf(e.stdout, "%-24s %8s %6s %6s %6s %6s %8s  %s\n", "node", "prefix", "hbm", "dram", "ssd", "held", "score", "peer")
	for _, n := range ans.Nodes {
		fmt.Fprintf(e.stdout, "%-24s %8d %6d %6d %6d %6d %8.2f  %s\n", n.Node, n.Prefix, n.HBM, n.DRAM, n.SSD, n.Held, n.Score, n.Peer)
	}
	best := ans.Best
	if best == "" {
		best = "(none holds a leading block)"
	}
	fmt.Fprintf(e.stdout, "best %s; the pool holds the leading %d blocks\n", best, ans.PoolPrefix)
	return nil
}

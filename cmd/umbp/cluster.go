package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/rpc"
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
// for mutual TLS) give TLS. It checks and says things as the commands on a
// node's server do: a bad key, hash or flag is a usage error (2) before
// anything is dialled, a master that refuses connections is said at once.
// Nothing here calls RouteGet: it leases.

const clusterAbout = `Ask MORI's UMBP master, as a router or a distributed scheduler would.
  lookup KEY...                  which keys some node holds (BatchLookup)
  lookup -tokens TOKEN...        how much of a prompt the pool holds
  match HASH... | -tokens ...    which nodes hold the leading blocks, by tier (MatchExternalKv)
  score -nodes N1,N2 HASH...     rank candidate nodes for a request
Keys, hashes and tokens come from the arguments, or from standard input when
there are none (or the only one is "-"). A master that refuses connections is
said at once; one that accepts them but does not answer within -timeout (a
stopped process?) is waited for that long.
`

func clusterHelp(fs *flag.FlagSet) string {
	return "usage: umbp cluster lookup|match|score [flags] ARGS...\n\n" + clusterAbout +
		"\nflags of every subcommand (before or after it):\n" + flagHelp(fs, nil) +
		"\nRun 'umbp help cluster SUBCOMMAND' for all the flags of one.\n"
}

// The flags each cluster subcommand takes besides the master's, for keys
// or hashes; with -tokens, the token flags instead of those for keys only.
// Any other is refused.
var (
	clusterSubFlags = map[string][]string{
		"lookup": {"json", "q", "raw"},
		"match":  {"json", "w-hbm", "w-dram", "w-ssd"},
		"score":  {"json", "w-hbm", "w-dram", "w-ssd", "nodes"},
	}
	clusterKeysOnly = []string{"q", "raw"}
)

// What each cluster subcommand does, for its help.
var clusterSubAbout = map[string]string{
	"lookup": `usage: umbp cluster lookup [flags] KEY... | -tokens [flags] TOKEN...

Show which keys some node holds (BatchLookup), a line per key and a summary
as lookup prints them, or with -tokens how much of a prompt the pool holds.
`,
	"match": `usage: umbp cluster match [flags] HASH... | -tokens [flags] TOKEN...

Show which nodes hold the request's leading blocks, by tier (MatchExternalKv;
hits not counted).
`,
	"score": `usage: umbp cluster score -nodes N1,N2,... [flags] HASH... | -tokens [flags] TOKEN...

Rank the candidate nodes for a request by the leading blocks each holds,
weighed by tier.
`,
}

func clusterFlags(fs *flag.FlagSet, c *common) func(context.Context, env, []string) error {
	var cf clusterCommon
	cf.register(fs, c)
	return func(ctx context.Context, e env, args []string) error {
		if len(args) == 0 {
			return fmt.Errorf("%w: name a subcommand: lookup, match or score", errUsage)
		}
		sub, rest := args[0], args[1:]
		own, ok := clusterSubFlags[sub]
		if !ok {
			return fmt.Errorf("%w: unknown subcommand %q: want lookup, match or score", errUsage, sub)
		}
		sfs := flag.NewFlagSet("umbp cluster "+sub, flag.ContinueOnError)
		share(sfs, fs)
		var master []string
		fs.VisitAll(func(f *flag.Flag) { master = append(master, f.Name) })
		var kf keyerFlags
		kf.register(sfs)
		tokens := sfs.Bool("tokens", false, "the arguments (or standard input) are a prompt's token IDs, keyed as -ns, -seed, -algo, -topo and -groups say")
		asJSON := sfs.Bool("json", false, "print the answer as JSON")
		var quiet, raw *bool
		var nodes *string
		var w umbp.TierWeights
		switch sub {
		case "lookup":
			quiet = sfs.Bool("q", false, "keys: print only the summary, not a line per key")
			raw = sfs.Bool("raw", false, "keys: look the keys up as they are, whatever their form; without -raw each must be a key as 'umbp key make' writes it")
		default:
			sfs.Float64Var(&w.HBM, "w-hbm", 1, "weight of a leading block on HBM")
			sfs.Float64Var(&w.DRAM, "w-dram", 1, "weight of a leading block on DRAM")
			sfs.Float64Var(&w.SSD, "w-ssd", 1, "weight of a leading block on SSD")
		}
		if sub == "score" {
			nodes = sfs.String("nodes", "", "the candidate node ids, comma-separated (required)")
		}
		allowed := append(slices.Clone(master), own...)
		switch err := parseFlags(sfs, rest); {
		case errors.Is(err, flag.ErrHelp):
			return &helpText{text: clusterSubHelp(sub, sfs, append(append(slices.Clone(allowed), "tokens"), tokenFlags...))}
		case err != nil:
			return err
		}
		where := "to cluster " + sub
		if *tokens {
			allowed = slices.DeleteFunc(allowed, func(f string) bool { return slices.Contains(clusterKeysOnly, f) })
			allowed = append(append(allowed, "tokens"), tokenFlags...)
			where += " -tokens"
		} else if sub == "lookup" {
			where += " of keys (they key tokens: pass -tokens)"
		} else {
			where += " of hashes (they key tokens: pass -tokens)"
		}
		if err := onlyFlags(sfs, allowed, where); err != nil {
			return err
		}
		c.log = c.logger(e.stderr) // -v may follow the subcommand

		// Everything that can be checked here is, before the master is
		// dialled: the flags, the address, the input.
		if err := cf.check(); err != nil {
			return err
		}
		var keys *umbp.TokenKeys
		var items []string
		var keyer *umbp.TokenKeyer
		var toks []int32
		if *tokens {
			var err error
			if keyer, err = kf.keyer("cluster " + sub + " -tokens"); err != nil {
				return err
			}
			if toks, err = readTokens(e.stdin, sfs.Args()); err != nil {
				return err
			}
			if keys, err = keyer.Keys(toks, kf.extra()); err != nil {
				return fmt.Errorf("%w: %w", errUsage, err)
			}
			items = keys.Keys
		} else {
			var err error
			if items, err = words(e.stdin, sfs.Args()); err != nil {
				return err
			}
			if len(items) == 0 {
				what := "keys"
				if sub != "lookup" {
					what = "hashes"
				}
				return fmt.Errorf("%w: name the %s (or pass -tokens and the prompt's tokens)", errUsage, what)
			}
		}
		a := asker{cmd: "cluster", what: "the master", timeout: cf.timeout, open: func(ctx context.Context) (*umbp.SchedulerHandle, error) {
			return cf.handle(ctx, c)
		}}
		if sub == "lookup" {
			if *tokens {
				return lookupTokens(ctx, e, c, a, keyer, toks, kf, *asJSON)
			}
			if err := checkKeys(items, *raw); err != nil {
				return err
			}
			return lookupKeys(ctx, e, c, a, items, *quiet, *asJSON)
		}
		req := umbp.ScoreRequest{BlockHashes: items, Weights: w}
		if sub == "score" {
			if *nodes == "" {
				return fmt.Errorf("%w: -nodes is required: the candidate node ids, comma-separated", errUsage)
			}
			req.Candidates = strings.Split(*nodes, ",")
		}
		if err := checkScore(req); err != nil {
			return err
		}
		h, err := a.open(ctx)
		if err != nil {
			return err
		}
		defer closeScheduler(e, a.cmd, h)
		before := h.Stats()
		s, err := h.Score(ctx, req)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		if err := answeredWithin(ctx, c, h, before, a.what, a.timeout); err != nil {
			return err
		}
		if !s.Complete {
			why := "the library logged no reason"
			if w := c.lib.lastWarning(); w != "" {
				why = w
			}
			return fmt.Errorf("the master's answer was incomplete (%s)", why)
		}
		return printScores(e, s, keys, *asJSON)
	}
}

// clusterSubHelp is the usage of one cluster subcommand, with its flags
// only.
func clusterSubHelp(sub string, fs *flag.FlagSet, names []string) string {
	return clusterSubAbout[sub] + "\nflags (-ns, -seed, -algo, -topo, -groups, -hash-block-size, -lora and -salt with -tokens only):\n" + flagHelp(fs, names)
}

// checkScore refuses, as the library would once attached, a request it
// cannot ask about, and what it would cut short without a word: a hash
// that is empty or not UTF-8, a weight that is negative or not a number.
func checkScore(req umbp.ScoreRequest) error {
	// The weights first, in the words of their flags (the library's
	// would name its fields).
	for _, w := range []struct {
		flag string
		v    float64
	}{{"-w-hbm", req.Weights.HBM}, {"-w-dram", req.Weights.DRAM}, {"-w-ssd", req.Weights.SSD}} {
		if w.v < 0 || math.IsNaN(w.v) || math.IsInf(w.v, 0) {
			return fmt.Errorf("%w: %s %v: want a weight of 0 or more", errUsage, w.flag, w.v)
		}
	}
	if err := req.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	for i, h := range req.BlockHashes {
		if h == "" || !utf8.ValidString(h) {
			return fmt.Errorf("%w: hash %d (%q) is empty or not UTF-8: no master can hold it", errUsage, i, h)
		}
	}
	return nil
}

type clusterCommon struct {
	master, ca, cert, key, serverName string
	allowPlaintext                    bool
	timeout                           time.Duration
}

func (cf *clusterCommon) register(fs *flag.FlagSet, c *common) {
	fs.StringVar(&cf.master, "master", os.Getenv("UMBP_MASTER_ADDRESS"), "the master's host:port, or its replicas' separated by commas (default $UMBP_MASTER_ADDRESS)")
	fs.DurationVar(&cf.timeout, "timeout", 5*time.Second, "how long to wait for the master at start, and for each call")
	fs.BoolVar(&cf.allowPlaintext, "allow-plaintext", false, "allow plaintext to a master that is not on loopback (anyone on the path can read and forge)")
	fs.StringVar(&cf.ca, "tls-ca", "", "PEM file of the CA that signed the master's certificate: use TLS")
	fs.StringVar(&cf.cert, "tls-cert", "", "PEM client certificate, for mutual TLS (with -tls-key)")
	fs.StringVar(&cf.key, "tls-key", "", "PEM client key, for mutual TLS")
	fs.StringVar(&cf.serverName, "tls-server-name", "", "the name the master's certificate must hold (default: the host of -master)")
	fs.BoolVar(&c.verbose, "v", false, "show the client library's log on stderr, debug messages included (without -v it shows none)")
}

// masters are the addresses -master names.
func (cf *clusterCommon) masters() []string { return strings.Split(cf.master, ",") }

// check refuses, as a usage error, a master address or TLS flags that
// cannot work, naming the flag that fixes each.
func (cf *clusterCommon) check() error {
	if cf.master == "" {
		return fmt.Errorf("%w: -master (or $UMBP_MASTER_ADDRESS) is required: the master's host:port", errUsage)
	}
	if cf.timeout <= 0 {
		return fmt.Errorf("%w: -timeout must be positive", errUsage)
	}
	for _, m := range cf.masters() {
		if err := cf.checkAddress(m); err != nil {
			return err
		}
	}
	return nil
}

// checkAddress checks one of -master's addresses, and the TLS flags for it.
func (cf *clusterCommon) checkAddress(m string) error {
	if strings.Contains(m, "://") || strings.HasPrefix(m, "/") {
		return fmt.Errorf("%w: -master %s is not host:port: MORI's master listens on TCP; a unix socket is a node's server, which 'umbp lookup -endpoint %s' asks", errUsage, m, m)
	}
	if cf.ca == "" && (cf.cert != "" || cf.key != "") {
		return fmt.Errorf("%w: -tls-cert and -tls-key need -tls-ca", errUsage)
	}
	if (cf.cert == "") != (cf.key == "") {
		return fmt.Errorf("%w: -tls-cert and -tls-key go together", errUsage)
	}
	err := masterconn.CheckAddress(m, cf.ca == "", cf.allowPlaintext)
	switch {
	case errors.Is(err, masterconn.ErrPlaintext):
		return fmt.Errorf("%w: -master %s is not on loopback, and MORI's master speaks plaintext TCP without authentication (anyone on the path can read the prompts' keys and forge the answers): give -tls-ca for TLS, or pass -allow-plaintext", errUsage, m)
	case err != nil:
		return fmt.Errorf("%w: -master %s: %w", errUsage, m, err)
	}
	return nil
}

func (cf *clusterCommon) creds() (credentials.TransportCredentials, error) {
	if cf.ca == "" {
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

// reachable returns at once, as an error in words, what keeps every
// master replica from answering now: no process listening at its address
// (refused), or an address that cannot be reached. The library would wait
// up to -timeout; the tool asks about the masters that run. It connects
// and closes at once, sending nothing.
func (cf *clusterCommon) reachable(ctx context.Context) error {
	var errs []error
	for _, m := range cf.masters() {
		err := cf.reach(ctx, m)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// reach is reachable for one address.
func (cf *clusterCommon) reach(ctx context.Context, master string) error {
	d := net.Dialer{Timeout: cf.timeout}
	conn, err := d.DialContext(ctx, "tcp", master)
	var dnsErr *net.DNSError
	switch {
	case err == nil:
		_ = conn.Close()
		return nil
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("no master listens on %s (connection refused): start it, or name it with -master (or $UMBP_MASTER_ADDRESS)", master)
	case errors.As(err, &dnsErr):
		return fmt.Errorf("cannot resolve the master's host in -master %s: %v", master, dnsErr)
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the master at %s did not accept a connection within %v (-timeout): a wrong address, or a network that drops the packets?", master, cf.timeout)
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	return fmt.Errorf("cannot reach the master at %s: %w", master, err)
}

// handle checks that the master can be reached and attaches a scheduler
// handle to it.
func (cf *clusterCommon) handle(ctx context.Context, c *common) (*umbp.SchedulerHandle, error) {
	creds, err := cf.creds()
	if err != nil {
		return nil, err
	}
	if err := cf.reachable(ctx); err != nil {
		return nil, err
	}
	rt, err := umbp.NewClusterRuntime(umbp.ClusterConfig{
		Masters: cf.masters(), TransportCredentials: creds, AllowPlaintext: cf.allowPlaintext,
		LookupTimeout: cf.timeout, Timeout: cf.timeout, StartupTimeout: cf.timeout,
		LoadFailureQuarantine: -1, Logger: c.log,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	h, err := rt.NewSchedulerHandle(ctx)
	switch {
	case err == nil:
		return h, nil
	case errors.Is(err, rpc.ErrUnimplemented):
		return nil, notAMaster(err)
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return nil, cf.silent(ctx)
	}
	return nil, err
}

// notAMaster says that what answered at an address does not speak the
// master's protocol (an HTTP server's 404, another gRPC service), in words
// and with its answer's first line, rather than as gRPC's error.
func notAMaster(err error) error {
	addr := "-master"
	var oe *umbp.OpError
	if errors.As(err, &oe) && oe.Addr != "" {
		addr = oe.Addr
	}
	said := "that it does not know the method"
	var se interface{ GRPCStatus() *status.Status } // gRPC's own error, deepest in the chain
	if errors.As(err, &se) && se.GRPCStatus().Message() != "" {
		said, _, _ = strings.Cut(se.GRPCStatus().Message(), ";") // gRPC's words on the transport follow
		said = strconv.Quote(said)
	}
	return fmt.Errorf("%s is not a UMBP master: asked for the master's BatchLookup, it answered %s; is -master the address of MORI's umbp_master?", addr, said)
}

// silent says, for each master, why none answered within -timeout: it
// accepts connections but is silent (a stopped process, or not a UMBP
// master), or what reach finds.
func (cf *clusterCommon) silent(ctx context.Context) error {
	masters := cf.masters()
	if len(masters) == 1 {
		return fmt.Errorf("the master at %s accepts connections but did not answer within %v (-timeout): a stopped process, or not a UMBP master?", cf.master, cf.timeout)
	}
	says := make([]string, len(masters))
	for i, m := range masters {
		if err := cf.reach(ctx, m); err != nil {
			says[i] = err.Error()
		} else {
			says[i] = m + " accepts connections but did not answer (a stopped process, or not a UMBP master?)"
		}
	}
	return fmt.Errorf("no master answered within %v (-timeout): %s", cf.timeout, strings.Join(says, "; "))
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

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

const devUsage = `usage: umbp dev master [-nodes N] [-replicas R] [-addr HOST:PORT] [-tokens T] [-ns NS] [-seed S]
`

const devAbout = `dev master runs a test double of MORI's UMBP master (the one umbptest
gives tests) as a process, with nodes that hold a prompt's blocks, so that
every 'umbp cluster' command can be tried without MORI. It prints the
master's address, what each node holds and commands to try, and runs until
interrupted (Ctrl-C or SIGTERM).

The prompt is the tokens 1 to -tokens, keyed as vLLM's connector keys them
with -ns and -seed (one rank, blocks of 16 tokens, sha256): node i of N
holds the first (N-i)/N of its blocks, node 0 on DRAM, node 1 on HBM, the
others on SSD, both as pool keys (cluster lookup) and as external KV blocks
(cluster match and score). With -replicas above 1 the master is that many
replicas over one shared store, each node registered with one of them.
`

func devHelp(fs *flag.FlagSet) string {
	return devUsage + "\n" + devAbout + "\nflags:\n" + flagHelp(fs, nil)
}

func devFlags(fs *flag.FlagSet, _ *common) func(context.Context, env, []string) error {
	nodes := fs.Int("nodes", 3, "the nodes that hold the prompt's blocks (1 to 64)")
	replicas := fs.Int("replicas", 1, "the master's replicas over one store (1 to 8); 1 is a lone master")
	addr := fs.String("addr", "127.0.0.1:0", "the address to listen on (port 0: any free one; with -replicas above 1, each replica listens on a port of its own on this host)")
	tokens := fs.Int("tokens", 256, "the prompt's length: the tokens 1 to this (16 to 65536)")
	ns := fs.String("ns", "demo", "the key namespace of the prompt's blocks")
	seed := fs.String("seed", "0", "the PYTHONHASHSEED the prompt's blocks are keyed with")
	return func(ctx context.Context, e env, args []string) error {
		if len(args) == 0 || args[0] != "master" {
			return fmt.Errorf("%w: name what to run: master", errUsage)
		}
		if err := parseFlags(fs, args[1:]); errors.Is(err, flag.ErrHelp) {
			return &helpText{text: devHelp(fs)}
		} else if err != nil {
			return err
		}
		switch {
		case len(fs.Args()) != 0:
			return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
		case *nodes < 1 || *nodes > 64:
			return fmt.Errorf("%w: -nodes %d: want 1 to 64", errUsage, *nodes)
		case *replicas < 1 || *replicas > 8:
			return fmt.Errorf("%w: -replicas %d: want 1 to 8", errUsage, *replicas)
		case *tokens < 16 || *tokens > 65536:
			return fmt.Errorf("%w: -tokens %d: want 16 to 65536 (a block is 16 tokens)", errUsage, *tokens)
		}
		host, port, err := net.SplitHostPort(*addr)
		if err != nil {
			return fmt.Errorf("%w: -addr %q: want host:port", errUsage, *addr)
		}
		if *replicas > 1 && port != "0" {
			return fmt.Errorf("%w: -addr %q: with -replicas, give port 0 (each replica listens on a port of its own)", errUsage, *addr)
		}
		keys, err := devPrompt(*ns, *seed, *tokens)
		if err != nil {
			return err
		}
		return devMaster(ctx, e, devSetup{host: host, addr: *addr, nodes: *nodes, replicas: *replicas, tokens: *tokens, ns: *ns, seed: *seed, keys: keys})
	}
}

// devPrompt is the keys of the tokens 1 to n, as the cluster commands'
// -tokens key them with -ns ns -seed seed -topo tp=1 (the same keyer).
func devPrompt(ns, seed string, n int) ([]string, error) {
	kf := keyerFlags{namespace: ns, seed: seed, algo: "sha256"}
	if err := kf.topo.Set("tp=1"); err != nil {
		return nil, err
	}
	keyer, err := kf.keyer("dev master")
	if err != nil {
		return nil, err
	}
	tokens := make([]int32, n)
	for i := range tokens {
		tokens[i] = int32(i + 1)
	}
	k, err := keyer.Keys(tokens, kf.extra())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return k.Keys, nil
}

type devSetup struct {
	host, addr      string
	nodes, replicas int
	tokens          int
	ns, seed        string
	keys            []string
}

// devMaster runs the master and its nodes until ctx ends.
func devMaster(ctx context.Context, e env, s devSetup) (err error) {
	var addrs []string
	var closeMaster func() error
	if s.replicas == 1 {
		m, err := umbptest.StartMaster(umbptest.MasterOptions{Addr: s.addr})
		if err != nil {
			return fmt.Errorf("start the master: %w", err)
		}
		addrs, closeMaster = []string{m.Addr()}, m.Close
	} else {
		r, err := umbptest.StartReplicatedMaster(s.replicas, umbptest.MasterOptions{Addr: s.addr})
		if err != nil {
			return fmt.Errorf("start the master's replicas: %w", err)
		}
		addrs, closeMaster = r.Addrs(), r.Close
	}
	var started []*umbptest.Node
	defer func() {
		for _, n := range slices.Backward(started) {
			err = errors.Join(err, n.Close())
		}
		err = errors.Join(err, closeMaster())
	}()
	master := strings.Join(addrs, ",")
	what := "a test double of MORI's UMBP master"
	if s.replicas > 1 {
		what = fmt.Sprintf("%d replicas of a test double of MORI's UMBP master over one store", s.replicas)
	}
	fmt.Fprintf(e.stdout, "%-10s %s (%s)\n", "master", master, what)
	tiers := []umbptest.Tier{umbptest.TierDRAM, umbptest.TierHBM}
	var ids []string
	for i := range s.nodes {
		id := fmt.Sprintf("node-%d", i)
		held := s.keys[:len(s.keys)*(s.nodes-i)/s.nodes]
		tier := umbptest.TierSSD
		if i < len(tiers) {
			tier = tiers[i]
		}
		n, err := umbptest.StartNode(ctx, addrs[i%len(addrs)], umbptest.NodeOptions{
			ID:          id,
			PeerAddress: fmt.Sprintf("%s:%d", s.host, 20000+i),
			Keys:        map[umbptest.Tier][]string{tier: held},
			External:    map[umbptest.Tier][]string{tier: held},
		})
		if err != nil {
			return fmt.Errorf("start %s: %w", id, err)
		}
		started = append(started, n)
		ids = append(ids, id)
		if len(held) == 0 {
			fmt.Fprintf(e.stdout, "%-10s holds none of the prompt's %d blocks\n", id, len(s.keys))
		} else {
			fmt.Fprintf(e.stdout, "%-10s holds blocks 0-%d of the prompt's %d on %v\n", id, len(held)-1, len(s.keys), tier)
		}
	}
	tok := fmt.Sprintf("-tokens -ns %s -seed %s -topo tp=1", s.ns, s.seed)
	fmt.Fprintf(e.stdout, "try, in another shell:\n")
	fmt.Fprintf(e.stdout, "  export UMBP_MASTER_ADDRESS=%s\n", master)
	fmt.Fprintf(e.stdout, "  seq 1 %d | umbp cluster lookup %s\n", s.tokens, tok)
	fmt.Fprintf(e.stdout, "  seq 1 %d | umbp cluster match %s\n", s.tokens, tok)
	fmt.Fprintf(e.stdout, "  seq 1 %d | umbp cluster score -nodes %s %s\n", s.tokens, strings.Join(ids, ","), tok)
	fmt.Fprintf(e.stdout, "  umbp cluster lookup %s\n", s.keys[0])
	fmt.Fprintf(e.stdout, "running until interrupted (Ctrl-C)\n")
	<-ctx.Done()
	return nil
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/umbp-go/umbp-go/umbp"
)

// The flags lookup takes for keys, and with -tokens; any other is refused.
var (
	lookupKeyFlags   = []string{"endpoint", "timeout", "trust-uid", "v", "json", "q", "raw"}
	lookupTokenFlags = append([]string{"endpoint", "timeout", "trust-uid", "v", "json", "tokens"}, tokenFlags...)
)

func lookupFlags(fs *flag.FlagSet, c *common) func(context.Context, env, []string) error {
	c.register(fs, 5*time.Second, "how long to wait for the server to answer at start, and for each lookup")
	var kf keyerFlags
	kf.register(fs)
	tokens := fs.Bool("tokens", false, "the arguments (or standard input) are a prompt's token IDs: show how much of it the pool holds, keyed as -ns, -seed, -algo, -topo and -groups say")
	quiet := fs.Bool("q", false, "keys: print only the summary, not a line per key")
	raw := fs.Bool("raw", false, "keys: look the keys up as they are, whatever their form (keys other clients store, such as bench -suite's); without -raw each must be a key as 'umbp key make' writes it")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	return func(ctx context.Context, e env, args []string) error {
		a := asker{cmd: "lookup", what: "the server", timeout: c.timeout, open: func(ctx context.Context) (*umbp.SchedulerHandle, error) {
			rt, err := c.runtime()
			if err != nil {
				return nil, err
			}
			return scheduler(ctx, rt)
		}}
		// The input is checked before the server is asked.
		if *tokens {
			if err := onlyFlags(fs, lookupTokenFlags, "with -tokens"); err != nil {
				return err
			}
			keyer, err := kf.keyer("lookup -tokens")
			if err != nil {
				return err
			}
			toks, err := readTokens(e.stdin, args)
			if err != nil {
				return err
			}
			return lookupTokens(ctx, e, c, a, keyer, toks, kf, *asJSON)
		}
		if err := onlyFlags(fs, lookupKeyFlags, "to keys (they key tokens: pass -tokens)"); err != nil {
			return err
		}
		keys, err := words(e.stdin, args)
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			return fmt.Errorf("%w: name the keys to look up", errUsage)
		}
		if err := checkKeys(keys, *raw); err != nil {
			return err
		}
		return lookupKeys(ctx, e, c, a, keys, *quiet, *asJSON)
	}
}

// asker is what a lookup asks: a node's server (lookup) or MORI's master
// (cluster lookup), through a scheduler handle either way.
type asker struct {
	cmd     string        // the command, for the line Close may print
	what    string        // "the server" or "the master"
	timeout time.Duration // each call's bound
	// open checks what it can at once and attaches a scheduler handle.
	open func(ctx context.Context) (*umbp.SchedulerHandle, error)
}

// checkKeys returns a usage error for the keys that are not keys: without
// raw, each must parse as a key of umbp.KeyCodec's form; with raw, each
// must be one the server can be asked about (valid UTF-8: the library
// answers the others as misses without asking).
func checkKeys(keys []string, raw bool) error {
	var errs []error
	for _, k := range keys {
		switch {
		case raw && !utf8.ValidString(k):
			errs = append(errs, fmt.Errorf("key %q is not valid UTF-8: no server can hold it", k))
		case !raw:
			if _, err := umbp.ParseKey(k); err != nil {
				errs = append(errs, err)
			}
		}
	}
	switch {
	case len(errs) == 0:
		return nil
	case raw:
		return fmt.Errorf("%w: %w", errUsage, errors.Join(errs...))
	}
	return fmt.Errorf("%w: %w\n(pass -raw to look up keys of another form)", errUsage, errors.Join(errs...))
}

// scheduler attaches a scheduler handle, as an engine's scheduler would.
func scheduler(ctx context.Context, rt *umbp.StandaloneRuntime) (*umbp.SchedulerHandle, error) {
	return rt.NewSchedulerHandle(ctx)
}

// closeScheduler closes h; a handle left open (a lookup the server never
// answered) is worth a line, not a failure.
func closeScheduler(e env, cmd string, h *umbp.SchedulerHandle) {
	if rs := h.Stats().Replicas; len(rs) > 1 {
		// Each of the master's replicas, as this call saw it: where the
		// answer came from, and what was set aside.
		for _, r := range rs {
			state := r.State.String()
			if r.SetAside {
				state = "set aside"
			}
			fmt.Fprintf(e.stderr, "replica %s: %s, %d calls (%d hedged), %d answers, set aside %d times, %v a call\n",
				r.Addr, state, r.Calls, r.Hedges, r.Answers, r.SetAsides, r.Latency.Round(time.Microsecond))
		}
	}
	if err := h.Close(); err != nil {
		fmt.Fprintf(e.stderr, "umbp %s: %s\n", cmd, said(err.Error()))
	}
}

// answered reports whether the handle's lookups since before got answers:
// a lookup that failed or timed out answers every key as a miss, which is
// not the pool's answer. The library tells why a lookup failed only in its
// log: the error quotes its last warning.
func answered(ctx context.Context, c *common, h *umbp.SchedulerHandle, before umbp.Stats) error {
	return answeredWithin(ctx, c, h, before, "the server", c.timeout)
}

// answeredWithin is answered for a call to what bounded by timeout.
func answeredWithin(ctx context.Context, c *common, h *umbp.SchedulerHandle, before umbp.Stats, what string, timeout time.Duration) error {
	after := h.Stats()
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("lookup interrupted: %w", ctx.Err())
	case after.Lookups.Timeouts > before.Lookups.Timeouts:
		return fmt.Errorf("%s did not answer within %v (-timeout): its answers are not the pool's", what, timeout)
	case after.Lookups.Failures > before.Lookups.Failures:
		why := "the library logged no reason"
		if w := c.lib.lastWarning(); w != "" {
			why = w
		}
		return fmt.Errorf("the lookup failed (%s): its answers are not the pool's", why)
	}
	return nil
}

// keysAnswer is lookup's answer for keys as -json prints it.
type keysAnswer struct {
	Keys    []keyAnswer `json:"keys"`
	Held    int         `json:"held"`
	Leading int         `json:"leading"`
	Seconds float64     `json:"seconds"`
}

type keyAnswer struct {
	Key  string `json:"key"`
	Held bool   `json:"held"`
}

// tokensAnswer is lookup -tokens' answer as -json prints it.
type tokensAnswer struct {
	Tokens         int  `json:"tokens"`
	Keys           int  `json:"keys"`
	HeldKeys       int  `json:"held_keys"`
	HeldTokens     int  `json:"held_tokens"`
	LoadableTokens *int `json:"loadable_tokens,omitempty"`
}

func printJSON(e env, v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func lookupKeys(ctx context.Context, e env, c *common, a asker, keys []string, quiet, asJSON bool) error {
	h, err := a.open(ctx)
	if err != nil {
		return err
	}
	defer closeScheduler(e, a.cmd, h)
	before := h.Stats()
	start := time.Now()
	hits := h.Lookup(ctx, keys)
	took := time.Since(start)
	if err := answeredWithin(ctx, c, h, before, a.what, a.timeout); err != nil {
		return err
	}
	ans := keysAnswer{Keys: make([]keyAnswer, len(keys)), Seconds: took.Seconds()}
	for i, k := range keys {
		ans.Keys[i] = keyAnswer{k, hits[i]}
		if hits[i] {
			ans.Held++
		}
	}
	for ans.Leading < len(hits) && hits[ans.Leading] {
		ans.Leading++
	}
	if asJSON {
		return printJSON(e, ans)
	}
	if !quiet {
		for _, a := range ans.Keys {
			state := "miss"
			if a.Held {
				state = "hit"
			}
			fmt.Fprintf(e.stdout, "%-4s %s\n", state, a.Key)
		}
	}
	fmt.Fprintf(e.stdout, "%d of %d keys held, the leading %d (answered in %v)\n", ans.Held, len(keys), ans.Leading, took.Round(time.Microsecond))
	return nil
}

func lookupTokens(ctx context.Context, e env, c *common, a asker, keyer *umbp.TokenKeyer, tokens []int32, kf keyerFlags, asJSON bool) error {
	keys, err := keyer.Keys(tokens, kf.extra())
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	// The connector decides on the first n-1 tokens: the engine computes
	// at least the last one. Their keys are a prefix of all the keys.
	var load *umbp.TokenKeys
	if len(tokens) > 0 {
		if load, err = keyer.Keys(tokens[:len(tokens)-1], kf.extra()); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	h, err := a.open(ctx)
	if err != nil {
		return err
	}
	defer closeScheduler(e, a.cmd, h)
	before := h.Stats()
	n := h.LookupPrefix(ctx, keys.Keys)
	if err := answeredWithin(ctx, c, h, before, a.what, a.timeout); err != nil {
		return err
	}
	ans := tokensAnswer{Tokens: len(tokens), Keys: len(keys.Keys), HeldKeys: n, HeldTokens: keys.Tokens(n)}
	if load != nil {
		l := load.Tokens(min(n, len(load.Keys)))
		ans.LoadableTokens = &l
	}
	if asJSON {
		return printJSON(e, ans)
	}
	fmt.Fprintf(e.stdout, "prompt    %d tokens, %d keys (every rank of every group's full blocks)\n", ans.Tokens, ans.Keys)
	fmt.Fprintf(e.stdout, "held      %d tokens (the leading %d keys)\n", ans.HeldTokens, n)
	if ans.LoadableTokens != nil {
		fmt.Fprintf(e.stdout, "loadable  %d tokens (the connector loads from the first %d tokens only)\n", *ans.LoadableTokens, len(tokens)-1)
	}
	return nil
}

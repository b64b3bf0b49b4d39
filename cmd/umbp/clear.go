package main

import (
	"context"
	"flag"
	"fmt"
	"time"
)

func clearFlags(fs *flag.FlagSet, c *common) func(context.Context, env, []string) error {
	c.register(fs, 10*time.Second, "how long to wait for the server to answer, and for the clear")
	yes := fs.Bool("yes", false, "really clear: every engine attached to the server loses its stored KV")
	return func(ctx context.Context, e env, args []string) error {
		if len(args) != 0 {
			return fmt.Errorf("%w: unexpected arguments %q", errUsage, args)
		}
		if !*yes {
			return fmt.Errorf("%w: clear drops the KV of every engine on the server; pass -yes to do it", errUsage)
		}
		rt, err := c.runtime()
		if err != nil {
			return err
		}
		h, err := rt.NewSchedulerHandle(ctx)
		if err != nil {
			return err
		}
		defer h.Close()
		if err := h.Clear(ctx); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "cleared the pool at %s\n", rt.Endpoint())
		return nil
	}
}

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
)

// umbp dev master runs the master test double with nodes until
// interrupted, and every cluster command can be tried on it as it says.
func TestDevMaster(t *testing.T) {
	for _, replicas := range []string{"1", "3"} {
		t.Run("replicas "+replicas, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, w := io.Pipe()
			code := make(chan int, 1)
			var stderr strings.Builder
			go func() {
				code <- run(ctx, []string{"dev", "master", "-nodes", "3", "-replicas", replicas}, strings.NewReader(""), w, &stderr)
				w.Close()
			}()
			var out strings.Builder
			var master string
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				line := sc.Text()
				out.WriteString(line + "\n")
				if f := strings.Fields(line); len(f) > 1 && f[0] == "master" {
					master = f[1]
				}
				if line == "running until interrupted (Ctrl-C)" {
					break
				}
			}
			mustContain(t, "dev master", out.String(),
				"node-0     holds blocks 0-15 of the prompt's 16 on DRAM",
				"node-1     holds blocks 0-9 of the prompt's 16 on HBM",
				"node-2     holds blocks 0-4 of the prompt's 16 on SSD",
				"  seq 1 256 | umbp cluster score -nodes node-0,node-1,node-2 -tokens -ns demo -seed 0 -topo tp=1")
			if n, _ := strconv.Atoi(replicas); strings.Count(master, ",") != n-1 {
				t.Fatalf("master address %q for %s replicas", master, replicas)
			}
			var prompt strings.Builder // seq 1 256
			for i := 1; i <= 256; i++ {
				fmt.Fprintln(&prompt, i)
			}
			stdout, _ := mustRun(t, exitOK, prompt.String(), "cluster", "lookup", "-master", master, "-tokens", "-ns", "demo", "-seed", "0", "-topo", "tp=1")
			mustContain(t, "cluster lookup -tokens", stdout, "held      256 tokens (the leading 16 keys)")
			stdout, _ = mustRun(t, exitOK, prompt.String(), "cluster", "score", "-master", master, "-nodes", "node-0,node-1,node-2", "-tokens", "-ns", "demo", "-seed", "0", "-topo", "tp=1")
			mustContain(t, "cluster score -tokens", stdout, "best node-0")
			stdout, _ = mustRun(t, exitOK, prompt.String(), "cluster", "match", "-master", master, "-tokens", "-ns", "demo", "-seed", "0", "-topo", "tp=1")
			mustContain(t, "cluster match -tokens", stdout, "node-2 ")
			cancel()
			go func() { _, _ = io.Copy(io.Discard, r) }()
			if c := <-code; c != exitOK {
				t.Errorf("dev master exited %d: %s", c, stderr.String())
			}
		})
	}
	_, stderr := mustRun(t, exitUsage, "", "dev", "master", "-nodes", "0")
	mustContain(t, "dev master -nodes 0", stderr, "umbp dev: -nodes 0: want 1 to 64")
	_, stderr = mustRun(t, exitUsage, "", "dev", "master", "-replicas", "2", "-addr", "127.0.0.1:15558")
	mustContain(t, "dev master -replicas 2 -addr", stderr, "with -replicas, give port 0")
}

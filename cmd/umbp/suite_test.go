package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// The suite prints umbp_bench's figures, in its order, each lookup figure
// followed by its grpc-go twin, on servers with and without ranged I/O
// (scaled down: the standard one moves 512 MiB).
func TestSuite(t *testing.T) {
	want := []string{
		"exists_1_us", "exists_1_grpc_us", "exists_64_us", "exists_64_grpc_us",
		"exists_1024_us", "exists_1024_grpc_us",
		"put_64KiBx256_GBps", "get_64KiBx256_GBps",
		"put_4MiBx64_GBps", "get_4MiBx64_GBps",
		"put_ranges_256x32x2KiB_GBps", "get_ranges_256x32x2KiB_GBps",
		"verify ok",
	}
	for _, opts := range []umbptest.Options{{}, {Version: 1}} {
		srv := umbptest.NewServer(t, opts)
		rt, grpcRT := suiteRuntimes(t, srv)
		var out bytes.Buffer
		var got []string
		err := suite(t.Context(), rt, grpcRT, suiteConfig{existsReps: 2, bwReps: 2, scale: 64}, func(l suiteLine) {
			got = append(got, l.Name)
			if l.Name != "verify ok" && l.Value <= 0 {
				t.Errorf("version %d: %s = %v", opts.Version, l.Name, l.Value)
			}
			printSuiteLine(&out, l)
		})
		if err != nil {
			t.Fatalf("version %d: %v", opts.Version, err)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("version %d: figures %q, want %q", opts.Version, got, want)
		}
		if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != len(want) || !strings.HasPrefix(lines[0], "exists_1_us ") {
			t.Fatalf("version %d: output\n%s", opts.Version, out.String())
		}
		if s := srv.Stats(); s.Objects != 0 || s.Regions != 0 {
			t.Errorf("version %d: the suite left %d objects and %d regions", opts.Version, s.Objects, s.Regions)
		}
	}
}

// With jobs, each bandwidth row's median is followed by its jobs' own
// figures, in the order they ran, and the median is theirs.
func TestSuiteJobs(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{})
	rt, grpcRT := suiteRuntimes(t, srv)
	const reps = 3
	var got []suiteLine
	if err := suite(t.Context(), rt, grpcRT, suiteConfig{existsReps: 1, bwReps: reps, jobs: true, scale: 64}, func(l suiteLine) {
		got = append(got, l)
	}); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for i, l := range got {
		row, ok := strings.CutSuffix(l.Name, "_GBps")
		if !ok || strings.Contains(row, "_job") {
			continue
		}
		rows++
		if i+reps >= len(got) {
			t.Fatalf("%s: no room for its %d jobs in %v", l.Name, reps, got)
		}
		var v []float64
		for j := 1; j <= reps; j++ {
			job := got[i+j]
			if want := fmt.Sprintf("%s_job%d_GBps", row, j); job.Name != want || job.Value <= 0 {
				t.Fatalf("line %d after %s: %s = %v, want %s > 0", j, l.Name, job.Name, job.Value, want)
			}
			v = append(v, job.Value)
		}
		if m := median(v); m != l.Value {
			t.Errorf("%s = %v, the median of its jobs %v is %v", l.Name, l.Value, v, m)
		}
	}
	if rows != 6 {
		t.Errorf("%d bandwidth rows with jobs, want 6: %v", rows, got)
	}
	// Without -suite the flag is refused, as the suite's others are.
	_, stderr := mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-jobs")
	mustContain(t, "bench -jobs", stderr, "-jobs has no effect without -suite")
}

// suiteRuntimes are the suite's two runtimes on srv: lock-step lookups,
// and lookups through grpc-go.
func suiteRuntimes(t *testing.T, srv *umbptest.Server) (rt, grpcRT *umbp.StandaloneRuntime) {
	t.Helper()
	cfg := umbp.Config{Endpoint: srv.Endpoint(), Logger: slog.New(slog.DiscardHandler)}
	rt, err := umbp.NewStandaloneRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.GRPCLookups = true
	if grpcRT, err = umbp.NewStandaloneRuntime(cfg); err != nil {
		t.Fatal(err)
	}
	return rt, grpcRT
}

func TestSuiteFlags(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{})
	_, stderr := mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-suite", "-yes", "-bw-reps", "0")
	mustContain(t, "bench -suite", stderr, "-bw-reps")
	// It clears the pool: only with -yes.
	_, stderr = mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-suite")
	mustContain(t, "bench -suite without -yes", stderr, "-yes")
	// Flags of the other mode are refused, not ignored.
	_, stderr = mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-suite", "-yes", "-objects", "3")
	mustContain(t, "bench -suite -objects", stderr, "-objects has no effect with -suite")
	_, stderr = mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-bw-reps", "3")
	mustContain(t, "bench -bw-reps", stderr, "-bw-reps has no effect without -suite")
	// -timeout is checked as for every command.
	_, stderr = mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-suite", "-yes", "-timeout", "0")
	mustContain(t, "bench -suite -timeout 0", stderr, "-timeout must be positive")
}

// A bench whose first round stored at under half the later rounds' rate
// says that round paid for the pool's first touch; a steady one says
// nothing of it.
func TestBenchSaysFirstTouch(t *testing.T) {
	for _, c := range []struct {
		gbps []float64
		says bool
	}{
		{[]float64{0.74, 12.15, 11.9, 12.3}, true},
		{[]float64{10.1, 12.15, 11.9}, false},
		{[]float64{0.74}, false},
	} {
		var out strings.Builder
		printBench(&out, &benchResult{Rounds: len(c.gbps), StoreGBps: c.gbps})
		if got := strings.Contains(out.String(), "round 1 paid for the server's first touch of its pool's pages"); got != c.says {
			t.Errorf("store rounds %v: said first touch %v, want %v:\n%s", c.gbps, got, c.says, out.String())
		}
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// umbpRun runs the command line args with stdin and returns its exit status
// and output.
func umbpRun(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// mustRun runs args and fails the test unless the exit status is want.
func mustRun(t *testing.T, want int, stdin string, args ...string) (stdout, stderr string) {
	t.Helper()
	code, stdout, stderr := umbpRun(t, stdin, args...)
	if code != want {
		t.Fatalf("umbp %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, stdout, stderr)
	}
	return stdout, stderr
}

func mustContain(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s does not contain %q:\n%s", what, sub, s)
		}
	}
}

// store stores a 4 KiB object under each key through a worker handle.
func store(t *testing.T, endpoint string, keys ...string) {
	t.Helper()
	ctx := t.Context()
	rt, err := umbp.NewStandaloneRuntime(umbp.Config{Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := umbp.NewHostBuffer(4096 * len(keys))
	if err != nil {
		t.Fatal(err)
	}
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := buf.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": buf.Buffer()}); err != nil {
		t.Fatal(err)
	}
	plans := make([]umbp.BlockTransferPlan, len(keys))
	for i, k := range keys {
		plans[i] = umbp.BlockTransferPlan{Key: k, BlockID: i, Ranges: []umbp.KVRange{{BaseAddress: buf.Buffer().Ptr + uintptr(4096*i), Length: 4096}}}
	}
	if err := w.Wait(ctx, w.Store(plans)); err != nil {
		t.Fatal(err)
	}
}

func TestUsage(t *testing.T) {
	_, stderr := mustRun(t, exitUsage, "")
	mustContain(t, "usage", stderr, "commands:", "ping", "lookup", "key", "clear", "bench")
	stdout, _ := mustRun(t, exitOK, "", "help")
	mustContain(t, "help", stdout, "commands:")
	stdout, _ = mustRun(t, exitOK, "", "help", "ping")
	mustContain(t, "help ping", stdout, "usage: umbp ping", "-count", "-endpoint", "-timeout")
	stdout, _ = mustRun(t, exitOK, "", "help", "key")
	mustContain(t, "help key", stdout, "umbp key tokens", "-seed")
	_, stderr = mustRun(t, exitUsage, "", "frob")
	mustContain(t, "unknown command", stderr, `unknown command "frob"`)
	mustRun(t, exitUsage, "", "ping", "-nosuchflag")
	mustRun(t, exitUsage, "", "ping", "extra")
	mustRun(t, exitUsage, "", "ping", "-endpoint", "relative.sock")
	mustRun(t, exitUsage, "", "ping", "-timeout", "0s", "-endpoint", "/tmp/x.sock")
	mustRun(t, exitUsage, "", "ping", "-trust-uid", "root", "-endpoint", "/tmp/x.sock")
}

func TestPing(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	stdout, _ := mustRun(t, exitOK, "", "ping", "-endpoint", srv.Endpoint(), "-count", "2", "-fd")
	mustContain(t, "ping", stdout, srv.Endpoint(), srv.FDSocketPath(), "ready      true",
		"STANDALONE_BACKEND_LOCAL", "ranged I/O yes", "GPU memory not said: Ping does not tell whether the server opens GPU IPC handles: one without a usable GPU, or the Go server with -gpu off, answers the same", "over 2 pings\n", "fd handoff ok")
	if strings.Contains(stdout, "GPU memory by IPC") {
		t.Errorf("ping claims GPU memory on a server that may have no GPU:\n%s", stdout)
	}
	if srv.Calls(umbptest.FDHandoff) != 1 {
		t.Errorf("%d fd handoffs, want 1", srv.Calls(umbptest.FDHandoff))
	}
	if s := srv.Stats(); s.Regions != 0 {
		t.Errorf("%d regions still registered after ping -fd", s.Regions)
	}

	stdout, _ = mustRun(t, exitOK, "", "ping", "-endpoint", srv.Endpoint(), "-count", "1", "-json")
	var res pingResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v:\n%s", err, stdout)
	}
	if !res.Ready || !res.RangedIO || len(res.RTTs) != 1 || res.FDHandoff != nil || res.Endpoint != srv.Endpoint() ||
		res.GPUMemory != nil || res.GPUMemoryNote == "" {
		t.Errorf("ping -json: %+v", res)
	}
	if !strings.Contains(stdout, `"gpu_memory": null`) {
		t.Errorf("ping -json does not say gpu_memory null (cannot tell):\n%s", stdout)
	}

	stdout, _ = mustRun(t, exitOK, "", "ping", "-endpoint", srv.Endpoint(), "-count", "1")
	mustContain(t, "ping -count 1", stdout, "over 1 ping\n")
}

// Servers without ranged I/O take no GPU memory, and ping says so.
func TestPingNoRangedIO(t *testing.T) {
	for _, opts := range []umbptest.Options{{Version: 1}, {DisableRangedIO: true}} {
		opts.Capacity = 16 << 20
		srv := umbptest.NewServer(t, opts)
		stdout, _ := mustRun(t, exitOK, "", "ping", "-endpoint", srv.Endpoint(), "-count", "0")
		mustContain(t, fmt.Sprintf("ping %+v", opts), stdout, "ranged I/O no", "GPU memory no: ")
		if strings.Contains(stdout, "rtt") {
			t.Errorf("ping -count 0 prints round trips:\n%s", stdout)
		}
	}
}

// What ping says of GPU memory for each answer Ping can give.
func TestGPUMemory(t *testing.T) {
	for _, tc := range []struct {
		caps umbp.ServerCapabilities
		want string // "unknown" or "no"
	}{
		{umbp.ServerCapabilities{Ready: true, RangedIO: true, Mode: "STANDALONE_BACKEND_LOCAL"}, "unknown"},
		{umbp.ServerCapabilities{Ready: true, RangedIO: true, Mode: "STANDALONE_BACKEND_DISTRIBUTED"}, "unknown"},
		// A distributed v2 server may lack ranged I/O with its SSD tier off.
		{umbp.ServerCapabilities{Ready: true, Mode: "STANDALONE_BACKEND_DISTRIBUTED"}, "unknown"},
		{umbp.ServerCapabilities{Ready: true, Mode: "STANDALONE_BACKEND_LOCAL"}, "no"},
		{umbp.ServerCapabilities{Ready: true, Mode: "STANDALONE_BACKEND_UNKNOWN"}, "no"},
	} {
		gpu, note := gpuMemory(tc.caps)
		got := "unknown"
		if gpu != nil {
			if *gpu {
				t.Errorf("%+v: GPU memory claimed", tc.caps)
			}
			got = "no"
		}
		if got != tc.want || note == "" {
			t.Errorf("%+v: %s (%q), want %s", tc.caps, got, note, tc.want)
		}
	}
}

func TestPingFDHandoffRefused(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	srv.FailNext(umbptest.FDHandoff, 1)
	stdout, stderr := mustRun(t, exitFail, "", "ping", "-endpoint", srv.Endpoint(), "-fd")
	mustContain(t, "ping", stdout, "fd handoff FAILED")
	mustContain(t, "ping", stderr, "umbp ping: fd handoff:")
}

// No server at the endpoint: every command that asks one says so at once,
// long before its -timeout, and says why.
func TestNoServer(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.grpc.sock")
	file := filepath.Join(dir, "file.grpc.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A socket no process listens on, as a killed server leaves it.
	stale := filepath.Join(dir, "stale.grpc.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ endpoint, want string }{
		{missing, "no server socket at " + missing + ": start the server"},
		{"unix://" + missing, "no server socket at " + missing + ": start the server"},
		{file, file + " is not a socket"},
		{stale, "no server listens on " + stale},
	} {
		for _, cmd := range [][]string{
			{"ping"}, {"ping", "-fd"}, {"lookup", "-raw"}, {"clear", "-yes"}, {"bench", "-objects", "1"}, {"bench", "-suite", "-yes"},
		} {
			args := append(slices.Clone(cmd), "-endpoint", tc.endpoint, "-timeout", "30s")
			if cmd[0] == "lookup" {
				args = append(args, "a")
			}
			start := time.Now()
			_, stderr := mustRun(t, exitFail, "", args...)
			if took := time.Since(start); took > time.Second {
				t.Errorf("umbp %s: answered in %v, want under a second", strings.Join(args, " "), took)
			}
			mustContain(t, strings.Join(args, " "), stderr, "umbp "+cmd[0]+": "+tc.want)
			if strings.Contains(stderr, "level=") {
				t.Errorf("umbp %s: the library's log on stderr:\n%s", strings.Join(args, " "), stderr)
			}
		}
	}
	// A usage error is still a usage error.
	mustRun(t, exitUsage, "", "lookup", "-endpoint", missing, "notakey")
	mustRun(t, exitUsage, "", "ping", "-endpoint", missing, "-count", "-1")
}

func TestPingStalled(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	srv.Stall("Ping")
	_, stderr := mustRun(t, exitFail, "", "ping", "-endpoint", srv.Endpoint(), "-timeout", "200ms")
	mustContain(t, "ping", stderr, "the server was not ready (stalled, or still starting?)", "(the wait's end: -timeout, 200ms")
	if strings.Contains(stderr, "StartupTimeout") {
		t.Errorf("umbp ping names the library's field, not its flag:\n%s", stderr)
	}
}

// testKey is the key umbp key make -ns m writes for hash h.
func testKey(h string) string { return "umbp:vllm:v1:m:tp0:pcp0:dcp0:pp0:g0:" + h }

func TestLookupKeys(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	a, b, c, d := testKey("0a"), testKey("0b"), testKey("0c"), testKey("0d")
	store(t, srv.Endpoint(), a, b, d)
	stdout, _ := mustRun(t, exitOK, "", "lookup", "-endpoint", srv.Endpoint(), a, b, c, d)
	mustContain(t, "lookup", stdout, "hit  "+a+"\n", "hit  "+b+"\n", "miss "+c+"\n", "hit  "+d+"\n", "3 of 4 keys held, the leading 2 ")

	stdout, _ = mustRun(t, exitOK, c+"\n"+d+"\n", "lookup", "-endpoint", srv.Endpoint(), "-q")
	if strings.Contains(stdout, "hit") || !strings.HasPrefix(stdout, "1 of 2 keys held, the leading 0 ") {
		t.Errorf("lookup -q from stdin:\n%s", stdout)
	}
	mustRun(t, exitUsage, "", "lookup", "-endpoint", srv.Endpoint())

	stdout, _ = mustRun(t, exitOK, "", "lookup", "-endpoint", srv.Endpoint(), "-json", a, c)
	var ans keysAnswer
	if err := json.Unmarshal([]byte(stdout), &ans); err != nil {
		t.Fatalf("%v:\n%s", err, stdout)
	}
	if want := []keyAnswer{{a, true}, {c, false}}; !slices.Equal(ans.Keys, want) || ans.Held != 1 || ans.Leading != 1 {
		t.Errorf("lookup -json: %+v", ans)
	}
}

// A string that is not a key is a usage error, from the arguments or from
// standard input, before the server is asked; -raw looks up keys of any
// form.
func TestLookupNotAKey(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	store(t, srv.Endpoint(), "bench-exists-0")
	for _, tc := range []struct {
		stdin string
		args  []string
	}{
		{"", []string{"notakey"}},
		{"", []string{testKey("0a"), "notakey"}},
		{testKey("0a") + "\nnotakey\n", nil},
		{"", []string{testKey("zz")}},
	} {
		args := append([]string{"lookup", "-endpoint", srv.Endpoint()}, tc.args...)
		stdout, stderr := mustRun(t, exitUsage, tc.stdin, args...)
		mustContain(t, "lookup", stderr, "invalid key", "pass -raw", "run 'umbp help lookup'")
		if stdout != "" {
			t.Errorf("umbp %s: wrote\n%s", strings.Join(args, " "), stdout)
		}
	}
	if n := srv.Calls("BatchExists"); n != 0 {
		t.Errorf("%d lookups reached the server, want 0", n)
	}
	stdout, _ := mustRun(t, exitOK, "", "lookup", "-endpoint", srv.Endpoint(), "-raw", "bench-exists-0", "notakey")
	mustContain(t, "lookup -raw", stdout, "hit  bench-exists-0\n", "miss notakey\n", "1 of 2 keys held")
	_, stderr := mustRun(t, exitUsage, "", "lookup", "-endpoint", srv.Endpoint(), "-raw", "a\xffb")
	mustContain(t, "lookup -raw", stderr, "not valid UTF-8")
	_, stderr = mustRun(t, exitUsage, "", "lookup", "-endpoint", srv.Endpoint(), "-raw", "-tokens", "-ns", "m", "-seed", "0", "1")
	mustContain(t, "lookup -raw -tokens", stderr, "-raw does not apply with -tokens")
}

func TestLookupStalled(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	srv.Stall("BatchExists")
	_, stderr := mustRun(t, exitFail, "", "lookup", "-endpoint", srv.Endpoint(), "-timeout", "200ms", testKey("0a"))
	mustContain(t, "lookup", stderr, "did not answer within 200ms")
}

// A failed lookup's reason, which the library only logs, is in the tool's
// one line; the library's log itself is shown only with -v.
func TestLookupFailed(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	srv.FailNext("BatchExists", 1)
	_, stderr := mustRun(t, exitFail, "", "lookup", "-endpoint", srv.Endpoint(), testKey("0a"))
	mustContain(t, "lookup", stderr, "umbp lookup: the lookup failed (UMBP standalone call failed; treating as a miss: ", "its answers are not the pool's")
	if n := strings.Count(stderr, "\n"); n != 1 || strings.Contains(stderr, "level=") {
		t.Errorf("lookup: stderr is not the tool's one line:\n%s", stderr)
	}
	srv.FailNext("BatchExists", 1)
	_, stderr = mustRun(t, exitFail, "", "lookup", "-endpoint", srv.Endpoint(), "-v", testKey("0a"))
	mustContain(t, "lookup -v", stderr, "level=WARN", "level=DEBUG", "umbp lookup: the lookup failed")
}

func TestLookupTokens(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	hasher, err := vllmhash.NewHasher(vllmhash.SHA256, "0")
	if err != nil {
		t.Fatal(err)
	}
	keyer, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "llama", Topology: umbp.RankTopology{TPSize: 2},
		Groups: []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}}, Hasher: hasher,
	})
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int32, 32)
	var words []string
	for i := range prompt {
		prompt[i] = int32(i + 1)
		words = append(words, fmt.Sprint(i+1))
	}
	keys, err := keyer.Keys(prompt, vllmhash.ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys.Keys) != 4 {
		t.Fatalf("%d keys, want 4", len(keys.Keys))
	}
	args := []string{"lookup", "-endpoint", srv.Endpoint(), "-tokens", "-ns", "llama", "-seed", "0", "-topo", "tp=2"}
	stdin := "[" + strings.Join(words, ", ") + "]"

	// Block 1 on one rank only: 16 tokens held.
	store(t, srv.Endpoint(), keys.Keys[:3]...)
	stdout, _ := mustRun(t, exitOK, stdin, args...)
	mustContain(t, "lookup -tokens", stdout, "prompt    32 tokens, 4 keys", "held      16 tokens (the leading 3 keys)", "loadable  16 tokens")

	// Every key: 32 held, but the connector decides on 31 tokens, one block.
	store(t, srv.Endpoint(), keys.Keys[3])
	stdout, _ = mustRun(t, exitOK, "", append(args, words...)...)
	mustContain(t, "lookup -tokens", stdout, "held      32 tokens (the leading 4 keys)", "loadable  16 tokens")

	stdout, _ = mustRun(t, exitOK, stdin, append(args, "-json")...)
	var ans tokensAnswer
	if err := json.Unmarshal([]byte(stdout), &ans); err != nil {
		t.Fatalf("%v:\n%s", err, stdout)
	}
	if ans.Tokens != 32 || ans.Keys != 4 || ans.HeldKeys != 4 || ans.HeldTokens != 32 || ans.LoadableTokens == nil || *ans.LoadableTokens != 16 {
		t.Errorf("lookup -tokens -json: %+v", ans)
	}

	mustRun(t, exitUsage, stdin, "lookup", "-endpoint", srv.Endpoint(), "-tokens", "-ns", "llama")               // no seed
	mustRun(t, exitUsage, "1 x", "lookup", "-endpoint", srv.Endpoint(), "-tokens", "-ns", "llama", "-seed", "0") // bad token
}

func TestClear(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	store(t, srv.Endpoint(), "a", "b")
	_, stderr := mustRun(t, exitUsage, "", "clear", "-endpoint", srv.Endpoint())
	mustContain(t, "clear", stderr, "pass -yes")
	if n := srv.Stats().Objects; n != 2 {
		t.Fatalf("%d objects after a refused clear, want 2", n)
	}
	stdout, stderr := mustRun(t, exitOK, "", "clear", "-endpoint", srv.Endpoint(), "-yes")
	mustContain(t, "clear", stdout, "cleared the pool at "+srv.Endpoint())
	if stderr != "" {
		t.Errorf("clear -yes: stderr is not empty:\n%s", stderr)
	}
	if n := srv.Stats().Objects; n != 0 {
		t.Fatalf("%d objects after clear, want 0", n)
	}
	// -v shows the library's log, its own line about the clear included.
	_, stderr = mustRun(t, exitOK, "", "clear", "-endpoint", srv.Endpoint(), "-yes", "-v")
	mustContain(t, "clear -v", stderr, "cleared the UMBP standalone pool")
}

func TestClearStalled(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	srv.Stall("Clear")
	_, stderr := mustRun(t, exitFail, "", "clear", "-endpoint", srv.Endpoint(), "-yes", "-timeout", "200ms")
	mustContain(t, "clear", stderr, "deadline exceeded")
}

func TestKey(t *testing.T) {
	stdout, _ := mustRun(t, exitOK, "", "key", "make", "-ns", "llama", "-topo", "tp=1/2,pp=1/2", "-group", "3", "ABcd", "00")
	if want := "umbp:vllm:v1:llama:tp1:pcp0:dcp0:pp1:g3:abcd\numbp:vllm:v1:llama:tp1:pcp0:dcp0:pp1:g3:00\n"; stdout != want {
		t.Errorf("key make:\n%s\nwant\n%s", stdout, want)
	}
	// Flags before the subcommand, hashes from stdin.
	stdout, _ = mustRun(t, exitOK, "ff\n", "key", "-ns", "m", "make")
	if want := "umbp:vllm:v1:m:tp0:pcp0:dcp0:pp0:g0:ff\n"; stdout != want {
		t.Errorf("key make from stdin: %q, want %q", stdout, want)
	}
	// A bad hash is a usage error, as a bad namespace is, and no key of
	// the others is written.
	for _, hash := range []string{"abc", "zzzz"} {
		stdout, stderr := mustRun(t, exitUsage, "", "key", "make", "-ns", "llama", "00", hash)
		mustContain(t, "key make "+hash, stderr, "umbp key make: invalid key: hex hash \""+hash+"\"", "run 'umbp help key make'")
		if stdout != "" {
			t.Errorf("key make 00 %s: wrote\n%s", hash, stdout)
		}
	}
	mustRun(t, exitUsage, "zz\n", "key", "make", "-ns", "llama")
	mustRun(t, exitOK, "", "key", "make", "-h") // help after the subcommand
	if _, stderr := mustRun(t, exitUsage, "", "key", "make", "-bogus", "ab"); strings.Count(stderr, "-bogus") != 1 {
		t.Errorf("key make -bogus: the error is not said once:\n%s", stderr)
	}
	mustRun(t, exitUsage, "", "key", "make", "-ns", "a:b", "ab")                  // bad namespace
	mustRun(t, exitUsage, "", "key", "make", "-ns", "m", "-topo", "tp=2/2", "ab") // rank outside size
	mustRun(t, exitUsage, "", "key", "make", "-ns", "m", "-topo", "xp=1", "ab")
	mustRun(t, exitUsage, "", "key")
	mustRun(t, exitUsage, "", "key", "frob")

	stdout, _ = mustRun(t, exitOK, "", "key", "parse", "umbp:vllm:v1:llama:tp1:pcp2:dcp0:pp1:g3:abcd")
	if want := "namespace=llama tp=1 pcp=2 dcp=0 pp=1 group=3 hash=abcd\n"; stdout != want {
		t.Errorf("key parse: %q, want %q", stdout, want)
	}
	// An invalid key is a usage error; the valid ones are still decoded.
	stdout, stderr := mustRun(t, exitUsage, "", "key", "parse", "-json", "umbp:vllm:v1:llama:tp1:pcp2:dcp0:pp1:g3:abcd", "nope")
	var p parsedKey
	if err := json.Unmarshal([]byte(stdout), &p); err != nil {
		t.Fatalf("%v:\n%s", err, stdout)
	}
	if p != (parsedKey{"umbp:vllm:v1:llama:tp1:pcp2:dcp0:pp1:g3:abcd", "llama", 1, 2, 0, 1, 3, "abcd"}) {
		t.Errorf("key parse -json: %+v", p)
	}
	mustContain(t, "key parse", stderr, `"nope"`)
}

// The keys of ExampleTokenKeyer (umbp/tokens_example_test.go).
func TestKeyTokens(t *testing.T) {
	want := `umbp:vllm:v1:llama:tp0:pcp0:dcp0:pp0:g0:bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325
umbp:vllm:v1:llama:tp1:pcp0:dcp0:pp0:g0:bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325
umbp:vllm:v1:llama:tp0:pcp0:dcp0:pp0:g0:2744667f6645310ff670b0c5d7c64987ffa5940de5a549f17d92dcbb5b559e31
umbp:vllm:v1:llama:tp1:pcp0:dcp0:pp0:g0:2744667f6645310ff670b0c5d7c64987ffa5940de5a549f17d92dcbb5b559e31
`
	var toks []string
	for i := 1; i <= 40; i++ {
		toks = append(toks, fmt.Sprint(i))
	}
	for _, tc := range []struct {
		name, stdin string
		args        []string
	}{
		{"args", "", toks},
		{"stdin lines", strings.Join(toks, "\n"), nil},
		{"stdin JSON", "[" + strings.Join(toks, ",") + "]", []string{"-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"key", "tokens", "-ns", "llama", "-seed", "0", "-topo", "tp=2", "-groups", "0:16"}, tc.args...)
			stdout, _ := mustRun(t, exitOK, tc.stdin, args...)
			if stdout != want {
				t.Errorf("key tokens:\n%s\nwant\n%s", stdout, want)
			}
		})
	}
	mustRun(t, exitUsage, "", "key", "tokens", "-ns", "llama", "1", "2")                            // no seed
	mustRun(t, exitUsage, "", "key", "tokens", "-ns", "llama", "-seed", "0", "-algo", "md5", "1")   // unknown algorithm
	mustRun(t, exitUsage, "", "key", "tokens", "-ns", "llama", "-seed", "0", "-groups", "0:0", "1") // bad block size
	mustRun(t, exitUsage, "", "key", "tokens", "-ns", "llama", "-seed", "0", "1", "99999999999")    // token out of range
}

func TestBench(t *testing.T) {
	for _, opts := range []umbptest.Options{{}, {Version: 1}} {
		t.Run(fmt.Sprintf("v%d", max(opts.Version, 2)), func(t *testing.T) {
			opts.Capacity = 16 << 20
			srv := umbptest.NewServer(t, opts)
			stdout, _ := mustRun(t, exitOK, "", "bench", "-endpoint", srv.Endpoint(),
				"-objects", "6", "-object-size", "64KiB", "-ranges", "4", "-batch", "4", "-rounds", "2", "-json")
			var res benchResult
			if err := json.Unmarshal([]byte(stdout), &res); err != nil {
				t.Fatalf("%v:\n%s", err, stdout)
			}
			if len(res.StoreGBps) != 2 || len(res.LoadGBps) != 2 || !res.Verified || res.Batch != 4 ||
				res.LookupHits[0] != 6 || res.LookupHits[1] != 6 || res.RangedIO != (opts.Version != 1) {
				t.Errorf("bench -json: %+v", res)
			}
			if s := srv.Stats(); s.Objects != 12 || s.Regions != 0 {
				t.Errorf("server after bench: %+v, want 12 objects and no regions", s)
			}
		})
	}
}

func TestBenchText(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	stdout, _ := mustRun(t, exitOK, "", "bench", "-endpoint", srv.Endpoint(), "-objects", "2", "-object-size", "4KiB", "-rounds", "1", "-progress", "on")
	mustContain(t, "bench", stdout, "objects   2 of 4 KiB, 1 range(s) each, jobs of 2", "store", "load", "2 of 2 keys held", "grpc-go", "verified", "umbp-bench-")
	mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-object-size", "10", "-ranges", "3")
	mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-objects", "0")
	mustRun(t, exitUsage, "", "bench", "-endpoint", srv.Endpoint(), "-progress", "sometimes")
}

// An object larger than the pool: the store is refused, and bench says so
// once for every key.
func TestBenchPoolFull(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	_, stderr := mustRun(t, exitFail, "", "bench", "-endpoint", srv.Endpoint(), "-objects", "2", "-object-size", "2MiB", "-rounds", "1")
	mustContain(t, "bench", stderr, "round 1: store: the pool refused 2 of 2 objects of 2 MiB: each is larger than the pool")
	if strings.Count(stderr, "\n") != 1 {
		t.Errorf("bench: not one line:\n%s", stderr)
	}
}

// A stalled server: the store blocks past its deadline and bench ends,
// leaving its buffers to the server that may still use them.
func TestBenchStalled(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	srv.Stall("BatchPut", "BatchPutRanges")
	_, stderr := mustRun(t, exitFail, "", "bench", "-endpoint", srv.Endpoint(), "-objects", "2", "-object-size", "4KiB", "-rounds", "1", "-timeout", "1s")
	mustContain(t, "bench", stderr, "round 1: store:", "buffers still in use")
	srv.Resume()
}

// umbp help lists the commands by what they do, and names no file.
func TestHelpNamesNoFiles(t *testing.T) {
	stdout, _ := mustRun(t, exitOK, "", "help")
	mustContain(t, "help", stdout, "cluster ask MORI's UMBP master which nodes hold what\n")
	if strings.Contains(stdout, ".go") {
		t.Errorf("help names a file:\n%s", stdout)
	}
}

// goField matches a Go field of the library's configurations or of the
// server's options, as the library's messages name them.
var goField = regexp.MustCompile(`\b(?:Cluster)?Config\.[A-Z]|\bOptions\.[A-Z]`)

// No help text names a Go field: each names the flag.
func TestHelpNamesFlagsNotFields(t *testing.T) {
	for _, args := range [][]string{
		{"help"}, {"help", "ping"}, {"help", "lookup"}, {"help", "key"}, {"help", "key", "make"}, {"help", "key", "tokens"},
		{"help", "clear"}, {"help", "bench"}, {"help", "cluster"}, {"help", "cluster", "lookup"}, {"help", "cluster", "match"}, {"help", "cluster", "score"},
	} {
		stdout, _ := mustRun(t, exitOK, "", args...)
		if m := goField.FindString(stdout); m != "" {
			t.Errorf("umbp %s names %s:\n%s", strings.Join(args, " "), m, stdout)
		}
	}
}

// A bad flag value is one line and a pointer to help, for every command,
// not the command's whole help.
func TestBadFlagOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"key", "make", "-topo", "tp=x", "ab"}, `umbp key make: invalid value "tp=x" for flag -topo: "tp=x": strconv.Atoi: parsing "x": invalid syntax`},
		{[]string{"key", "-topo", "xp=1", "make", "ab"}, `umbp key make: invalid value "xp=1" for flag -topo: "xp=1": unknown dimension "xp": want tp, pcp, dcp or pp`},
		{[]string{"key", "tokens", "-bogus"}, "umbp key tokens: flag provided but not defined: -bogus"},
		{[]string{"ping", "-count", "x"}, `umbp ping: invalid value "x" for flag -count: parse error`},
		{[]string{"lookup", "-nosuchflag"}, "umbp lookup: flag provided but not defined: -nosuchflag"},
		{[]string{"bench", "-objects", "many"}, `umbp bench: invalid value "many" for flag -objects: parse error`},
		{[]string{"cluster", "lookup", "-topo", "tp=1/2,pp=2"}, `umbp cluster lookup: invalid value "tp=1/2,pp=2" for flag -topo: "tp=1/2,pp=2": write every dimension as NAME=RANK/SIZE (one rank) or every one as NAME=SIZE (the engine's sizes), not both`},
	} {
		stdout, stderr := mustRun(t, exitUsage, "", tc.args...)
		// The error and the pointer name the subcommand, where there is one.
		cmd := strings.TrimSuffix(strings.TrimPrefix(tc.want[:strings.Index(tc.want, ": ")], "umbp "), ":")
		if want := tc.want + "\nrun 'umbp help " + cmd + "' for its flags\n"; stderr != want || stdout != "" {
			t.Errorf("umbp %s:\nstdout %q\nstderr %q\nwant stderr %q", strings.Join(tc.args, " "), stdout, stderr, want)
		}
	}
}

// -topo means one thing everywhere: NAME=RANK/SIZE is a rank, NAME=SIZE
// the engine's sizes; a command that needs the other form refuses it.
func TestTopoOneMeaning(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// tp=1 is a size: key make writes one rank's keys and needs the rank.
		{[]string{"key", "make", "-ns", "llama", "-topo", "tp=1", "deadbeef"}, "-topo tp=1 gives sizes (NAME=SIZE), but key make writes the keys of one rank: name it as NAME=RANK/SIZE"},
		{[]string{"key", "make", "-ns", "llama", "-topo", "tp=2", "deadbeef"}, "-topo tp=2 gives sizes"},
		// tp=1/2 is a rank: tokens key every rank and take the sizes.
		{[]string{"key", "tokens", "-ns", "llama", "-seed", "0", "-topo", "tp=1/2", "1", "2"}, "-topo tp=1/2 names a rank (NAME=RANK/SIZE), but key tokens keys every rank of the engine: give its sizes as NAME=SIZE (tp=2)"},
		{[]string{"lookup", "-endpoint", "/nonexistent/x.grpc.sock", "-tokens", "-ns", "llama", "-seed", "0", "-topo", "tp=1/2", "1"}, "-topo tp=1/2 names a rank"},
	} {
		stdout, stderr := mustRun(t, exitUsage, "", tc.args...)
		mustContain(t, strings.Join(tc.args, " "), stderr, tc.want)
		if stdout != "" {
			t.Errorf("umbp %s wrote %q", strings.Join(tc.args, " "), stdout)
		}
	}
	stdout, _ := mustRun(t, exitOK, "", "key", "make", "-ns", "llama", "-topo", "tp=1/2", "deadbeef")
	if want := "umbp:vllm:v1:llama:tp1:pcp0:dcp0:pp0:g0:deadbeef\n"; stdout != want {
		t.Errorf("key make -topo tp=1/2: %q, want %q", stdout, want)
	}
}

// What a command cannot use is refused, not ignored.
func TestFlagsThatDoNotApply(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"key", "parse", "-ns", "llama", testKey("0a")}, "-ns does not apply to key parse"},
		{[]string{"key", "make", "-ns", "m", "-seed", "0", "-algo", "xxhash", "ab"}, "-algo, -seed do not apply to key make"},
		{[]string{"key", "tokens", "-ns", "m", "-seed", "0", "-group", "1", "1"}, "-group does not apply to key tokens"},
		{[]string{"key", "make", "-json", "ab"}, "-json does not apply to key make"},
		{[]string{"lookup", "-endpoint", "/nonexistent/x.grpc.sock", "-ns", "llama", testKey("0a")}, "-ns does not apply to keys (they key tokens: pass -tokens)"},
		{[]string{"lookup", "-endpoint", "/nonexistent/x.grpc.sock", "-tokens", "-q", "-ns", "m", "-seed", "0", "1"}, "-q does not apply with -tokens"},
	} {
		_, stderr := mustRun(t, exitUsage, "", tc.args...)
		mustContain(t, strings.Join(tc.args, " "), stderr, tc.want)
	}
}

// Errors the library words in its Go fields come out of the tool naming
// the flag that fixes them.
func TestMessagesNameFlags(t *testing.T) {
	_, stderr := mustRun(t, exitUsage, "", "ping", "-endpoint", "relative.sock")
	mustContain(t, "ping -endpoint relative.sock", stderr, `umbp ping: -endpoint: standalone UMBP endpoint "relative.sock" must be an absolute path`)
	_, stderr = mustRun(t, exitUsage, "", "ping", "-endpoint", "/tmp/x.grpc.sock ")
	mustContain(t, "ping -endpoint (a trailing space)", stderr, `umbp ping: -endpoint: standalone UMBP endpoint "/tmp/x.grpc.sock " has white space at its start or end (a socket path never does): did you mean "/tmp/x.grpc.sock"?`)
	_, stderr = mustRun(t, exitUsage, "", "ping", "-endpoint", "/"+strings.Repeat("x", 120)+".grpc.sock")
	mustContain(t, "ping -endpoint (too long)", stderr, "umbp ping: -endpoint: endpoint ")
	_, stderr = mustRun(t, exitUsage, "", "ping", "-trust-uid", "root", "-endpoint", "/tmp/x.sock")
	mustContain(t, "ping -trust-uid root", stderr, `umbp ping: invalid value "root" for flag -trust-uid`)
	_, stderr = mustRun(t, exitUsage, "", "ping", "-trust-uid", "4294967295", "-endpoint", "/tmp/x.sock")
	mustContain(t, "ping -trust-uid 4294967295", stderr, "umbp ping: -trust-uid: ")
	for _, out := range []string{stderr} {
		if m := goField.FindString(out); m != "" {
			t.Errorf("names %s:\n%s", m, out)
		}
	}
}

// A server whose socket belongs to another user is refused naming the
// -trust-uid that would trust it; with it, the command runs.
func TestUntrustedNamesTrustUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give the socket to another user")
	}
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 16 << 20})
	grpcPath := strings.TrimPrefix(srv.Endpoint(), "unix://")
	for _, p := range []string{grpcPath, srv.FDSocketPath()} {
		if err := os.Lchown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	_, stderr := mustRun(t, exitFail, "", "ping", "-endpoint", srv.Endpoint())
	mustContain(t, "ping of another user's server", stderr, "is owned by uid 65534, not this user (uid 0) or root", "(if uid 65534 runs your server, pass -trust-uid 65534)")
	mustRun(t, exitOK, "", "ping", "-endpoint", srv.Endpoint(), "-trust-uid", "65534", "-count", "0")
}

// bench: a value no host can run is a usage error (2) before anything
// is allocated or asked.
func TestBenchTooLarge(t *testing.T) {
	for _, args := range [][]string{
		{"-objects", "1000000", "-object-size", "1GiB"},
		{"-objects", "100000", "-object-size", "64MiB"},
	} {
		args = append([]string{"bench", "-endpoint", "/nonexistent/x.grpc.sock"}, args...)
		_, stderr := mustRun(t, exitUsage, "", args...)
		mustContain(t, strings.Join(args, " "), stderr, "of host memory (a source and a destination buffer), more than this host's memory and swap", "run 'umbp help bench'")
	}
}

// bench says when a round's objects do not all fit in the pool, instead of
// failing each key's load.
func TestBenchWorkingSetExceedsPool(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	stdout, stderr := mustRun(t, exitFail, "", "bench", "-endpoint", srv.Endpoint(), "-objects", "8", "-object-size", "256KiB", "-rounds", "1")
	mustContain(t, "bench", stdout, "store", "lookup")
	mustContain(t, "bench", stderr, "of the 8 objects just stored: the working set (2 MiB) exceeds what the pool keeps, so it evicted the rest; lower -objects or -object-size")
	if strings.Count(stderr, "\n") != 1 || strings.Contains(stderr, "not in the pool: key") {
		t.Errorf("bench: not one line:\n%s", stderr)
	}
}

// Token input that is not token ids says what token input is.
func TestTokenInputSaysItsForm(t *testing.T) {
	_, stderr := mustRun(t, exitUsage, `{"prompt_token_ids": [1, 2]}`, "key", "tokens", "-ns", "m", "-seed", "0", "-")
	mustContain(t, "a JSON object", stderr,
		`umbp key tokens: token "{\"prompt_token_ids\":": a JSON object or string, not a token id: give token ids as integers, separated by spaces or commas, or a JSON array such as [1, 2, 3] (for a request's JSON, its token list, e.g. jq -c .prompt_token_ids)`,
		"run 'umbp help key tokens' for its flags")
	_, stderr = mustRun(t, exitUsage, "", "key", "tokens", "-ns", "m", "-seed", "0", "1", "x2")
	mustContain(t, "a word", stderr, `umbp key tokens: token "x2" is not an integer: give token ids as integers`)
}

// An error that names a flag whose value came from the environment says
// so: the fix is in the environment, not on the command line.
func TestFlagFromEnvironment(t *testing.T) {
	const note = "(the value of $UMBP_ENDPOINT: -endpoint was not given)"
	t.Setenv("UMBP_ENDPOINT", "relative/node0.grpc.sock")
	_, stderr := mustRun(t, exitUsage, "", "ping")
	mustContain(t, "ping with a relative $UMBP_ENDPOINT", stderr, `"relative/node0.grpc.sock" must be an absolute path`, note)
	_, stderr = mustRun(t, exitUsage, "", "ping", "-endpoint", "other/node0.grpc.sock")
	mustContain(t, "ping -endpoint", stderr, `"other/node0.grpc.sock" must be an absolute path`)
	if strings.Contains(stderr, "$UMBP_ENDPOINT:") {
		t.Errorf("a given -endpoint is said to come from the environment:\n%s", stderr)
	}
	missing := filepath.Join(t.TempDir(), "node0.grpc.sock")
	t.Setenv("UMBP_ENDPOINT", missing)
	_, stderr = mustRun(t, exitFail, "", "ping")
	mustContain(t, "ping with $UMBP_ENDPOINT where no socket is", stderr, "no server socket at "+missing+": start the server, or name its socket with $UMBP_ENDPOINT (where this value came from) or -endpoint\n")

	t.Setenv("UMBP_ENDPOINT", "")
	t.Setenv("UMBP_NODE_ID", "nod0")
	_, stderr = mustRun(t, exitFail, "", "ping")
	mustContain(t, "ping with a mistyped $UMBP_NODE_ID", stderr, "/nod0.grpc.sock", "(the default socket of $UMBP_NODE_ID: -endpoint was not given)")

	t.Setenv("UMBP_MASTER_ADDRESS", "/run/umbp/node0.grpc.sock")
	_, stderr = mustRun(t, exitUsage, "", "cluster", "lookup", "-tokens", "1", "2")
	mustContain(t, "cluster lookup with a socket path as $UMBP_MASTER_ADDRESS", stderr, "is not host:port", "(the value of $UMBP_MASTER_ADDRESS: -master was not given)")
}

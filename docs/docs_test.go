// Package docs checks that the documents say what the code does: every
// output the README and docs/ quote is produced again (the quoted commands
// run, or the library called) and compared, and every figure that restates
// a constant or a flag's default is compared with it, and every name a Go
// snippet takes from the module's packages exists (snippets_test.go). A
// document or a quote more is one line of quotes or figures below (a new
// kind of output, a scenario in scenarios_test.go).
package docs

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// root is the repository's root, from this directory.
const root = ".."

// documents are the files whose output blocks are all checked: every line
// of a ```sh block that is a comment of its own (the output of the command
// above it; "#   " continues the line before), and every line of any block
// that starts with level= (a log line).
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{filepath.Join(root, "README.md")}, docs...)
	for i, d := range docs {
		docs[i], _ = filepath.Rel(root, d)
	}
	return docs
}

// A quote is output a document quotes, as it quotes it: "..." or "…"
// stands for what it leaves out, a run of digits for any number (pids,
// uids, sizes), a run of spaces and line breaks for any. from names the
// scenario whose output must hold it.
type quote struct {
	doc, text, from string
}

var quotes = []quote{
	// The service user and the trust rules (as root).
	{"docs/DEPLOYMENT.md", "srw------- 1 umbp umbp 0 ... node0.fd.sock", "service: ls -l"},
	{"docs/DEPLOYMENT.md", "srw------- 1 umbp umbp 0 ... node0.grpc.sock", "service: ls -l"},
	{"docs/DEPLOYMENT.md", "umbp ping: attach at unix:///run/umbp/standalone/node0.grpc.sock: untrusted server: socket /run/umbp/standalone/node0.grpc.sock is owned by uid 999, not this user (uid 0) or root (if uid 999 runs your server, pass -trust-uid 999)", "service: ping"},
	{"docs/DEPLOYMENT.md", "ready      true", "service: ping -trust-uid"},
	{"docs/DEPLOYMENT.md", "umbp ping: server socket: stat /run/umbp/standalone/node0.grpc.sock: permission denied (a server's socket and its directory admit only the server's user and root)", "service: ping as a third user"},
	{"docs/DEPLOYMENT.md", `level=ERROR msg="cannot start: a server (pid 12769, uid 999) accepts connections on /run/umbp/standalone/node0.grpc.sock; stop it, or pass -replace to take its sockets over"`, "service: a second server"},
	{"docs/DEPLOYMENT.md", `level=INFO msg="umbp server: client process exited without deregistering; its regions are released" pid=13551 clients=1 regions=2 bytes=134217728 in_use=1`, "service: bench killed"},
	// The units, as systemd reads them.
	{"docs/DEPLOYMENT.md", "umbp-standalone-server-mori.service: Command /opt/mori/bin/umbp_standalone_server is not executable: No such file or directory", "systemd: MORI's unit"},
	// Refusals of the Go server.
	{"docs/DEPLOYMENT.md", `level=ERROR msg="cannot start: /tmp/notes.grpc.sock is a regular file of 10 bytes, not a socket; it is left as it is: move it away, or give another -endpoint"`, "server: a file at the endpoint"},
	// The library's words.
	{"docs/FAILURES.md", "an earlier transfer is still blocked in the server", "library: a transfer after a blocked one"},
	{"docs/CLUSTER.md", `umbp: invalid configuration: ClusterConfig.Masters "10.1.2.3:50051": plaintext to a master that is not on loopback: MORI's master speaks plaintext TCP without authentication, so anyone on the path can read the prompts' keys and forge the answers; give transport credentials (TLS), or allow plaintext explicitly`, "library: plaintext to 10.1.2.3:50051"},
	{"docs/PROTOCOL.md", "fd handoff registration was not found", "server: reply texts"},
	{"docs/PROTOCOL.md", "server is shutting down", "server: reply texts"},
	// The first program, built and run from its page.
	{"docs/FIRST-PROGRAM.md", "stored 4 blocks", "first program"},
	{"docs/FIRST-PROGRAM.md", "lookup: 1 of 2 keys in the pool", "first program"},
	{"docs/FIRST-PROGRAM.md", "loaded 4 blocks into blocks 4-7: every byte matches", "first program"},
	{"docs/FIRST-PROGRAM.md", "hits: [true true true true false]", "first program"},
	{"docs/FIRST-PROGRAM.md", "prefix: 4 blocks", "first program"},
	{"docs/FIRST-PROGRAM.md", "state connected, 2 lookups, 0 timed out", "first program"},
}

// A figure is text of a document that restates a value of the code:
// {SOURCE} or {SOURCE/FORMAT} stands for the value. SOURCE is
// DIR.NAME, a constant of the package in DIR (exported or not), or
// flag:COMMAND -NAME, the default of a flag of a command as its help says
// it (umbp-standalone-server -h, umbp help SUBCOMMAND). FORMAT: MiB, KiB, ms or s (milliseconds or seconds of a duration), word (one … ten), or
// nothing for the value as is.
var figures = []struct{ doc, text string }{
	{"README.md", "parts (about {internal/conn.partRanges} ranges or {internal/conn.partBytes/MiB} MiB each), {internal/conn.partsInFlight/word} at a time"},
	{"README.md", "`cudaMemcpyBatchAsync` where the runtime has it, {internal/server.maxBatchCopies} copies a call"},
	{"README.md", "the {internal/fdpass.MessageSize}-byte fd-handoff message"},
	{"docs/PROTOCOL.md", "{internal/fdpass.MessageSize}-byte little-endian payload"},
	{"docs/PROTOCOL.md", "gRPC messages may be up to {internal/rpc.MaxMessageSize/MiB} MiB each way"},
	{"docs/ARCHITECTURE.md", "by the {internal/rpc.MaxMessageSize/MiB} MiB message limit and into parts of {internal/conn.partRanges} ranges or {internal/conn.partBytes/MiB} MiB) and sends up to {internal/conn.partsInFlight/word} parts at a time"},
	{"README.md", "`HedgeDelay` ({umbp.DefaultHedgeDelay/ms} ms), to a second"},
	{"docs/ARCHITECTURE.md", "the connection's detached goroutines (up to {umbp.lookupWorkers})"},
	{"docs/PERFORMANCE.md", "the callers took turns on the client's {internal/h2call.MinDefaultMaxConns/word} connections"},
	{"docs/FAILURES.md", "| `LookupTimeout` | {umbp.DefaultLookupTimeout/s} s |"},
	{"docs/FAILURES.md", "| `Timeout` | {umbp.DefaultTimeout/s} s |"},
	{"docs/FAILURES.md", "| `StartupTimeout` | {umbp.DefaultStartupTimeout/s} s |"},
	{"docs/FAILURES.md", "asked in parts of at most {umbp.lookupPartKeys} keys ({umbp.lookupPartBytes/MiB} MiB of keys)"},
	{"docs/FAILURES.md", "a key over `MaxKeyBytes` ({internal/rpc.MaxKeyBytes/KiB} KiB)"},
	{"docs/CLUSTER.md", "`MaxNodes` nodes ({internal/rpc.MaxNodes})"},
	{"docs/CLUSTER.md", "`MaxReplyBytes` ({internal/rpc.MaxMessageSize/MiB} MiB"},
	{"docs/CLUSTER.md", "`LoadFailureQuarantine`: default {umbp.DefaultLoadFailureQuarantine/s} s"},
	{"docs/PERFORMANCE.md", "median of {flag:umbp bench -exists-reps} lookups of that many keys"},
	{"docs/PERFORMANCE.md", "median of {flag:umbp bench -bw-reps} jobs of 256 objects of 64 KiB"},
	{"docs/PERFORMANCE.md", "workers (at most {internal/server.maxCopyWorkers} goroutines)"},
	// Where each kind of call runs (umbp/callsites.go, checked against the
	// calls by TestWhereCallsRun).
	{"docs/ARCHITECTURE.md", "| `Lookup`, `LookupPrefix`, `LookupTokens` | {umbp.whereLookups}, a lock-step call ended at `LookupTimeout` |"},
	{"docs/ARCHITECTURE.md", "| `Score`, `Clear`, `Ping`, lookups with `GRPCLookups` | {umbp.whereOtherCalls}, waited for at most `LookupTimeout` |"},
	{"docs/ARCHITECTURE.md", "| `Store`, `Load`, `StoreBlocks`, `LoadBlocks` | {umbp.whereTransfers}, waited for at most the job's deadline;"},
	{"docs/ARCHITECTURE.md", "`MatchExternalKv` | {umbp.whereWorkerCalls}, bounded by `Timeout` |"},
	{"docs/ARCHITECTURE.md", "The call itself is lock-step (`internal/h2call`) and runs {umbp.whereLookups}"},
	{"umbp/doc.go", "a lookup runs {umbp.whereLookups}, as a lock-step call ended at LookupTimeout;"},
	{"umbp/doc.go", "Score, Clear, Ping (and lookups with GRPCLookups) run {umbp.whereOtherCalls}, waited for at most LookupTimeout;"},
	{"umbp/doc.go", "a transfer runs {umbp.whereTransfers} (the server may use its memory"},
	{"umbp/doc.go", "RegisterBuffers and the external-KV calls run {umbp.whereWorkerCalls}, bounded by Timeout."},
	{"umbp/scheduler.go", "// A lookup runs {umbp.whereLookups} (a lock-step call, its connection interrupted at"},
	// The replica set's policy (internal/replicaset/policy.go).
	{"docs/CLUSTER.md", "While calls are in flight it sends every usable replica a beat every {internal/replicaset.beatEvery/ms} ms"},
	{"docs/CLUSTER.md", "A replica whose beat has gone {internal/replicaset.beatSilence/ms} ms unanswered (or {internal/replicaset.beatSilenceFactor/word} times what the others' beats take, on a host that answers them all late) while another answered a later one"},
	{"docs/CLUSTER.md", "is overtaken {internal/replicaset.overtakenLimit/word} calls in a row while answering nothing else, or is still silent {internal/replicaset.attachGrace/ms} ms after another answered a probe is set aside and probed every {internal/replicaset.probeInterval/ms} ms until it answers"},
	{"README.md", "every replica is sent a beat every {internal/replicaset.beatEvery/ms} ms"},
	{"docs/CLUSTER.md", "While the store is out a check goes every {internal/replicaset.storeCheckEvery/ms} ms to the next replica with fewer than {internal/replicaset.storeChecksEach/word} in flight"},
	{"docs/CLUSTER.md", "gRPC redials a master at the handle's pace (at most {internal/replicaset.redialMax/ms} ms between"},
	{"docs/DEPLOYMENT.md", "| `-capacity` | `{flag:umbp-standalone-server -capacity}` |"},
	{"docs/DEPLOYMENT.md", "| `-prefault` | `{flag:umbp-standalone-server -prefault}` |"},
	{"docs/DEPLOYMENT.md", "| `-version` | `{flag:umbp-standalone-server -version}` |"},
	{"docs/DEPLOYMENT.md", "| `-no-ranged-io` | `{flag:umbp-standalone-server -no-ranged-io}` |"},
	{"docs/DEPLOYMENT.md", "| `-gpu` | `{flag:umbp-standalone-server -gpu}` |"},
	{"docs/DEPLOYMENT.md", "| `-replace` | `{flag:umbp-standalone-server -replace}` |"},
	{"docs/DEPLOYMENT.md", "| `-log-level` | `{flag:umbp-standalone-server -log-level}` |"},
	{"docs/DEPLOYMENT.md", "| `-metrics-any-interface` | `{flag:umbp-standalone-server -metrics-any-interface}` |"},
}

// outputBlocks returns the output lines of doc's code blocks, each as one
// string (continuations joined), without the comment marks. A line of
// only "..." says that output was left out, and is no quote.
func outputBlocks(text string) []string {
	var blocks []string
	lang, in := "", false
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			in = !in
			lang = strings.TrimPrefix(trimmed, "```")
			continue
		}
		switch {
		case !in:
		case strings.HasPrefix(trimmed, "level="):
			blocks = append(blocks, trimmed)
		case lang == "sh" && strings.HasPrefix(trimmed, "#   ") && len(blocks) > 0:
			blocks[len(blocks)-1] += " " + strings.TrimSpace(trimmed[1:])
		case lang == "sh" && strings.HasPrefix(trimmed, "#"):
			blocks = append(blocks, strings.TrimSpace(trimmed[1:]))
		}
	}
	return slices.DeleteFunc(blocks, func(b string) bool { return b == "..." || b == "…" || b == "" })
}

// squeeze collapses every run of white space to one space.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }

// quoteRegexp matches what a quote stands for: its text with "..." or "…"
// for anything, digits for any number, spaces for any white space.
func quoteRegexp(text string) *regexp.Regexp {
	parts := regexp.MustCompile(`\.\.\.|…`).Split(squeeze(text), -1)
	digits := regexp.MustCompile(`[0-9]+`)
	for i, p := range parts {
		p = regexp.QuoteMeta(p)
		p = digits.ReplaceAllString(p, `[0-9]+`)
		parts[i] = strings.ReplaceAll(p, " ", `\s+`)
	}
	return regexp.MustCompile(strings.Join(parts, `(?s:.*?)`))
}

func readDoc(t *testing.T, doc string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every output block of every document is a quote of the table, and every
// quote is in its document, word for word.
func TestQuotesListed(t *testing.T) {
	listed := map[string]bool{}
	for _, q := range quotes {
		listed[q.doc+"\x00"+squeeze(q.text)] = true
		if _, ok := scenarios[q.from]; !ok {
			t.Errorf("%s: quote %q: no scenario %q", q.doc, q.text, q.from)
		}
		doc := squeeze(outputComments(readDoc(t, q.doc)))
		if !strings.Contains(doc, squeeze(q.text)) {
			t.Errorf("%s does not say %q (any more?): the quote and the document must agree", q.doc, q.text)
		}
		// The check sees a quote that changes by a word.
		if changed := changeWord(q.text); strings.Contains(doc, squeeze(changed)) {
			t.Errorf("%s: the quote changed to %q is found too: the check cannot see it change", q.doc, changed)
		}
	}
	for _, doc := range documents(t) {
		for _, b := range outputBlocks(readDoc(t, doc)) {
			if !listed[doc+"\x00"+squeeze(b)] {
				t.Errorf("%s quotes output the check does not know: %q; add it to quotes in docs/docs_test.go, with the scenario that prints it", doc, b)
			}
		}
	}
}

// outputComments is text with the comment marks of output lines taken
// away, so that a quote wrapped over several "#   " lines reads as one.
func outputComments(text string) string {
	return regexp.MustCompile(`(?m)^\s*#\s`).ReplaceAllString(text, " ")
}

// Every quote is in what its scenario prints now.
func TestQuotesHold(t *testing.T) {
	w := newWorld(t)
	for _, q := range quotes {
		t.Run(q.from+": "+q.text[:min(len(q.text), 40)], func(t *testing.T) {
			out := w.output(t, q.from)
			if !quoteRegexp(q.text).MatchString(out) {
				t.Errorf("%s quotes\n\t%s\nbut %q printed\n%s", q.doc, q.text, q.from, indent(out))
			}
			// The check sees what is printed change by a word.
			if changed := changeWord(q.text); quoteRegexp(changed).MatchString(out) {
				t.Errorf("the quote changed to %q still matches what %q printed: the check cannot see it change", changed, q.from)
			}
		})
	}
}

// changeWord changes the first word of four letters or more in text, as
// a drift would.
func changeWord(text string) string {
	loc := regexp.MustCompile(`[A-Za-z]{4,}`).FindStringIndex(text)
	if loc == nil {
		return text + " (changed)"
	}
	mid := (loc[0] + loc[1]) / 2
	return text[:mid] + "zq" + text[mid:]
}

func indent(s string) string {
	return "\t" + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n\t")
}

// Every figure is in its document, with the value the code has now.
func TestFigures(t *testing.T) {
	w := newWorld(t)
	place := regexp.MustCompile(`\{([^}]+)\}`)
	for _, f := range figures {
		var errs []string
		var drifted string
		text := place.ReplaceAllStringFunc(f.text, func(m string) string {
			v, err := w.value(t, strings.Trim(m, "{}"))
			if err != nil {
				errs = append(errs, err.Error())
			}
			return v
		})
		// The same text with the first value changed, as a drift would.
		first := true
		drifted = place.ReplaceAllStringFunc(f.text, func(m string) string {
			v, _ := w.value(t, strings.Trim(m, "{}"))
			if first {
				first = false
				if n, err := strconv.Atoi(v); err == nil {
					return strconv.Itoa(n + 1)
				}
				return v + "x"
			}
			return v
		})
		if len(errs) > 0 {
			t.Errorf("%s: %q: %s", f.doc, f.text, strings.Join(errs, "; "))
			continue
		}
		doc := squeeze(readDoc(t, f.doc))
		if !strings.Contains(doc, squeeze(text)) {
			t.Errorf("%s should say %q (from %q): the code and the document disagree", f.doc, text, f.text)
		}
		if strings.Contains(doc, squeeze(drifted)) {
			t.Errorf("%s says %q too: the check cannot see the figure change", f.doc, drifted)
		}
	}
}

// value renders a figure's source in its format.
func (w *world) value(t *testing.T, ref string) (string, error) {
	// SOURCE/FORMAT: a format is the part after the last slash, if that
	// part is a word.
	src, format := ref, ""
	if j := strings.LastIndex(ref, "/"); j >= 0 && regexp.MustCompile(`^[A-Za-z]+$`).MatchString(ref[j+1:]) {
		src, format = ref[:j], ref[j+1:]
	}
	var n constant.Value
	if cmd, ok := strings.CutPrefix(src, "flag:"); ok {
		i := strings.LastIndex(cmd, " -")
		def, err := w.flagDefault(t, strings.Fields(cmd[:i]), cmd[i+2:])
		if err != nil || format == "" {
			return def, err
		}
		n = constant.MakeFromLiteral(def, token.INT, 0)
	} else {
		dot := strings.LastIndex(src, ".")
		v, err := w.constant(src[:dot], src[dot+1:])
		if err != nil {
			return "", err
		}
		n = v
	}
	i, ok := constant.Int64Val(constant.ToInt(n))
	if !ok {
		if n.Kind() == constant.String {
			return constant.StringVal(n), nil
		}
		return "", fmt.Errorf("%s is %v, not an integer", src, n)
	}
	switch format {
	case "":
		return strconv.FormatInt(i, 10), nil
	case "MiB":
		if i%(1<<20) != 0 {
			return "", fmt.Errorf("%s is %d, not whole MiB", src, i)
		}
		return strconv.FormatInt(i>>20, 10), nil
	case "KiB":
		if i%(1<<10) != 0 {
			return "", fmt.Errorf("%s is %d, not whole KiB", src, i)
		}
		return strconv.FormatInt(i>>10, 10), nil
	case "ms":
		if i%1e6 != 0 {
			return "", fmt.Errorf("%s is %d ns, not whole milliseconds", src, i)
		}
		return strconv.FormatInt(i/1e6, 10), nil
	case "s":
		if i%1e9 != 0 {
			return "", fmt.Errorf("%s is %d ns, not whole seconds", src, i)
		}
		return strconv.FormatInt(i/1e9, 10), nil
	case "word":
		words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
		if i < 0 || int(i) >= len(words) {
			return "", fmt.Errorf("%s is %d: no word for it", src, i)
		}
		return words[i], nil
	}
	return "", fmt.Errorf("unknown format %q", format)
}

// constant evaluates the constant name of the package in dir (relative to
// the root) from its source: exported or not. Imports other than "time"
// are not read: a constant that needs them does not evaluate.
func (w *world) constant(dir, name string) (constant.Value, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pkg, ok := w.pkgs[dir]
	if !ok {
		fset := token.NewFileSet()
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			return nil, err
		}
		var files []*ast.File
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(root, dir, e.Name()), nil, 0)
			if err != nil {
				return nil, err
			}
			files = append(files, f)
		}
		if w.std == nil {
			w.std = importer.ForCompiler(token.NewFileSet(), "source", nil)
		}
		conf := types.Config{Importer: onlyTime{w.std}, Error: func(error) {}}
		pkg, _ = conf.Check(dir, fset, files, nil)
		w.pkgs[dir] = pkg
	}
	c, ok := pkg.Scope().Lookup(name).(*types.Const)
	if !ok || c.Val().Kind() == constant.Unknown {
		return nil, fmt.Errorf("%s has no constant %s", dir, name)
	}
	return c.Val(), nil
}

// onlyTime imports "time" and stands in an empty package for every other
// import.
type onlyTime struct{ std types.Importer }

func (i onlyTime) Import(path string) (*types.Package, error) {
	if path == "time" {
		return i.std.Import(path)
	}
	p := types.NewPackage(path, filepath.Base(path))
	p.MarkComplete()
	return p, nil
}

// flagDefault is the default of flag name of command (a command of cmd/,
// and its subcommand) as its help says it (a bool's false unsaid).
func (w *world) flagDefault(t *testing.T, command []string, name string) (string, error) {
	args := []string{"-h"}
	if len(command) > 1 {
		args = []string{"help", command[1]}
	}
	help, code := w.run(t, asRoot, w.bin(t, command[0]), args...)
	if code != 0 {
		return "", fmt.Errorf("%s %s: exit %d", command[0], strings.Join(args, " "), code)
	}
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "-"+name {
			continue
		}
		if !sc.Scan() {
			break
		}
		usage := sc.Text()
		if m := regexp.MustCompile(`\(default "?([^")]*)"?\)$`).FindStringSubmatch(usage); m != nil {
			return m[1], nil
		}
		if len(f) == 1 { // a bool flag says no type and no false default
			return "false", nil
		}
		return "", fmt.Errorf("%s -%s says no default", strings.Join(command, " "), name)
	}
	return "", fmt.Errorf("%s has no flag -%s", strings.Join(command, " "), name)
}

// world runs the scenarios, each once, and keeps what they printed.
type world struct {
	mu   sync.Mutex
	outs map[string]string
	pkgs map[string]*types.Package
	std  types.Importer
	bins string   // the commands, built
	dirs []string // to remove at the end
	ends []func() // to run at the end
	svc  *service
}

func newWorld(t *testing.T) *world {
	w := &world{outs: map[string]string{}, pkgs: map[string]*types.Package{}}
	t.Cleanup(func() {
		w.mu.Lock()
		ends := w.ends
		w.mu.Unlock()
		for _, f := range slices.Backward(ends) {
			f()
		}
		for _, d := range w.dirs {
			_ = os.RemoveAll(d)
		}
	})
	return w
}

// atEnd runs f when the test that made the world ends (not the subtest
// that started what f stops: later subtests use it too).
func (w *world) atEnd(f func()) {
	w.mu.Lock()
	w.ends = append(w.ends, f)
	w.mu.Unlock()
}

// output is what scenario printed, run once.
func (w *world) output(t *testing.T, scenario string) string {
	t.Helper()
	w.mu.Lock()
	out, ok := w.outs[scenario]
	w.mu.Unlock()
	if ok {
		return out
	}
	run, ok := scenarios[scenario]
	if !ok {
		t.Fatalf("no scenario %q", scenario)
	}
	out = run(t, w)
	w.mu.Lock()
	w.outs[scenario] = out
	w.mu.Unlock()
	return out
}

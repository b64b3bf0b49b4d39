// Command umbp is the operator's tool for a node's umbp_standalone_server:
// it checks that the server answers, asks which KV blocks the pool holds,
// makes and decodes object keys, clears the pool and measures transfers.
//
//	umbp ping   [-fd] [-metrics ADDR]            is the server there, what does it offer, how full is its pool?
//	umbp lookup KEY...                           which keys does the pool hold?
//	umbp lookup -tokens -ns NS -seed S TOKEN...  how much of a prompt does it hold?
//	umbp key make -ns NS [-topo tp=1/2] HASH...  the keys of block hashes
//	umbp key parse KEY...                        the parts of keys
//	umbp key tokens -ns NS -seed S TOKEN...      the keys vLLM's connector stores for a prompt
//	umbp clear -yes                              drop every object of every engine
//	umbp bench [-objects N] [-object-size 4MiB]  store and load throughput, byte-checked
//	umbp bench -suite -yes                       the C++ umbp_bench client's workload, side by side
//	umbp dev master [-nodes 3]                   a test double of MORI's master with nodes, to try 'umbp cluster' on
//
// Commands that talk to a server take -endpoint (default $UMBP_ENDPOINT,
// else MORI's unix:///run/umbp/standalone/<$UMBP_NODE_ID or node0>.grpc.sock)
// and -timeout; the server must pass the same identity check an engine's
// handles make (-trust-uid widens it). The exit status is 0 on success, 1
// when the server could not be asked, did not answer or refused, 2 for a
// usage error. A server socket that is missing, or that no process
// listens on, is reported at once; a server that answers its socket but
// is not ready yet is waited for up to -timeout. The client library's log
// is shown only with -v. `umbp help COMMAND` lists a command's flags.
//
// Every command goes through the public package, exactly as an engine
// would: lookup, ping and clear through a scheduler handle, bench through a
// worker handle. bench stores new keys in a namespace of its own each run;
// they stay in the pool until evicted. bench -suite clears the pool before
// each store, and so asks for -yes as clear does.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/umbp-go/umbp-go/internal/endpoint"
	"github.com/umbp-go/umbp-go/umbp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal ends the process at once
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// errUsage marks an error in how the command was called.
var errUsage = errors.New("usage")

// env is what a command runs with: its streams and the context that a
// signal cancels.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

type command struct {
	name    string
	args    string // synopsis of the arguments after the flags
	summary string
	// flags adds the command's own flags and returns the function that runs
	// it with the remaining arguments.
	flags func(fs *flag.FlagSet, c *common) func(ctx context.Context, e env, args []string) error
	// help is the command's usage text, flags included; nil for the
	// synopsis, the summary and every flag.
	help func(fs *flag.FlagSet) string
}

// subcommands are the subcommands the command's synopsis names
// ("make|parse|tokens ..."), none for a command without.
func (c command) subcommands() []string {
	subs, ok := strings.CutSuffix(c.args, " ...")
	if !ok || !strings.Contains(subs, "|") {
		return nil
	}
	return strings.Split(subs, "|")
}

// who is how an error of the command names it: with its subcommand, when
// args start with one.
func (c command) who(args []string) string {
	if len(args) > 0 && slices.Contains(c.subcommands(), args[0]) {
		return "umbp " + c.name + " " + args[0]
	}
	return "umbp " + c.name
}

func commands() []command {
	return []command{
		{"ping", "", "check that the server answers, and show what it offers", pingFlags, nil},
		{"lookup", "[KEY... | -tokens TOKEN...]  (none, or \"-\": read standard input)", "show which keys, or how much of a prompt, the pool holds", lookupFlags, nil},
		{"key", "make|parse|tokens|text|request ...", "make keys from block hashes, tokens or text, or decode keys", keyFlags, keyHelp},
		{"clear", "-yes", "drop every object in the pool (every engine's KV)", clearFlags, nil},
		{"bench", "", "measure store and load throughput through a worker handle", benchFlags, nil},
		{"cluster", "lookup|match|score ...", "ask MORI's UMBP master which nodes hold what", clusterFlags, clusterHelp},
		{"dev", "master", "run a test double of MORI's master, with nodes, to try the cluster commands on", devFlags, devHelp},
	}
}

// run is main without the exit: it returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := env{stdin: stdin, stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			usage(stdout)
			return exitOK
		}
		// umbp help CMD [SUB] is umbp CMD [SUB] -h.
		name, rest = rest[0], append(slices.Clone(rest[1:]), "-h")
	}
	for _, cmd := range commands() {
		if cmd.name != name {
			continue
		}
		fs := flag.NewFlagSet("umbp "+cmd.name, flag.ContinueOnError)
		c := &common{}
		runCmd := cmd.flags(fs, c)
		err := parseFlags(fs, rest)
		who := cmd.who(fs.Args()) // before a subcommand parses the rest
		if errors.Is(err, flag.ErrHelp) {
			err = &helpText{text: commandHelp(cmd, fs)}
		}
		if err == nil {
			c.log = c.logger(stderr)
			err = runCmd(ctx, e, fs.Args())
		}
		var help *helpText
		switch {
		case err == nil:
			return exitOK
		case errors.As(err, &help):
			fmt.Fprint(stdout, help.text)
			return exitOK
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "%s: %s\n", who, withEnvSource(inFlagWords(err), fs))
			fmt.Fprintf(stderr, "run '%s' for its flags\n", strings.Replace(who, "umbp ", "umbp help ", 1))
			return exitUsage
		default:
			fmt.Fprintf(stderr, "%s: %s\n", who, withEnvSource(inFlagWords(err), fs))
			return exitFail
		}
	}
	fmt.Fprintf(stderr, "umbp: unknown command %q\n", name)
	usage(stderr)
	return exitUsage
}

// commandHelp is cmd's usage text.
func commandHelp(cmd command, fs *flag.FlagSet) string {
	if cmd.help != nil {
		return cmd.help(fs)
	}
	return fmt.Sprintf("usage: umbp %s [flags] %s\n\n%s.\n\nflags:\n%s", cmd.name, cmd.args, cmd.summary, flagHelp(fs, nil))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: umbp COMMAND [flags] [args]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-7s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands that talk to a server take -endpoint (default $UMBP_ENDPOINT, else")
	fmt.Fprintln(w, "unix:///run/umbp/standalone/<$UMBP_NODE_ID or node0>.grpc.sock) and -timeout;")
	fmt.Fprintln(w, "cluster takes -master (default $UMBP_MASTER_ADDRESS).")
	fmt.Fprintln(w, "Run 'umbp help COMMAND' for a command's flags.")
}

// common holds the flags every command that talks to a server shares.
type common struct {
	endpoint string
	timeout  time.Duration
	trusted  uidList
	verbose  bool
	log      *slog.Logger // the client library's
	lib      *libLog      // what log keeps of it
}

// register adds the shared flags, with the command's default timeout.
func (c *common) register(fs *flag.FlagSet, timeout time.Duration, timeoutDoc string) {
	fs.StringVar(&c.endpoint, "endpoint", endpoint.Default(), "server socket: an absolute path or unix:///abs/path")
	fs.DurationVar(&c.timeout, "timeout", timeout, timeoutDoc)
	fs.Var(&c.trusted, "trust-uid", "uids besides yours and root's trusted to run the server, comma-separated")
	fs.BoolVar(&c.verbose, "v", false, "show the client library's log on stderr, debug messages included (without -v it shows none)")
}

// logger returns the client library's logger. The tool's own lines are its
// answer: the library's log goes to w only with -v; without, nothing of it
// is shown, and c.lib keeps its last warning for the one failure the
// library reports only in its log (a lookup that fails answers misses).
func (c *common) logger(w io.Writer) *slog.Logger {
	c.lib = &libLog{last: new(lastWarning)}
	if c.verbose {
		c.lib.next = slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	return slog.New(c.lib)
}

// libLog is the slog.Handler the client library logs to: it passes every
// record to next (nil without -v) and keeps the last warning or error.
type libLog struct {
	next  slog.Handler
	last  *lastWarning
	attrs []slog.Attr // from WithAttrs, for the kept text
}

// lastWarning is the text of the last record at slog.LevelWarn or above.
type lastWarning struct {
	mu   sync.Mutex
	text string
}

func (l *libLog) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn || (l.next != nil && l.next.Enabled(ctx, level))
}

func (l *libLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		var b strings.Builder
		b.WriteString(r.Message)
		add := func(a slog.Attr) bool {
			if a.Key == "err" || a.Key == "reason" {
				fmt.Fprintf(&b, ": %v", a.Value)
			}
			return true
		}
		for _, a := range l.attrs {
			add(a)
		}
		r.Attrs(add)
		l.last.mu.Lock()
		l.last.text = b.String()
		l.last.mu.Unlock()
	}
	if l.next != nil && l.next.Enabled(ctx, r.Level) {
		return l.next.Handle(ctx, r)
	}
	return nil
}

func (l *libLog) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *l
	c.attrs = append(slices.Clip(l.attrs), attrs...)
	if l.next != nil {
		c.next = l.next.WithAttrs(attrs)
	}
	return &c
}

func (l *libLog) WithGroup(name string) slog.Handler {
	c := *l
	if l.next != nil {
		c.next = l.next.WithGroup(name)
	}
	return &c
}

// lastWarning returns the text of the library's last warning, "" if none.
func (l *libLog) lastWarning() string {
	l.last.mu.Lock()
	defer l.last.mu.Unlock()
	return l.last.text
}

// config is the client configuration the flags describe.
func (c *common) config() umbp.Config {
	return umbp.Config{
		Endpoint:       c.endpoint,
		StartupTimeout: c.timeout,
		LookupTimeout:  c.timeout,
		Timeout:        c.timeout,
		Logger:         c.log,
		TrustedUIDs:    c.trusted,
	}
}

// runtime validates the flags into a runtime, with the command's own
// changes to the configuration, if any, and checks that a server listens
// at its endpoint (see listening).
func (c *common) runtime(adjust ...func(*umbp.Config)) (*umbp.StandaloneRuntime, error) {
	if c.timeout <= 0 {
		return nil, fmt.Errorf("%w: -timeout must be positive", errUsage)
	}
	cfg := c.config()
	for _, f := range adjust {
		f(&cfg)
	}
	rt, err := umbp.NewStandaloneRuntime(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	if err := listening(rt.Endpoint()); err != nil {
		return nil, err
	}
	return rt, nil
}

// listening returns at once, as an error, what keeps any server from
// answering at endpoint now: no socket there, something else at its path,
// or a socket no process listens on (left by a server that exited). The
// library would wait up to StartupTimeout for a server that is starting;
// the tool asks about the server that runs. The check connects to the
// socket and closes it at once, sending nothing.
func listening(endpoint string) error {
	path := strings.TrimPrefix(endpoint, "unix://") // normalized by the runtime
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("no server socket at %s: start the server, or name its socket with -endpoint (or $UMBP_ENDPOINT)", path)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("server socket: %w (a server's socket and its directory admit only the server's user and root)", err)
	case err != nil:
		return fmt.Errorf("server socket: %w", err)
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("%s is not a socket (mode %v): name the server's socket with -endpoint (or $UMBP_ENDPOINT)", path, fi.Mode())
	}
	d := net.Dialer{Timeout: time.Second}
	c, err := d.Dial("unix", path)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("no server listens on %s (a socket left by a server that exited?): start the server", path)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("server socket: %w (a server's socket and its directory admit only the server's user and root)", err)
	}
	if err == nil {
		_ = c.Close()
	}
	return nil // any other error is the library's to report, after its wait
}

// uidList is a flag of comma-separated uids.
type uidList []int

func (l *uidList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, u := range *l {
		s[i] = strconv.Itoa(u)
	}
	return strings.Join(s, ",")
}

func (l *uidList) Set(v string) error {
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		u, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return fmt.Errorf("uid %q: %w", f, err)
		}
		*l = append(*l, int(u))
	}
	return nil
}

// said is an error's text as the tool prints it after its own "umbp CMD: ":
// without the package's "umbp: ", which the library's errors begin with.
func said(text string) string { return strings.TrimPrefix(text, "umbp: ") }

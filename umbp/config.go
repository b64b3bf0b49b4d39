package umbp

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/stats"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// Defaults applied to zero fields of a [Config] or [ClusterConfig].
const (
	DefaultNumWorkers     = 4
	DefaultTimeout        = 30 * time.Second
	DefaultLookupTimeout  = time.Second
	DefaultStartupTimeout = 30 * time.Second
	// DefaultLoadFailureQuarantine is vLLM's load_failure_quarantine_ms in
	// distributed mode: the master's handles quarantine by default.
	DefaultLoadFailureQuarantine = 30 * time.Second
	// DefaultHedgeDelay is ClusterConfig.HedgeDelay's default: far above a
	// healthy master's answer (tenths of a millisecond to a few
	// milliseconds) and far below LookupTimeout.
	DefaultHedgeDelay = 20 * time.Millisecond
)

// Config configures a [StandaloneRuntime]. Only Endpoint is required.
type Config struct {
	// Endpoint is the server's gRPC socket: an absolute path or
	// "unix:///abs/path". The fd-handoff socket is derived from it.
	Endpoint string
	// NumWorkers is the number of transfer goroutines per worker handle.
	// Zero means DefaultNumWorkers.
	NumWorkers int
	// Timeout bounds each transfer once it starts running, Close, and
	// registration. Zero means DefaultTimeout.
	Timeout time.Duration
	// LookupTimeout bounds each scheduler call. Zero means
	// DefaultLookupTimeout.
	LookupTimeout time.Duration
	// LoadFailureQuarantine is how long a key whose load failed
	// ([SchedulerHandle.QuarantineKeys]) answers as a miss, as
	// ClusterConfig.LoadFailureQuarantine is. Zero means
	// DefaultLoadFailureQuarantine; negative turns quarantine off (vLLM's
	// standalone runtime leaves it off: load_failure_quarantine_ms 0).
	LoadFailureQuarantine time.Duration
	// RequireDistributed refuses a server whose deployment mode is not
	// STANDALONE_BACKEND_DISTRIBUTED: every attach (and re-attach) fails.
	RequireDistributed bool
	// StartupTimeout bounds the wait for the server to answer Ping when a
	// handle attaches. Zero means DefaultStartupTimeout.
	StartupTimeout time.Duration
	// Logger receives the package's warnings. Nil means slog.Default().
	Logger *slog.Logger
	// NodeID, NodeAddress and Tags identify the worker in RegisterMemory.
	NodeID, NodeAddress string
	Tags                []string
	// TrustedUIDs are uids, besides this process's own and root's, trusted
	// to run the server: its socket files may be owned by, and its process
	// may run as, one of them. Before any memory is shared with a server,
	// its sockets and its process are checked; the check cannot be turned
	// off otherwise.
	TrustedUIDs []int
	// GRPCLookups makes lookups (Lookup, LookupPrefix, and Score's pool
	// prefix) go through grpc-go's call path, as every other call does.
	// By default they are lock-step calls: each written and read to its
	// end by the goroutine that makes it, on a few HTTP/2 connections of
	// their own, with none of grpc-go's hand-offs between goroutines
	// (docs/PERFORMANCE.md says what each costs). Both check the server's
	// identity alike and keep every guarantee; this is for comparison, or
	// a fallback.
	GRPCLookups bool
	// StatsHandler, when not nil, is installed on every handle's gRPC
	// connection (grpc.WithStatsHandler), reconnections included, to trace
	// or measure each call: for OpenTelemetry, otelgrpc.NewClientHandler().
	// It sees the lock-step lookups as it sees gRPC calls, and does not see
	// the fd handoff, which is not gRPC. One handler may serve every
	// handle. A request message it is shown (the Payload of
	// stats.OutPayload) is reused once the call returns: copy what it keeps.
	StatsHandler stats.Handler
}

// settings are a validated Config, defaults filled in, with what every
// connection of a runtime's handles is dialled with, made once.
type settings struct {
	Config
	grpcPath, fdPath string       // the endpoint's sockets
	dial             conn.Options // for each connection
}

// settle validates c and returns it with defaults filled in and the
// endpoint normalized, and the options its connections are dialled with.
func (c Config) settle() (settings, error) {
	ep, grpcPath, fdPath, err := splitEndpoint(c.Endpoint)
	if err != nil {
		return settings{}, fmt.Errorf("%w: Config.Endpoint: %w", ErrInvalidConfig, err)
	}
	c.Endpoint = ep
	if c.NumWorkers < 0 {
		return settings{}, fmt.Errorf("%w: Config.NumWorkers is %d, must not be negative", ErrInvalidConfig, c.NumWorkers)
	}
	if c.NumWorkers == 0 {
		c.NumWorkers = DefaultNumWorkers
	}
	if err := settleTimeouts("Config", &c.Timeout, &c.LookupTimeout, &c.StartupTimeout); err != nil {
		return settings{}, err
	}
	if c.LoadFailureQuarantine == 0 {
		c.LoadFailureQuarantine = DefaultLoadFailureQuarantine
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	trust, err := conn.NewTrust(c.TrustedUIDs)
	if err != nil {
		return settings{}, fmt.Errorf("%w: Config.TrustedUIDs: %w", ErrInvalidConfig, err)
	}
	// They travel in protobuf strings: a server cannot be told them
	// otherwise, and every registration would fail.
	for _, f := range []struct {
		name string
		v    []string
	}{{"NodeID", []string{c.NodeID}}, {"NodeAddress", []string{c.NodeAddress}}, {"Tags", c.Tags}} {
		for _, v := range f.v {
			if !utf8.ValidString(v) {
				return settings{}, fmt.Errorf("%w: Config.%s holds %q, not valid UTF-8", ErrInvalidConfig, f.name, v)
			}
		}
	}
	c.Tags = append([]string(nil), c.Tags...)
	c.TrustedUIDs = append([]int(nil), c.TrustedUIDs...)
	return settings{Config: c, grpcPath: grpcPath, fdPath: fdPath, dial: conn.Options{
		Endpoint:     c.Endpoint,
		NodeID:       c.NodeID,
		NodeAddress:  c.NodeAddress,
		Tags:         c.Tags,
		Logger:       c.Logger,
		Trust:        trust,
		StatsHandler: c.StatsHandler,
		GRPCLookups:  c.GRPCLookups,
	}}, nil
}

// settleTimeouts refuses a negative timeout and fills in a zero one's
// default; what names the config type in the error.
func settleTimeouts(what string, timeout, lookup, startup *time.Duration) error {
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Timeout", timeout, DefaultTimeout},
		{"LookupTimeout", lookup, DefaultLookupTimeout},
		{"StartupTimeout", startup, DefaultStartupTimeout},
	} {
		if *d.v < 0 {
			return fmt.Errorf("%w: %s.%s is %v, must not be negative", ErrInvalidConfig, what, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	return nil
}

// NormalizeEndpoint returns the gRPC address "unix:///abs/path" of a
// standalone server socket. It accepts an absolute socket path, a
// "unix:///abs/path" address, or gRPC's "unix:/abs/path" form. The data
// plane passes file descriptors and IPC handles over Unix sockets, so any
// other scheme is rejected, as is a path that is not absolute or that (with
// its derived fd-handoff socket) does not fit a Unix socket address.
func NormalizeEndpoint(endpoint string) (string, error) {
	ep, _, _, err := splitEndpoint(endpoint)
	return ep, invalid(err)
}

// splitEndpoint returns the normalized endpoint and its two sockets' paths.
func splitEndpoint(endpoint string) (ep, grpcPath, fdPath string, err error) {
	if t := strings.TrimSpace(endpoint); t != endpoint {
		return "", "", "", fmt.Errorf("standalone UMBP endpoint %q has white space at its start or end (a socket path never does): did you mean %q?", endpoint, t)
	}
	path := endpoint
	if p, ok := strings.CutPrefix(endpoint, "unix://"); ok {
		path = p
	} else if p, ok := strings.CutPrefix(endpoint, "unix:"); ok {
		path = p
	} else if strings.Contains(endpoint, "://") {
		return "", "", "", fmt.Errorf("standalone UMBP endpoint must be a Unix socket path or unix:// address, got %q", endpoint)
	}
	if !strings.HasPrefix(path, "/") {
		return "", "", "", fmt.Errorf("standalone UMBP endpoint %q must be an absolute path, such as /run/umbp/node0.grpc.sock or unix:///run/umbp/node0.grpc.sock", endpoint)
	}
	if base, ok := strings.CutSuffix(path, ".fd.sock"); ok {
		return "", "", "", fmt.Errorf("standalone UMBP endpoint %q is a server's fd-handoff socket; the endpoint is its gRPC socket, such as %s.grpc.sock", endpoint, base)
	}
	grpcPath, fdPath, err = fdpass.SocketPaths(path)
	if err != nil {
		return "", "", "", err
	}
	return "unix://" + path, grpcPath, fdPath, nil
}

// checkMode refuses a connection whose server is not in distributed mode
// when the config requires it.
func (s settings) checkMode(c *conn.Conn) error {
	if !s.RequireDistributed {
		return nil
	}
	if m := c.Capabilities().Mode; m != umbppb.StandaloneBackendMode_STANDALONE_BACKEND_DISTRIBUTED {
		return fmt.Errorf("%w: %w: it answered %s", ErrNotSupported, errNotDistributed, m)
	}
	return nil
}

// MasterMode is the Mode of [ServerCapabilities] for a handle attached to
// MORI's UMBP master.
const MasterMode = "UMBP_MASTER"

// ClusterConfig configures a [ClusterRuntime]: a scheduler's or a router's
// view of a distributed pool through MORI's UMBP master. Only Masters is
// required.
type ClusterConfig struct {
	// Masters are the master's addresses, host:port: one, or the replicas
	// of a master that keeps its state in a RESP store (Redis, Valkey),
	// which serve one pool interchangeably. A handle keeps a channel to
	// each, sends a call to one healthy replica (the least busy, the one
	// that answered last among equals) and, when it has not answered
	// within the hedge delay, to a second; a replica that stalls or
	// refuses is set aside and probed back, and a call that overran
	// LookupTimeout on one is followed at once by a probe of them all:
	// the next calls go to those that answer.
	Masters []string
	// HedgeDelay is how long a call waits for one replica before it asks
	// a second one too (the first good answer wins); a kind of call that
	// takes longer (Score's MatchExternalKv of thousands of hashes) waits
	// three times its moving average instead. Zero means
	// DefaultHedgeDelay; negative asks one replica at a time. Hedges are
	// budgeted: at most about one call in 25 when the replicas are slow,
	// and none while the replica asked answers its beats (a slow store is
	// as slow on the others). A replica found gone (its beat unanswered
	// while another answers) has the calls waiting on it hedged at once,
	// whatever the delay and the budget.
	HedgeDelay time.Duration
	// TransportCredentials secure the channel to the master (TLS, mutual
	// TLS: credentials.NewTLS). MORI's master serves plaintext without
	// authentication; nil means plaintext, which is allowed only to a
	// loopback address ("localhost", 127.0.0.0/8, ::1) unless
	// AllowPlaintext.
	TransportCredentials credentials.TransportCredentials
	// AllowPlaintext allows plaintext to any address: whoever is on the
	// path can read the keys a scheduler asks about and forge the answers.
	AllowPlaintext bool
	// LookupTimeout bounds each call, as Config.LookupTimeout does. Zero
	// means DefaultLookupTimeout.
	LookupTimeout time.Duration
	// Timeout bounds Close and each RPC to a replica; a call whose caller
	// stopped waiting at LookupTimeout is ended then. Zero means
	// DefaultTimeout.
	Timeout time.Duration
	// StartupTimeout bounds the wait for the master to answer when a handle
	// is made. Zero means DefaultStartupTimeout.
	StartupTimeout time.Duration
	// LoadFailureQuarantine is how long a key whose load failed
	// ([SchedulerHandle.QuarantineKeys]) answers as a miss. Zero means
	// DefaultLoadFailureQuarantine; negative turns quarantine off.
	LoadFailureQuarantine time.Duration
	// MaxReplyBytes bounds one answer of the master (0: the protocol's
	// message limit, 64 MiB); MaxNodes bounds the nodes one match may name
	// (0: 4096). An answer over either is a miss.
	MaxReplyBytes int
	MaxNodes      int
	// Logger receives the package's warnings. Nil means slog.Default().
	Logger *slog.Logger
	// StatsHandler, when not nil, is installed on each handle's channel,
	// and sees the lock-step lookups as it sees gRPC calls.
	StatsHandler stats.Handler
	// GRPCLookups makes BatchLookup go through grpc-go's call path, as
	// Config.GRPCLookups does for a standalone server.
	GRPCLookups bool
}

func (c ClusterConfig) withDefaults() (ClusterConfig, error) {
	if len(c.Masters) == 0 {
		return c, fmt.Errorf("%w: ClusterConfig.Masters is empty: give the master's host:port", ErrInvalidConfig)
	}
	c.Masters = slices.Clone(c.Masters)
	for i, m := range c.Masters {
		if !utf8.ValidString(m) {
			return c, fmt.Errorf("%w: ClusterConfig.Masters[%d] is not valid UTF-8", ErrInvalidConfig, i)
		}
		if err := masterconn.CheckAddress(m, c.TransportCredentials == nil, c.AllowPlaintext); err != nil {
			return c, fmt.Errorf("%w: ClusterConfig.Masters %q: %w", ErrInvalidConfig, m, err)
		}
		if slices.Index(c.Masters, m) != i {
			return c, fmt.Errorf("%w: ClusterConfig.Masters names %q twice", ErrInvalidConfig, m)
		}
	}
	if c.HedgeDelay == 0 {
		c.HedgeDelay = DefaultHedgeDelay
	}
	if err := settleTimeouts("ClusterConfig", &c.Timeout, &c.LookupTimeout, &c.StartupTimeout); err != nil {
		return c, err
	}
	if c.LoadFailureQuarantine == 0 {
		c.LoadFailureQuarantine = DefaultLoadFailureQuarantine
	}
	if c.MaxReplyBytes < 0 || c.MaxNodes < 0 {
		return c, fmt.Errorf("%w: ClusterConfig.MaxReplyBytes and MaxNodes must not be negative", ErrInvalidConfig)
	}
	if c.MaxReplyBytes == 0 {
		c.MaxReplyBytes = rpc.MaxMessageSize
	}
	if c.MaxNodes == 0 {
		c.MaxNodes = rpc.MaxNodes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// check refuses weights that are negative or not finite: a score must
// grow with what a node holds. Errors name the field.
func (w TierWeights) check() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"HBM", w.HBM}, {"DRAM", w.DRAM}, {"SSD", w.SSD}} {
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return fmt.Errorf("the weight Weights.%s is %v: want 0 or more", f.name, f.v)
		}
	}
	return nil
}

// DistributedMode is the Mode of [ServerCapabilities] of a standalone
// server whose backend is a node of a distributed pool (MORI's
// STANDALONE_BACKEND_DISTRIBUTED): its lookups are cluster-wide and it
// forwards the external-KV calls to the master.
const DistributedMode = "STANDALONE_BACKEND_DISTRIBUTED"

// errNotDistributed refuses a server that is not in distributed mode when
// Config.RequireDistributed asks for one.
var errNotDistributed = errors.New("the server's deployment mode is not " + DistributedMode + " (Config.RequireDistributed)")

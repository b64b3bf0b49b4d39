package umbp

import (
	"context"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/stats"

	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/masterconn"
	"github.com/umbp-go/umbp-go/internal/rpc"
)

// MasterMode is the Mode of [ServerCapabilities] for a handle attached to
// MORI's UMBP master.
const MasterMode = "UMBP_MASTER"

// ClusterConfig configures a [ClusterRuntime]: a scheduler's or a router's
// view of a distributed pool through MORI's UMBP master. Only Master is
// required.
type ClusterConfig struct {
	// Master is the master's address, host:port.
	Master string
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
	// Timeout bounds Close and each call's RPC at the master: a call that
	// overran LookupTimeout holds later calls off (they answer misses at
	// once) until it returns or Timeout passes. Zero means DefaultTimeout.
	Timeout time.Duration
	// StartupTimeout bounds the wait for the master to answer when a handle
	// is made. Zero means DefaultStartupTimeout.
	StartupTimeout time.Duration
	// LoadFailureQuarantine is how long a key whose load failed
	// ([SchedulerHandle.QuarantineKeys]) answers as a miss. Zero means
	// DefaultLoadFailureQuarantine; negative turns quarantine off.
	LoadFailureQuarantine time.Duration
	// MaxReplyBytes bounds one answer of the master (0: 64 MiB, MORI's
	// message limit); MaxNodes bounds the nodes one match may name (0:
	// 4096). An answer over either is a miss.
	MaxReplyBytes int
	MaxNodes      int
	// Logger receives the package's warnings. Nil means slog.Default().
	Logger *slog.Logger
	// StatsHandler, when not nil, is installed on each handle's channel.
	StatsHandler stats.Handler
}

// DefaultLoadFailureQuarantine is vLLM's load_failure_quarantine_ms in
// distributed mode.
const DefaultLoadFailureQuarantine = 30 * time.Second

func (c ClusterConfig) withDefaults() (ClusterConfig, error) {
	if !utf8.ValidString(c.Master) {
		return c, fmt.Errorf("%w: ClusterConfig.Master is not valid UTF-8", ErrInvalidConfig)
	}
	if err := masterconn.CheckAddress(c.Master, c.TransportCredentials == nil, c.AllowPlaintext); err != nil {
		return c, fmt.Errorf("%w: ClusterConfig.Master %q: %w", ErrInvalidConfig, c.Master, err)
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

// ClusterRuntime is a validated configuration that yields scheduler handles
// on MORI's UMBP master: the same [SchedulerHandle] a [StandaloneRuntime]
// yields, asking the master instead of a node's server. It holds no
// connection itself: each handle owns its own. It is safe for concurrent
// use.
type ClusterRuntime struct {
	cfg ClusterConfig
}

// NewClusterRuntime validates cfg and fills in defaults. It does no I/O.
// Plaintext to an address that is not loopback is refused unless
// cfg.AllowPlaintext, and the error says why.
func NewClusterRuntime(cfg ClusterConfig) (*ClusterRuntime, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &ClusterRuntime{cfg: c}, nil
}

// Master returns the master's address.
func (r *ClusterRuntime) Master() string { return r.cfg.Master }

// Config returns the configuration in effect, defaults filled in.
func (r *ClusterRuntime) Config() ClusterConfig { return r.cfg }

// NewSchedulerHandle attaches a scheduler handle to the master, waiting at
// most StartupTimeout (or until ctx ends) for it to answer. Its lookups ask
// the master whether any node holds a key, on any tier; Clear is refused
// (a distributed pool is cleared by its nodes, not by a scheduler, as in
// vLLM). The arguments are validated as [StandaloneRuntime]'s.
func (r *ClusterRuntime) NewSchedulerHandle(ctx context.Context, namespace string, topo RankTopology, layout *KVLayoutDescriptor) (*SchedulerHandle, error) {
	if err := checkHandleArgs(namespace, topo, layout); err != nil {
		return nil, err
	}
	c, err := masterconn.New(masterconn.Options{
		Address:        r.cfg.Master,
		Creds:          r.cfg.TransportCredentials,
		AllowPlaintext: r.cfg.AllowPlaintext,
		MaxReplyBytes:  r.cfg.MaxReplyBytes,
		MaxNodes:       r.cfg.MaxNodes,
		StatsHandler:   r.cfg.StatsHandler,
		Redial:         masterRedial,
	})
	if err != nil {
		return nil, fmt.Errorf("umbp: cannot attach to the UMBP master at %s: %w", r.cfg.Master, err)
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.StartupTimeout)
	err = c.Probe(pctx, true)
	cancel()
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("umbp: cannot attach to the UMBP master at %s: %w", r.cfg.Master, err)
	}
	pool, err := newLookupPool()
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	b := newMasterBackend(c, r.cfg)
	h := &SchedulerHandle{
		backend:      b,
		address:      r.cfg.Master,
		what:         "UMBP master",
		log:          r.cfg.Logger,
		timeout:      r.cfg.LookupTimeout,
		closeTimeout: r.cfg.Timeout,
		calls:        pool,
		quarantine:   newQuarantine(r.cfg.LoadFailureQuarantine),
	}
	return h, nil
}

// masterBackend is a scheduler handle's channel to the master. gRPC
// redials the master on its own; the handle's state follows the channel's:
// READY is connected, anything else reconnecting.
type masterBackend struct {
	c          *masterconn.Conn
	addr       string
	rpcTimeout time.Duration
	log        *slog.Logger

	st   connState
	stop context.CancelFunc
	done chan struct{}
}

func newMasterBackend(c *masterconn.Conn, cfg ClusterConfig) *masterBackend {
	ctx, stop := context.WithCancel(context.Background())
	b := &masterBackend{c: c, addr: cfg.Master, rpcTimeout: cfg.Timeout, log: cfg.Logger, stop: stop, done: make(chan struct{})}
	// It answered just now: connected, the zero state.
	go b.watch(ctx)
	return b
}

// watch follows the channel's state until shutdown.
func (b *masterBackend) watch(ctx context.Context) {
	defer close(b.done)
	// The channel's state can lag behind the call that proved it working
	// (gRPC installs the picker before it reports READY): a CONNECTING
	// before the first READY is that lag, not a lost master.
	settled := false
	for s := b.c.State(); ; s = b.c.State() {
		next := StateReconnecting
		switch s {
		case connectivity.Ready:
			next, settled = StateConnected, true
		case connectivity.Connecting:
			if !settled {
				next = StateConnected
			}
		case connectivity.Idle:
			b.c.Connect() // a lost connection: redial now
		case connectivity.Shutdown:
			return
		}
		if s != connectivity.Connecting {
			settled = true
		}
		if prev := b.st.get(); prev != next && b.st.move(prev, next) {
			if next == StateConnected {
				b.log.Info("UMBP master is back; lookups go to it again", "master", b.addr)
			} else {
				b.log.Warn("UMBP master connection lost; lookups answer misses until it is back", "master", b.addr, "grpc_state", s.String())
			}
		}
		if !b.c.WaitForStateChange(ctx, s) {
			return
		}
	}
}

func (b *masterBackend) session() (lookupSource, error) {
	switch b.st.get() {
	case StateClosed:
		return nil, ErrClosed
	case StateReconnecting:
		return nil, errReconnecting
	}
	return b, nil
}

func (b *masterBackend) failed(error)       {}
func (b *masterBackend) states() *connState { return &b.st }

func (b *masterBackend) capabilities() ServerCapabilities {
	return ServerCapabilities{Ready: b.st.get() == StateConnected, Mode: MasterMode}
}

func (b *masterBackend) rpcName(method string) string {
	switch method {
	case "BatchExists", "BatchExistsConsecutive", "Ping":
		return "BatchLookup"
	case "Score":
		return "MatchExternalKv and BatchLookup"
	}
	return method
}

func (b *masterBackend) clearRefusal() error {
	return fmt.Errorf("%w: a distributed pool is cleared by its nodes, not through the master", ErrNotSupported)
}

func (b *masterBackend) shutdown() {
	b.st.close()
	b.stop()
	<-b.done
}

func (b *masterBackend) closer() func() error { return b.c.Close }

// waitsOutCalls: closing a gRPC channel cancels the calls on it.
func (b *masterBackend) waitsOutCalls() bool { return false }

// The calls carry a deadline of Timeout: over TCP the timer costs little
// beside the round trip, and a stalled master's call ends by itself.

func (b *masterBackend) encode(keys []string) (encoded.Keys, error) {
	return masterconn.EncodeKeys(keys)
}

func (b *masterBackend) exists(ctx context.Context, keys encoded.Keys) ([]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, b.rpcTimeout)
	defer cancel()
	return b.c.BatchLookupEncoded(ctx, keys)
}

func (b *masterBackend) prefix(ctx context.Context, keys encoded.Keys) (int, error) {
	found, err := b.exists(ctx, keys)
	if err != nil {
		return 0, err
	}
	for i, f := range found {
		if !f {
			return i, nil
		}
	}
	return len(found), nil
}

func (b *masterBackend) match(ctx context.Context, hashes []string) ([]masterconn.NodeMatch, error) {
	ctx, cancel := context.WithTimeout(ctx, b.rpcTimeout)
	defer cancel()
	return b.c.MatchExternalKv(ctx, hashes)
}

func (b *masterBackend) clear(context.Context) (bool, error) { return false, b.clearRefusal() }

func (b *masterBackend) ping(ctx context.Context) (ServerCapabilities, error) {
	ctx, cancel := context.WithTimeout(ctx, b.rpcTimeout)
	defer cancel()
	if err := b.c.Probe(ctx, false); err != nil {
		return ServerCapabilities{}, err
	}
	return ServerCapabilities{Ready: true, Mode: MasterMode}, nil
}

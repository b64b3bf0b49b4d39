// Package conn is one client connection to umbp_standalone_server: the gRPC
// control plane over the server's Unix socket, the fd-handoff socket derived
// from it, and typed wrappers for every method of umbp.UMBPStandalone that
// validate their input, split batches at the message limit and classify
// failures (ErrUnavailable, ErrUnimplemented, ErrRefused, ErrBadReply,
// ErrInvalidArgument, ErrClosed, ErrUntrustedServer).
//
// Before any memory is shared, the server must prove to be run by this user,
// root or a uid in Options.Trust: its socket files' owner and mode, and
// the credentials of the process serving each socket, are checked on every
// gRPC connection and every fd handoff; a server that fails is an error
// wrapping ErrUntrustedServer (see Options.Trust).
//
// No wrapper adds a deadline of its own: a transfer RPC must run until the
// server answers, since the server reads or writes the named memory until its
// handler returns, whatever the client does meanwhile. Callers bound waits on
// their side and pass the context they mean.
package conn

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"

	"github.com/umbp-go/umbp-go/internal/backoff"
	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/h2call"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/internal/sockio"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// Options configures Dial.
type Options struct {
	// Endpoint is the server's gRPC address, "unix:///abs/path" (a bare
	// absolute path and "unix:/abs/path" are accepted too). The fd-handoff
	// socket path is derived from it.
	Endpoint string
	// NodeID, NodeAddress and Tags are the worker identity forwarded in
	// every RegisterMemory; all optional, and valid UTF-8 (the caller
	// checked them: a proto3 string must be).
	NodeID, NodeAddress string
	Tags                []string
	// Logger receives connection events; slog.Default() when nil.
	Logger *slog.Logger
	// Trust is who may run the server besides this process's own uid and
	// root (NewTrust); nil trusts those two only. The check cannot be
	// turned off; trusting more uids is the only way to widen it.
	Trust *Trust
	// PeerCheck, when not nil, runs on the connected fd-handoff socket
	// before a descriptor leaves the process, after the trust check passed.
	PeerCheck fdpass.PeerCheck
	// StatsHandler, when not nil, is installed on the gRPC channel and
	// sees the lock-step calls as it sees a gRPC call.
	StatsHandler stats.Handler
	// GRPCLookups sends lookups (BatchExists, BatchExistsConsecutive)
	// through the gRPC channel, as every other call; by default they are
	// lock-step calls (internal/h2call) on connections of their own.
	GRPCLookups bool
	// GRPCTransfers sends the transfers (BatchPut, BatchGet and their
	// ranged forms) through the gRPC channel; by default each request is a
	// lock-step call on one of the connections the lock-step lookups use,
	// when one is free (the channel otherwise, and for a lock-step call
	// that could not go out).
	GRPCTransfers bool
}

// withStatsHandler installs h on a channel; nil installs nothing.
func withStatsHandler(h stats.Handler) grpc.DialOption {
	if h == nil {
		return grpc.EmptyDialOption{}
	}
	return grpc.WithStatsHandler(h)
}

// Capabilities is what the server's Ping says about it.
type Capabilities struct {
	// Ready is the server's readiness.
	Ready bool
	// Mode is the server's backend deployment mode.
	Mode umbppb.StandaloneBackendMode
	// RangedIO reports whether BatchPutRanges and BatchGetRanges are
	// served (v2 without its SSD tier).
	RangedIO bool
}

// Conn is one connection to a server. Its methods are safe for concurrent
// use.
type Conn struct {
	endpoint string // as given
	grpcPath string
	fdPath   string
	clientID string
	nodeID   string
	nodeAddr string
	tags     []string
	check    fdpass.PeerCheck
	trust    *Trust
	log      *slog.Logger

	// refusal is the error of the connection the trust check refused,
	// which Dial returns.
	refusal atomic.Pointer[error]
	// handshake is how far the dial got: what Dial's error says of a
	// server that never answered.
	handshake atomic.Int32

	cc  *grpc.ClientConn
	raw umbppb.UMBPStandaloneClient
	// lookups makes the lookups lock-step, on connections it dials to the
	// server Dial attached to (nil: through cc); ident is that server's
	// socket, which they must still find at the path.
	lookups *h2call.Client
	// transfers makes the transfers' requests lock-step, on the same
	// connections as the lookups (nil: through cc).
	transfers *h2call.Client
	ident     socketIdent
	// serverPID is the pid of the server the transport reached (0: not
	// known).
	serverPID atomic.Int64

	closed   atomic.Bool
	attached atomic.Bool // Dial returned it: no transport is dialled after
	// redialsRefused counts gRPC's redials refused after Dial.
	redialsRefused atomic.Uint64
	dials          atomic.Uint64 // transports opened, see Transports
	peers          peers         // the server processes behind them
	closeOnce      sync.Once
	closeErr       error

	mu   sync.Mutex
	caps Capabilities
}

// Dial makes one attempt to attach to the server at opts.Endpoint, within
// ctx: it connects to the server's socket, once the socket files and the
// process serving them pass the trust check (see Options.Trust), and asks
// Ping once. A server that is missing, not ready or not answering before
// ctx ends is an error wrapping ErrUnavailable that says what was found, in
// words an operator acts on, without the endpoint (the caller names it). A
// server that fails the trust check is an error wrapping
// ErrUntrustedServer that says what was wrong. Dial never retries: whoever
// waits for a server to come up paces the attempts.
func Dial(ctx context.Context, opts Options) (*Conn, error) {
	grpcPath, fdPath, err := fdpass.SocketPaths(opts.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("dial: %w: %w", rpc.ErrInvalidArgument, err)
	}
	tr := opts.Trust
	if tr == nil {
		tr, _ = NewTrust(nil) // no extra uid: nothing to refuse
	}
	// A socket already there is judged before anything connects to it.
	if err := tr.checkFilesIfPresent(grpcPath, fdPath); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Conn{
		endpoint: opts.Endpoint,
		grpcPath: grpcPath,
		fdPath:   fdPath,
		clientID: newClientID(),
		nodeID:   opts.NodeID,
		nodeAddr: opts.NodeAddress,
		tags:     append([]string(nil), opts.Tags...),
		trust:    tr,
	}
	c.log = log.With("endpoint", opts.Endpoint, "client_id", c.clientID)
	extra := opts.PeerCheck
	c.check = func(uc *net.UnixConn) error {
		if err := c.trust.checkConn(fdPath, uc); err != nil {
			return err
		}
		if extra != nil {
			return extra(uc)
		}
		return nil
	}

	// The target only names the channel; the dialer connects to the
	// socket, so paths need no URL escaping. The authority is "localhost",
	// as for grpc-go's own unix scheme.
	cc, err := grpc.NewClient("passthrough:///localhost",
		grpc.WithContextDialer(c.dialGRPC),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(rpc.MaxMessageSize),
			grpc.MaxCallSendMsgSize(rpc.MaxMessageSize),
		),
		// Stay connected: State reflects the server, not idleness.
		grpc.WithIdleTimeout(0),
		grpc.WithUserAgent("umbp-go"),
		withStatsHandler(opts.StatsHandler),
	)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	c.cc = cc
	c.raw = umbppb.NewUMBPStandaloneClient(cc)
	caps, err := c.attach(ctx)
	if err == nil {
		err = c.trust.checkFilesIfPresent(fdPath) // it may have appeared since
	}
	if err != nil {
		_ = cc.Close()
		c.peers.close()
		return nil, err
	}
	c.setCaps(caps)
	if !opts.GRPCLookups || !opts.GRPCTransfers {
		var lockStep *h2call.Client
		if c.ident, err = statSocket(grpcPath); err == nil {
			lockStep, err = h2call.New(h2call.Options{
				Dial:          c.dialLookup,
				MaxReplyBytes: rpc.MaxMessageSize,
				Redial:        backoff.Redial,
				UserAgent:     "umbp-go",
				StatsHandler:  opts.StatsHandler,
			})
		}
		if err != nil {
			_ = cc.Close()
			c.peers.close()
			return nil, fmt.Errorf("dial: %w: %w", errdefs.ErrUnavailable, err)
		}
		// One set of connections for both: a handle makes lookups (a
		// scheduler's) or transfers (a worker's).
		if !opts.GRPCLookups {
			c.lookups = lockStep
		}
		if !opts.GRPCTransfers {
			c.transfers = lockStep
		}
	}
	// From now on the connection is its one transport: a lost one is not
	// redialled (the caller attaches anew, with a new connection).
	c.attached.Store(true)
	c.log.Debug("connected to the UMBP server", "ranged_io", caps.RangedIO, "mode", caps.Mode.String())
	return c, nil
}

// attach connects the channel and asks Ping once: the call fails as soon as
// the connection does (no socket, nobody listening, refused by the trust
// check), or when ctx ends.
func (c *Conn) attach(ctx context.Context) (Capabilities, error) {
	c.cc.Connect()
	resp, err := c.raw.Ping(ctx, &umbppb.Empty{})
	if refused := c.refusal.Load(); refused != nil {
		return Capabilities{}, *refused
	}
	switch {
	case err != nil:
		what := c.diagnose(err)
		if cerr := ctx.Err(); cerr != nil {
			return Capabilities{}, fmt.Errorf("%w: %s: %w", errdefs.ErrUnavailable, what, cerr)
		}
		return Capabilities{}, fmt.Errorf("%w: %s", errdefs.ErrUnavailable, what)
	case !resp.GetReady():
		return Capabilities{}, fmt.Errorf("%w: the server answered ready=false (still starting?)", errdefs.ErrUnavailable)
	}
	// The channel's state lags the call that just went through: let it
	// catch up, so that State is READY once Dial returns.
	for s := c.cc.GetState(); s == connectivity.Connecting || s == connectivity.Idle; s = c.cc.GetState() {
		if !c.cc.WaitForStateChange(ctx, s) {
			break
		}
	}
	return capsOf(resp), nil
}

// dialGRPC is the transport's dialer: it connects to the gRPC socket and
// hands the connection over only when the socket and the process serving it
// pass the trust check. A refused connection is a failed connection to gRPC,
// which retries it as it would an unreachable server — while Dial waits for
// the server. Once Dial has returned, gRPC asks for a transport only when
// the one Dial attached through is lost: that is refused without touching
// the socket, so that every call after it fails as unavailable at once, and
// the only thing that dials a server again is whoever makes the next Conn.
func (c *Conn) dialGRPC(ctx context.Context, _ string) (net.Conn, error) {
	if c.attached.Load() {
		c.redialsRefused.Add(1)
		return nil, errTransportLost
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.grpcPath)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ENOENT):
			c.handshake.Store(noSocket)
		case errors.Is(err, syscall.ECONNREFUSED):
			c.handshake.Store(noListener)
		case errors.Is(err, syscall.EACCES):
			c.handshake.Store(noAccess)
		}
		// What failed, without the socket's path: the caller names the
		// endpoint once, and gRPC puts this text in its own errors.
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			err = op.Err
		}
		return nil, err
	}
	if err := c.trust.checkConn(c.grpcPath, nc.(*net.UnixConn)); err != nil {
		_ = nc.Close()
		if errors.Is(err, errdefs.ErrUntrustedServer) {
			c.refusal.CompareAndSwap(nil, &err)
		}
		return nil, err
	}
	c.dials.Add(1)
	c.serverPID.Store(int64(peerPID(nc.(*net.UnixConn))))
	c.peers.add(nc.(*net.UnixConn))
	switch c.handshake.Load() {
	case answered:
		return sockio.Wrap(nc), nil
	case hungUp: // the socket hangs up on every connection: it stays so
	default:
		c.handshake.Store(silent)
	}
	return &firstRead{Conn: sockio.Wrap(nc), c: c}, nil
}

// dialLookup connects the lock-step lookups to the server Dial attached
// to, and to no other: the Conn's transport must not be lost (gRPC sees a
// server that went away first), the socket at the path must be the one
// Dial connected to, and its process the one Dial's transport reached — a
// restarted server is another, which the caller attaches to anew. The
// connection passes the trust check as every one does.
func (c *Conn) dialLookup(ctx context.Context) (net.Conn, error) {
	if c.closed.Load() {
		return nil, errdefs.ErrClosed
	}
	if s := c.cc.GetState(); s != connectivity.Ready {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, errTransportLost)
	}
	if id, err := statSocket(c.grpcPath); err != nil || id != c.ident {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, errServerReplaced)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.grpcPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	uc := nc.(*net.UnixConn)
	if err := c.trust.checkConn(c.grpcPath, uc); err != nil {
		_ = nc.Close()
		return nil, err
	}
	if want, got := c.serverPID.Load(), int64(peerPID(uc)); want != 0 && got != want {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, errServerReplaced)
	}
	c.peers.add(uc)
	return nc, nil
}

// socketIdent identifies a server's socket file: one that restarts binds
// the path anew, a new file (its inode number may be reused at once; its
// change time is new).
type socketIdent struct {
	dev, ino        uint64
	ctimeS, ctimeNS int64
}

func statSocket(path string) (socketIdent, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return socketIdent{}, err
	}
	return socketIdent{dev: st.Dev, ino: st.Ino, ctimeS: st.Ctim.Sec, ctimeNS: st.Ctim.Nsec}, nil
}

// errServerReplaced refuses a lookup connection to a server that is not the
// one Dial attached to.
var errServerReplaced = errors.New("the server at the socket is not the one this connection attached to")

// errTransportLost refuses gRPC's redial of a Conn's lost transport.
var errTransportLost = errors.New("the connection's transport was lost; it is not redialled")

// Transports returns how many transports the connection has opened: those
// Dial opened while it waited for the server, never more.
func (c *Conn) Transports() uint64 { return c.dials.Load() }

func capsOf(resp *umbppb.PingResponse) Capabilities {
	return Capabilities{
		Ready:    resp.GetReady(),
		Mode:     resp.GetDeploymentMode(),
		RangedIO: resp.GetSupportsRangedIo(),
	}
}

func (c *Conn) setCaps(caps Capabilities) {
	c.mu.Lock()
	c.caps = caps
	c.mu.Unlock()
}

// ClientID returns the id this connection registers memory and transfers
// under: unique per connection, printable, at most fdpass.MaxClientIDLen
// bytes.
func (c *Conn) ClientID() string { return c.clientID }

// Endpoint returns the endpoint Dial was given.
func (c *Conn) Endpoint() string { return c.endpoint }

// FDSocketPath returns the path of the server's fd-handoff socket.
func (c *Conn) FDSocketPath() string { return c.fdPath }

// SocketPath returns the path of the server's gRPC socket.
func (c *Conn) SocketPath() string { return c.grpcPath }

// Capabilities returns what the latest successful Ping (at Dial or later)
// said.
func (c *Conn) Capabilities() Capabilities {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.caps
}

// State returns the transport's connectivity state; cheap, no I/O.
func (c *Conn) State() connectivity.State { return c.cc.GetState() }

// WaitForStateChange blocks until the transport's state differs from s or
// ctx ends, and reports whether it changed.
func (c *Conn) WaitForStateChange(ctx context.Context, s connectivity.State) bool {
	return c.cc.WaitForStateChange(ctx, s)
}

// Ping asks the server for its capabilities and records them. It fails fast
// when the transport is down.
func (c *Conn) Ping(ctx context.Context) (Capabilities, error) {
	const op = "Ping"
	if err := c.usable(op); err != nil {
		return Capabilities{}, err
	}
	resp, err := c.raw.Ping(ctx, &umbppb.Empty{})
	if err != nil {
		return Capabilities{}, c.rpcError(ctx, op, err)
	}
	caps := capsOf(resp)
	c.setCaps(caps)
	return caps, nil
}

// closeLockStep closes the lock-step calls' connections: their calls in
// flight end at once, as the channel's do.
func (c *Conn) closeLockStep() {
	switch {
	case c.lookups != nil:
		_ = c.lookups.Close()
	case c.transfers != nil:
		_ = c.transfers.Close()
	}
}

// Close closes the connection; RPCs still outstanding end at once with
// ErrClosed and ErrUnavailable, but the server does not notice: it keeps reading or writing the
// memory those transfers named until its handlers return, so such memory
// must never be freed or reused. The server also keeps whatever this client
// registered: Deregister first when nothing may name it any more. Closing
// again returns nil.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.closeLockStep()
		if err := c.cc.Close(); err != nil {
			c.closeErr = fmt.Errorf("close: %w", err)
		}
		c.peers.close()
	})
	return c.closeErr
}

// usable returns ErrClosed (and ErrNotSent) after Close.
func (c *Conn) usable(op string) error {
	if c.closed.Load() {
		return fmt.Errorf("%s: %w (%w)", op, errdefs.ErrClosed, rpc.ErrNotSent)
	}
	return nil
}

// Client ids: "umbp-go-<host>-<pid>-<random>-<n>", unique per connection
// (a process-wide counter) and across processes and restarts (pid and 32
// random bits drawn once per process).
var (
	idCounter atomic.Uint64
	idPrefix  = sync.OnceValue(func() string {
		var r [4]byte
		_, _ = rand.Read(r[:]) // never fails on Linux
		host, _ := os.Hostname()
		host = sanitizeHost(host)
		tail := "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(r[:]) + "-"
		// Room for the counter's 20 digits within MaxClientIDLen.
		room := fdpass.MaxClientIDLen - len("umbp-go-") - len(tail) - 20
		if room < 0 {
			room = 0
		}
		if len(host) > room {
			host = host[:room]
		}
		if host == "" {
			return "umbp-go" + tail
		}
		return "umbp-go-" + host + tail
	})
)

func newClientID() string {
	return idPrefix() + strconv.FormatUint(idCounter.Add(1), 10)
}

// sanitizeHost keeps the host name's first label, in letters, digits and
// dashes.
func sanitizeHost(h string) string {
	out := make([]byte, 0, len(h))
	for i := 0; i < len(h); i++ {
		b := h[i]
		switch {
		case b == '.':
			return string(out)
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9', b == '-', b == '_':
			out = append(out, b)
		}
	}
	return string(out)
}

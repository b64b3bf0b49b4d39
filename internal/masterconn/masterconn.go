// Package masterconn is a bounded client of MORI's UMBP master (service
// umbp.UMBPMaster) for the calls a scheduler or router makes: BatchLookup
// and MatchExternalKv. Every answer is checked against its request before
// anything is taken from it: a reply that does not fit is an error that
// wraps ErrBadReply, never a panic or an allocation the request did not
// bound.
//
// Errors name the operation and what happened, never the address nor the
// package: the caller says that once.
package masterconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/backoff"
	"github.com/umbp-go/umbp-go/internal/encoded"
	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/h2call"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

var (
	// ErrBadReply means the master's answer does not fit the request.
	ErrBadReply = rpc.ErrBadReply
	// ErrPlaintext refuses plaintext to an address that is not loopback.
	ErrPlaintext = errors.New("plaintext to a master that is not on loopback")
	// ErrInvalidArgument refuses a request before it is sent.
	ErrInvalidArgument = rpc.ErrInvalidArgument
)

// Options configure a Conn.
type Options struct {
	// Address is the master's host:port.
	Address string
	// Creds secure the channel; nil is plaintext, which is allowed to
	// loopback addresses only unless AllowPlaintext.
	Creds          credentials.TransportCredentials
	AllowPlaintext bool
	// MaxReplyBytes bounds one answer (0: rpc.MaxMessageSize, MORI's own
	// limit for a message); MaxNodes bounds the nodes of a match (0:
	// rpc.MaxNodes).
	MaxReplyBytes int
	MaxNodes      int
	StatsHandler  stats.Handler
	// Redial paces gRPC's redials of a lost master: a master that came
	// back is used again within about Redial.Max. ConnectTimeout bounds
	// one connection attempt (0: gRPC's default).
	Redial         backoff.Policy
	ConnectTimeout time.Duration
	// GRPCLookups sends BatchLookup through the gRPC channel, as every
	// other call; by default it is a lock-step call (internal/h2call) on
	// connections of its own, dialled to Address with Creds.
	GRPCLookups bool
}

// Conn is a channel to the master. gRPC redials it on its own.
type Conn struct {
	cc       *grpc.ClientConn
	raw      umbppb.UMBPMasterClient
	lookups  *h2call.Client // BatchLookup lock-step; nil: through cc
	maxNodes int
	refused  atomic.Bool // the channel's latest dial was refused (nothing listens at the port)
}

// CheckAddress checks a master address and, for plaintext, that it is
// loopback or that plaintext was allowed; its error says why not.
func CheckAddress(addr string, plaintext, allowPlaintext bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("not host:port: %w", err)
	}
	if host == "" || port == "" {
		return errors.New("needs both a host and a port")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		// A service name is not a port either: gRPC's dialer takes numbers.
		return fmt.Errorf("port %q is not a TCP port (1 to 65535)", port)
	}
	if !plaintext || allowPlaintext {
		return nil
	}
	if !isLoopback(host) {
		return fmt.Errorf("%w: MORI's master speaks plaintext TCP without authentication, so anyone on the path can read the prompts' keys and forge the answers; give transport credentials (TLS), or allow plaintext explicitly", ErrPlaintext)
	}
	return nil
}

// isLoopback reports whether host is a loopback IP or "localhost". Other
// names are not resolved: what they resolve to can change.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// New makes a channel to the master; it does no I/O.
func New(opts Options) (*Conn, error) {
	if err := CheckAddress(opts.Address, opts.Creds == nil, opts.AllowPlaintext); err != nil {
		return nil, err
	}
	creds := opts.Creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	connect := opts.ConnectTimeout
	if connect <= 0 {
		connect = 20 * time.Second // gRPC's own default
	}
	maxReply := opts.MaxReplyBytes
	if maxReply <= 0 {
		maxReply = rpc.MaxMessageSize
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxReply)),
		// Never idle: a lost connection is redialled at once, not at the
		// next call, so that State says when the master is back.
		grpc.WithIdleTimeout(0),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: opts.Redial.GRPC(), MinConnectTimeout: connect}),
	}
	if opts.StatsHandler != nil {
		dopts = append(dopts, grpc.WithStatsHandler(opts.StatsHandler))
	}
	c := &Conn{maxNodes: opts.MaxNodes}
	// The channel's dials, as gRPC's own dialer makes them, noting a
	// refusal for Probe.
	dopts = append(dopts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", addr)
		c.refused.Store(errors.Is(err, syscall.ECONNREFUSED))
		return nc, err
	}))
	cc, err := grpc.NewClient("passthrough:///"+opts.Address, dopts...)
	if err != nil {
		return nil, err
	}
	c.cc, c.raw = cc, umbppb.NewUMBPMasterClient(cc)
	if c.maxNodes <= 0 {
		c.maxNodes = rpc.MaxNodes
	}
	if !opts.GRPCLookups {
		addr := opts.Address
		c.lookups, err = h2call.New(h2call.Options{
			Dial: func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			},
			Creds:         opts.Creds,
			Authority:     addr,
			MaxReplyBytes: maxReply,
			DialTimeout:   connect,
			Redial:        opts.Redial,
			UserAgent:     "umbp-go",
			StatsHandler:  opts.StatsHandler,
		})
		if err != nil {
			_ = cc.Close()
			return nil, err
		}
	}
	return c, nil
}

// Raw returns the generated client on the channel.
func (c *Conn) Raw() umbppb.UMBPMasterClient { return c.raw }

// State is the channel's connectivity state.
func (c *Conn) State() connectivity.State { return c.cc.GetState() }

// WaitForStateChange is grpc.ClientConn's.
func (c *Conn) WaitForStateChange(ctx context.Context, s connectivity.State) bool {
	return c.cc.WaitForStateChange(ctx, s)
}

// Connect starts connecting an idle channel.
func (c *Conn) Connect() { c.cc.Connect() }

// Close closes the channel; calls in flight fail at once.
func (c *Conn) Close() error {
	if c.lookups != nil {
		_ = c.lookups.Close()
	}
	return c.cc.Close()
}

// rpcError classifies a call's failure (rpc.Error); a call cut off by
// Close reads as closed from gRPC's own words.
func rpcError(ctx context.Context, op string, err error) error {
	return rpc.Error(ctx, op, err, false)
}

func checkStrings(op, what string, ss []string) error {
	for i, s := range ss {
		if s == "" || !utf8.ValidString(s) {
			return rpc.Invalid(op, "%s %d (%q) is empty or not UTF-8", what, i, s)
		}
	}
	return nil
}

// EncodeKeys encodes keys for BatchLookupEncoded on the caller's goroutine
// (rpc.EncodeKeys), cut to fit the message limit: the call that sends them
// reads only the encoded bytes. An empty key, or one that is not UTF-8, fails
// the batch with an ErrInvalidArgument that names it.
func EncodeKeys(keys []string) (encoded.Keys, error) {
	return rpc.EncodeKeys("BatchLookup", lookupKeysField, keys, rpc.MaxMessageSize)
}

// EncodeAskable is EncodeKeys leaving out the keys that cannot be asked
// about (rpc.EncodeAskable).
func EncodeAskable(keys []string) (encoded.Keys, error) {
	return rpc.EncodeAskable("BatchLookup", lookupKeysField, keys, rpc.MaxMessageSize)
}

// lookupKeysField is BatchLookupRequest's keys; its node_id, which the
// master ignores, is left empty (so not encoded).
const lookupKeysField = 2

// BatchLookupEncoded reports for each key of k whether some node holds it,
// one request a part of k; a part not sent is freed.
func (c *Conn) BatchLookupEncoded(ctx context.Context, k encoded.Keys) ([]bool, error) {
	const op = "BatchLookup"
	defer k.Free()
	var found []bool
	for _, p := range k.Parts {
		resp := new(umbppb.BatchLookupResponse)
		if err := c.invokeLookup(ctx, p.Msg, resp); err != nil {
			return nil, rpcError(ctx, op, err)
		}
		got := resp.GetFound()
		if len(got) != p.End-p.Start {
			return nil, rpc.BadReply(op, "%d results for %d keys", len(got), p.End-p.Start)
		}
		if len(k.Parts) == 1 {
			return got, nil
		}
		found = append(found, got...)
	}
	return found, nil
}

// invokeLookup sends the encoded BatchLookup msg (rpc.InvokeLookup).
func (c *Conn) invokeLookup(ctx context.Context, msg *encoded.Message, resp proto.Message) error {
	return rpc.InvokeLookup(ctx, c.lookups, c.cc, umbppb.UMBPMaster_BatchLookup_FullMethodName, msg, resp)
}

// BatchLookup is EncodeKeys and BatchLookupEncoded.
func (c *Conn) BatchLookup(ctx context.Context, keys []string) ([]bool, error) {
	k, err := EncodeKeys(keys)
	if err != nil {
		return nil, err
	}
	return c.BatchLookupEncoded(ctx, k)
}

// Probe asks BatchLookup about no keys through the channel: the cheapest
// call with no side effects, to learn whether the master answers.
// waitForReady waits for the channel to connect (an attach), except where
// the master's port refuses the connection: that fails at once, wrapping
// ErrRefusedConnection, as no master listens there.
func (c *Conn) Probe(ctx context.Context, waitForReady bool) error {
	if !waitForReady {
		_, err := c.raw.BatchLookup(ctx, &umbppb.BatchLookupRequest{})
		if err != nil {
			return rpcError(ctx, "BatchLookup", err)
		}
		return nil
	}
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for s := c.cc.GetState(); ; s = c.cc.GetState() {
			if s == connectivity.TransientFailure && c.refused.Load() {
				cancel(ErrRefusedConnection)
				return
			}
			if !c.cc.WaitForStateChange(pctx, s) {
				return
			}
		}
	}()
	_, err := c.raw.BatchLookup(pctx, &umbppb.BatchLookupRequest{}, grpc.WaitForReady(true))
	cancel(nil)
	<-watched
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil && errors.Is(context.Cause(pctx), ErrRefusedConnection):
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, ErrRefusedConnection)
	}
	return rpcError(ctx, "BatchLookup", err)
}

// ErrRefusedConnection is an attach's probe of a master whose port refused
// the connection.
var ErrRefusedConnection = errors.New("connection refused: nothing listens at this address; start the master, or check the address and its port")

// ProbeLookup is Probe made as a lookup goes: lock-step, unless
// Options.GRPCLookups.
func (c *Conn) ProbeLookup(ctx context.Context) error {
	if c.lookups == nil {
		return c.Probe(ctx, false)
	}
	if err := c.lookups.Invoke(ctx, umbppb.UMBPMaster_BatchLookup_FullMethodName, nil, new(umbppb.BatchLookupResponse)); err != nil {
		return rpcError(ctx, "BatchLookup", err)
	}
	return nil
}

// LockStepLookups reports whether BatchLookup is a lock-step call
// (Options.GRPCLookups not set): one that ends when its context does.
func (c *Conn) LockStepLookups() bool { return c.lookups != nil }

// MatchExternalKv asks which nodes hold hashes in the external KV index,
// without counting hits, and checks the answer (CheckMatch).
func (c *Conn) MatchExternalKv(ctx context.Context, hashes []string) ([]NodeMatch, error) {
	const op = "MatchExternalKv"
	if err := checkStrings(op, "hash", hashes); err != nil {
		return nil, err
	}
	resp, err := c.raw.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: hashes})
	if err != nil {
		return nil, rpcError(ctx, op, err)
	}
	m, err := CheckMatch(hashes, resp.GetMatches(), c.maxNodes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return m, nil
}

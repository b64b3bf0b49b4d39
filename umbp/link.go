package umbp

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/connectivity"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// sockIdent identifies one server's socket: a restarted server unlinks and
// binds the path anew, which gives it a new inode. (Not the ctime: a chmod
// after bind changes it.)
type sockIdent struct {
	dev, ino uint64
}

func statIdent(path string) (sockIdent, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return sockIdent{}, err
	}
	return sockIdent{dev: st.Dev, ino: st.Ino}, nil
}

// link is a handle's supervised attachment to the server: the current
// connection, and a goroutine that notices the server going away (transport
// failure, or its socket file replaced) and attaches again, re-running the
// handle's attach hook (re-registration) on the new connection. It is the
// handle's one reconnect loop: a connection never redials a lost transport
// (conn.Dial), so after a loss only the link dials, at its own pace
// (reconnectPause).
type link struct {
	rt      *StandaloneRuntime
	log     *slog.Logger
	path    string // gRPC socket path
	attach  func(ctx context.Context, c *conn.Conn) error
	release func(old *conn.Conn) // called once a connection is replaced

	mu    sync.Mutex
	c     *conn.Conn
	ident sockIdent

	state      atomic.Int32 // HandleState; every change is followed by notifyState
	stateMu    sync.Mutex
	stateCh    chan struct{} // closed at the next state change; nil until asked for
	reconnects atomic.Uint64
	refusals   logLimiter
	retries    logLimiter
	// broken is the connection whose transport left READY: its server went
	// away, and with it, maybe, the registrations. (A server restarted at
	// the same path may get the same inode; this is what notices it.)
	broken  atomic.Pointer[conn.Conn]
	unwatch context.CancelFunc // stops the current connection's watcher
	kickc   chan struct{}
	stopCtx context.Context // ends at shutdown: cancels an attach in progress
	stop    context.CancelFunc
	done    chan struct{}
}

// newLink dials the server, runs attach on the connection, and starts the
// supervising goroutine.
func newLink(ctx context.Context, rt *StandaloneRuntime, attach func(context.Context, *conn.Conn) error, release func(*conn.Conn)) (*link, error) {
	path := rt.cfg.grpcPath
	l := &link{
		rt: rt, log: rt.cfg.Logger, path: path, attach: attach, release: release,
		kickc: make(chan struct{}, 1), done: make(chan struct{}),
	}
	l.stopCtx, l.stop = context.WithCancel(context.Background())
	c, err := rt.dial(ctx)
	if err != nil {
		l.stop()
		return nil, rt.attachError(err)
	}
	ident, _ := statIdent(path)
	if attach != nil {
		if err := attach(ctx, c); err != nil {
			l.stop()
			l.discard(c)
			return nil, err
		}
	}
	l.c, l.ident = c, ident
	l.unwatch = l.watch(c)
	go l.supervise()
	return l, nil
}

// watch marks c broken, and wakes the supervisor, when its transport
// leaves READY. The returned function stops watching.
func (l *link) watch(c *conn.Conn) context.CancelFunc {
	ctx, cancel := context.WithCancel(l.stopCtx)
	go func() {
		// The channel's state can lag behind the call that proved it
		// working: let a CONNECTING at the start settle first.
		s := c.State()
		for s == connectivity.Connecting {
			if !c.WaitForStateChange(ctx, s) {
				return // replaced or shut down
			}
			s = c.State()
		}
		// Then any change away from READY counts: the transport is lost,
		// and a connection never redials.
		if s == connectivity.Ready && !c.WaitForStateChange(ctx, connectivity.Ready) {
			return
		}
		l.mu.Lock()
		if l.c == c { // not already replaced
			l.broken.Store(c)
		}
		l.mu.Unlock()
		l.kick()
	}()
	return cancel
}

func (l *link) kick() {
	select {
	case l.kickc <- struct{}{}:
	default:
	}
}

// current returns the connection, or errReconnecting while there is none
// to use.
func (l *link) current() (*conn.Conn, error) {
	switch HandleState(l.state.Load()) {
	case StateReconnecting:
		return nil, errReconnecting
	case StateClosed:
		return nil, ErrClosed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c, nil
}

// conn returns the connection in use, whatever the state.
func (l *link) conn() *conn.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c
}

// failed reports a call's error: a transport failure makes the link look
// at its server at once.
func (l *link) failed(err error) {
	if errors.Is(err, conn.ErrUnavailable) {
		l.kick()
	}
}

// shutdown stops the supervising goroutine and waits for it; an attach in
// progress is cancelled. The connection stays for the caller to close.
func (l *link) shutdown() {
	if HandleState(l.state.Swap(int32(StateClosed))) != StateClosed {
		l.notifyState()
	}
	l.stop()
	<-l.done
}

func (l *link) supervise() {
	defer close(l.done)
	tick := time.NewTicker(linkCheckInterval)
	defer tick.Stop()
	backoff := time.Duration(0)
	var nextTry time.Time
	for {
		select {
		case <-l.stopCtx.Done():
			return
		case <-tick.C:
		case <-l.kickc:
		}
		switch HandleState(l.state.Load()) {
		case StateClosed: // shut down, and stopCtx about to end: attach nothing
			return
		case StateConnected:
			if !l.lost() || !l.state.CompareAndSwap(int32(StateConnected), int32(StateReconnecting)) {
				continue
			}
			l.notifyState()
			l.log.Warn("UMBP standalone server went away; reconnecting", "endpoint", l.rt.cfg.Endpoint)
			backoff, nextTry = 0, time.Time{}
		}
		if time.Now().Before(nextTry) {
			continue
		}
		if err := l.reattach(); err != nil {
			if l.stopCtx.Err() != nil { // cancelled by shutdown: no failure
				return
			}
			backoff = reconnectPause(backoff)
			nextTry = time.Now().Add(backoff)
			if l.retries.allow() {
				l.log.Warn("UMBP standalone reconnect attempt failed; retrying", "endpoint", l.rt.cfg.Endpoint, "err", err)
			}
			continue
		}
	}
}

// lost reports whether the server the link attached to is gone: its socket
// was replaced or removed, or the transport to it failed (a connection
// never redials: the link is what attaches again).
func (l *link) lost() bool {
	ident, err := statIdent(l.path)
	l.mu.Lock()
	old, c := l.ident, l.c
	l.mu.Unlock()
	return err != nil || ident != old || l.broken.Load() == c
}

// reattach dials the server anew and runs the attach hook on the new
// connection, bounded by StartupTimeout and Timeout; on success the new
// connection replaces the old one.
func (l *link) reattach() error {
	ctx, cancel := context.WithTimeout(l.stopCtx, l.rt.cfg.StartupTimeout+l.rt.cfg.Timeout)
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, reconnectDialTimeout)
	c, err := l.rt.dial(dctx)
	dcancel()
	if err != nil {
		if errors.Is(err, ErrUntrustedServer) && l.refusals.allow() {
			l.log.Warn("refusing the server that took over the UMBP standalone endpoint", "endpoint", l.rt.cfg.Endpoint, "err", err)
		}
		return err
	}
	// The socket's identity after the dial: a server that replaced the one
	// just dialled shows as a change at the next check.
	ident, err := statIdent(l.path)
	if err != nil {
		_ = c.Close()
		return err
	}
	if l.attach != nil {
		if err := l.attach(ctx, c); err != nil {
			l.discard(c)
			return err
		}
	}
	l.mu.Lock()
	if !l.state.CompareAndSwap(int32(StateReconnecting), int32(StateConnected)) { // closed meanwhile
		l.mu.Unlock()
		l.discard(c)
		return ErrClosed
	}
	old := l.c
	l.c, l.ident = c, ident
	l.unwatch()
	l.unwatch = l.watch(c)
	l.mu.Unlock()
	l.reconnects.Add(1)
	l.notifyState()
	l.log.Info("UMBP standalone server is back; reattached", "endpoint", l.rt.cfg.Endpoint, "client_id", c.ClientID())
	if l.release != nil {
		l.release(old)
	}
	return nil
}

// discard drops a connection whose attach did not complete: what it
// registered is deregistered, so that retries leave nothing behind on the
// server.
func (l *link) discard(c *conn.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), discardTimeout)
	defer cancel()
	_ = c.Deregister(ctx)
	_ = c.Close()
}

// notifyState wakes the waiters of waitForStateChange; it runs after every
// change of state.
func (l *link) notifyState() {
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	if l.stateCh != nil {
		close(l.stateCh)
		l.stateCh = nil
	}
}

// waitForStateChange waits until the state differs from from (true) or ctx
// ends first (false).
func (l *link) waitForStateChange(ctx context.Context, from HandleState) bool {
	for {
		// The channel is taken before the state is read: a change after
		// the read closes it.
		l.stateMu.Lock()
		if l.stateCh == nil {
			l.stateCh = make(chan struct{})
		}
		ch := l.stateCh
		l.stateMu.Unlock()
		if HandleState(l.state.Load()) != from {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// capabilities of the current connection.
func (l *link) capabilities() ServerCapabilities { return capabilitiesOf(l.conn().Capabilities()) }

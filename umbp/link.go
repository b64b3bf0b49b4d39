package umbp

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/connectivity"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/loglimit"
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

// link is a handle's supervised attachment to a standalone server: the
// current connection, and the one loop that attaches, at the handle's start
// and again whenever the server goes away (transport failure, or its socket
// file replaced or removed). A connection never redials a lost transport
// (conn.Dial makes one attempt), so every dial is the link's, paced by
// attachPacing. On a new connection the link registers its regions (a
// worker's memory; none for a scheduler) before it swaps the connection in,
// and hands the old one to onReplace.
type link struct {
	cfg       settings
	log       *slog.Logger
	regions   *regionSet           // registered on every new connection; nil: none
	onReplace func(old *conn.Conn) // called once a connection was replaced
	st        connState

	mu    sync.Mutex
	c     *conn.Conn
	ident sockIdent

	refusals loglimit.Limiter
	retries  loglimit.Limiter
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

// newLink attaches to the server, waiting at most StartupTimeout (or until
// ctx ends) for one to answer, registers regions on the connection, and
// starts the supervising goroutine.
func newLink(ctx context.Context, cfg settings, regions *regionSet, onReplace func(*conn.Conn)) (*link, error) {
	l := &link{
		cfg: cfg, log: cfg.Logger, regions: regions, onReplace: onReplace,
		kickc: make(chan struct{}, 1), done: make(chan struct{}),
	}
	l.stopCtx, l.stop = context.WithCancel(context.Background())
	c, ident, err := l.firstAttach(ctx)
	if err != nil {
		l.stop()
		return nil, err
	}
	l.c, l.ident = c, ident
	l.unwatch = l.watch(c)
	go l.supervise()
	return l, nil
}

// firstAttach makes attempts until one attaches, StartupTimeout has passed,
// ctx ends, or the server is refused (it failed the trust check, or is not
// in the mode the config requires): those are not retried.
func (l *link) firstAttach(parent context.Context) (*conn.Conn, sockIdent, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(parent, l.cfg.StartupTimeout)
	defer cancel()
	warned := false
	var last error // the last attempt that was not cut short by the end of the wait
	for pause := time.Duration(0); ; {
		c, ident, err := l.attempt(ctx)
		if err == nil {
			return c, ident, nil
		}
		waited := min(time.Since(start), l.cfg.StartupTimeout).Round(time.Millisecond)
		if final(err) {
			return nil, sockIdent{}, err
		}
		if parent.Err() != nil {
			// The caller's context ended the wait: its doing, not the
			// server's. An attempt that failed before it is said, not
			// wrapped.
			why := fmt.Errorf("the caller's context ended the wait for the server after %v: %w", waited, parent.Err())
			if cause := context.Cause(parent); cause != parent.Err() {
				why = fmt.Errorf("%w (%w)", why, cause)
			}
			if last != nil {
				return nil, sockIdent{}, fmt.Errorf("%w; the attempt before: %v", why, last)
			}
			return nil, sockIdent{}, why
		}
		if ctx.Err() != nil {
			// An attempt the end of the wait cut short says less than
			// the one before it.
			if last == nil || !errors.Is(err, ctx.Err()) {
				last = err
			}
			if errors.Is(last, context.DeadlineExceeded) {
				return nil, sockIdent{}, fmt.Errorf("%w (the wait's end: StartupTimeout, %v)", last, waited)
			}
			return nil, sockIdent{}, fmt.Errorf("%w (the wait's end: StartupTimeout, %v: %w)", last, waited, context.DeadlineExceeded)
		}
		last = err
		if !warned && waited < attachWarnAfter {
			// No socket file at the first attempt: a typo in Endpoint
			// waits as long as a server not started yet; say which path
			// is watched now, not after attachWarnAfter.
			if _, serr := os.Lstat(l.cfg.grpcPath); errors.Is(serr, fs.ErrNotExist) {
				warned = true
				l.log.Warn("no socket file at the endpoint yet: waiting for a server to create it; check Config.Endpoint if none is starting",
					"watching", l.cfg.grpcPath, "startup_timeout", l.cfg.StartupTimeout)
			}
		}
		if !warned && waited >= attachWarnAfter {
			warned = true
			l.log.Warn("still waiting for the UMBP standalone server", "endpoint", l.cfg.Endpoint, "waited", waited, "err", err)
		} else {
			l.log.Debug("waiting for the UMBP standalone server", "endpoint", l.cfg.Endpoint, "err", err)
		}
		pause = attachPacing.Next(pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// final reports whether an attempt's error ends the wait for a server: one
// that failed the trust check, or is not in the mode the config requires.
func final(err error) bool {
	return errors.Is(err, ErrUntrustedServer) || errors.Is(err, errNotDistributed)
}

// attempt dials the server once, bounded by attachAttempt and ctx, checks
// its mode, and registers the link's regions on the new connection. A
// connection whose registration failed is dropped with what it registered.
func (l *link) attempt(ctx context.Context) (*conn.Conn, sockIdent, error) {
	dctx, cancel := context.WithTimeout(ctx, attachAttempt)
	c, err := conn.Dial(dctx, l.cfg.dial)
	cancel()
	if err != nil {
		return nil, sockIdent{}, err
	}
	if err := l.cfg.checkMode(c); err != nil {
		_ = c.Close()
		return nil, sockIdent{}, err
	}
	// The socket's identity after the dial: a server that replaced the one
	// just dialled shows as a change at the next check.
	ident, err := statIdent(l.cfg.grpcPath)
	if err != nil {
		_ = c.Close()
		return nil, sockIdent{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if l.regions != nil {
		// Registration is bounded by Timeout, beside the dial's bound.
		rctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
		err := l.regions.registerAll(rctx, c)
		cancel()
		if err != nil {
			l.discard(c)
			return nil, sockIdent{}, err
		}
	}
	return c, ident, nil
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
	switch l.st.get() {
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
	if errors.Is(err, errdefs.ErrUnavailable) {
		l.kick()
	}
}

// shutdown stops the supervising goroutine and waits for it; an attach in
// progress is cancelled. The connection stays for the caller to close.
func (l *link) shutdown() {
	l.st.close()
	l.stop()
	<-l.done
}

// supervise looks at the server every linkCheckInterval (and at once when a
// call saw the transport fail); once it is gone, it attaches again, one
// attempt at a time, paced by attachPacing, until one succeeds or the link
// is shut down.
func (l *link) supervise() {
	defer close(l.done)
	tick := time.NewTicker(linkCheckInterval)
	defer tick.Stop()
	var pause time.Duration
	var nextTry time.Time
	for {
		select {
		case <-l.stopCtx.Done():
			return
		case <-tick.C:
		case <-l.kickc:
		}
		switch l.st.get() {
		case StateClosed: // shut down, and stopCtx about to end: attach nothing
			return
		case StateConnected:
			if !l.lost() || !l.st.move(StateConnected, StateReconnecting) {
				continue
			}
			l.log.Warn("UMBP standalone server went away; reconnecting", "endpoint", l.cfg.Endpoint)
			pause, nextTry = 0, time.Time{}
		}
		if time.Now().Before(nextTry) {
			continue
		}
		if err := l.reattach(); err != nil {
			if l.stopCtx.Err() != nil { // cancelled by shutdown: no failure
				return
			}
			pause = attachPacing.Next(pause)
			nextTry = time.Now().Add(pause)
			if errors.Is(err, ErrUntrustedServer) {
				if l.refusals.Allow(failureLogInterval) {
					l.log.Warn("refusing the server that took over the UMBP standalone endpoint", "endpoint", l.cfg.Endpoint, "err", err)
				}
			} else if l.retries.Allow(failureLogInterval) {
				l.log.Warn("UMBP standalone reconnect attempt failed; retrying", "endpoint", l.cfg.Endpoint, "err", err)
			}
		}
	}
}

// lost reports whether the server the link attached to is gone: its socket
// was replaced or removed, or the transport to it failed (a connection
// never redials: the link is what attaches again).
func (l *link) lost() bool {
	ident, err := statIdent(l.cfg.grpcPath)
	l.mu.Lock()
	old, c := l.ident, l.c
	l.mu.Unlock()
	return err != nil || ident != old || l.broken.Load() == c
}

// reattach makes one attempt; on success the new connection replaces the
// old one, which goes to onReplace.
func (l *link) reattach() error {
	c, ident, err := l.attempt(l.stopCtx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	if !l.st.move(StateReconnecting, StateConnected) { // closed meanwhile
		l.mu.Unlock()
		l.discard(c)
		return ErrClosed
	}
	old := l.c
	l.c, l.ident = c, ident
	l.unwatch()
	l.unwatch = l.watch(c)
	l.mu.Unlock()
	l.log.Info("UMBP standalone server is back; reattached", "endpoint", l.cfg.Endpoint, "client_id", c.ClientID())
	if l.onReplace != nil {
		l.onReplace(old)
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

// capabilities of the current connection.
func (l *link) capabilities() ServerCapabilities { return capabilitiesOf(l.conn().Capabilities()) }

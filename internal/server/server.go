package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

const (
	// gracePeriod bounds GracefulStop before Close falls back to Stop.
	gracePeriod = 3 * time.Second
	// drainTimeout bounds the wait for ops to end before memory is unmapped;
	// past it the memory is leaked rather than unmapped under a running copy.
	drainTimeout = 10 * time.Second
	// maxFDConns bounds fd-handoff connections served at once.
	maxFDConns = 16
)

// Server is a running umbp standalone server on two Unix sockets.
type Server struct {
	opts     Options
	log      *slog.Logger
	version  int
	gpu      GPUBackend
	grpcPath string
	fdPath   string

	grpcSock *socket
	fdSock   *socket
	gs       *grpc.Server

	pool   *pool
	regs   *regionTable
	ops    *opTracker
	pinned bool

	ctx    context.Context // ends when Close begins
	cancel context.CancelFunc
	wg     sync.WaitGroup // Serve, the fd accept loop and its handlers

	fdMu    sync.Mutex
	fdConns map[*net.UnixConn]struct{}
	fdDone  bool

	fdHandoffs   atomic.Uint64
	fdRejected   atomic.Uint64
	fdRegistered atomic.Uint64

	// hostCopyHook, set only by tests, runs before a request's host copies.
	hostCopyHook atomic.Pointer[func()]

	closeOnce sync.Once
	closeErr  error
}

// ErrEndpointInUse refuses to start on an endpoint where a live server
// answers; the error names that server and the socket. Options.Replace
// takes its sockets over instead.
var ErrEndpointInUse = errors.New("server: a live server answers on the endpoint")

// New validates opts, creates both sockets (parent directories 0700, sockets
// 0600) and starts serving. It returns once both sockets listen. A socket
// left at either path by a server that is gone is replaced; one where a live
// server accepts connections is an error matching ErrEndpointInUse, unless
// Options.Replace is set. Anything else at either path (a file, a
// directory, a link) is a *NotSocketError, Replace or not, and is left as
// it is: the server removes only sockets.
func New(opts Options) (*Server, error) {
	if opts.Endpoint == "" {
		return nil, errors.New("server: Endpoint is required")
	}
	grpcPath, fdPath, err := fdpass.SocketPaths(opts.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	version := opts.Version
	switch version {
	case 0:
		version = 2
	case 1, 2:
	default:
		return nil, fmt.Errorf("server: Version %d: want 1 or 2", opts.Version)
	}
	if opts.Capacity == 0 {
		opts.Capacity = DefaultCapacity
	}
	if opts.FDReceiveTimeout <= 0 {
		opts.FDReceiveTimeout = DefaultFDReceiveTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		opts:     opts,
		log:      log,
		version:  version,
		grpcPath: grpcPath,
		fdPath:   fdPath,
		ops:      newOpTracker(),
		fdConns:  make(map[*net.UnixConn]struct{}),
	}
	if version >= 2 {
		s.gpu = opts.GPU
	}
	// Both paths are examined before anything is created or removed: a
	// start that fails leaves both as they were.
	var old [2]os.FileInfo
	for i, path := range []string{grpcPath, fdPath} {
		if old[i], err = checkPath(path, opts.Replace, log); err != nil {
			return nil, err
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())

	if s.pool, err = newPool(opts.Capacity, opts.Prefault, log); err != nil {
		s.cancel()
		return nil, err
	}
	s.regs = newRegionTable(log, s.gpu)
	if s.gpu != nil {
		if err := s.gpu.Pin(s.pool.base(), uint64(len(s.pool.arena))); err != nil {
			log.Warn("umbp server: cannot pin the DRAM pool; GPU copies use pageable memory", "err", err)
		} else {
			s.pinned = true
		}
	}
	fail := func(err error) (*Server, error) {
		s.cancel()
		if s.grpcSock != nil {
			s.grpcSock.close()
		}
		if s.fdSock != nil {
			s.fdSock.close()
		}
		s.releaseMemory()
		return nil, err
	}
	if s.grpcSock, err = listen(grpcPath, old[0]); err != nil {
		return fail(err)
	}
	if s.fdSock, err = listen(fdPath, old[1]); err != nil {
		return fail(err)
	}

	gopts := []grpc.ServerOption{
		// Plaintext as before; records each connection's SO_PEERCRED.
		grpc.Creds(peerCreds{wrap: opts.WrapConn}),
		grpc.MaxRecvMsgSize(rpc.MaxMessageSize),
		grpc.MaxSendMsgSize(rpc.MaxMessageSize),
		// Calls are served by a fixed set of goroutines rather than one
		// new goroutine each: with MORI's C++ client, lookups of 1 and 64
		// keys answered 8% and 14% sooner (medians of 5 rounds alternated
		// with the plain server; shared write buffers, grpc-go's default
		// now, were on in both).
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		// Batches' and lookups' keys decoded with one copy for all.
		grpc.ForceServerCodecV2(newRequestCodec()),
	}
	if opts.UnaryInterceptor != nil {
		gopts = append(gopts, grpc.UnaryInterceptor(opts.UnaryInterceptor))
	}
	s.gs = grpc.NewServer(gopts...)
	umbppb.RegisterUMBPStandaloneServer(s.gs, &service{s: s})

	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.gs.Serve(s.grpcSock.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("umbp server: gRPC serve ended", "err", err)
		}
	}()
	go s.acceptFD()
	s.log.Info("umbp server: listening", "endpoint", s.Endpoint(), "fd_socket", fdPath,
		"capacity", opts.Capacity, "version", version, "ranged_io", s.rangedIO())
	return s, nil
}

// Endpoint is the gRPC address, "unix:///abs/path".
func (s *Server) Endpoint() string { return "unix://" + s.grpcPath }

// FDSocketPath is the fd-handoff socket's path.
func (s *Server) FDSocketPath() string { return s.fdPath }

// rangedIO is what Ping reports as supports_ranged_io.
func (s *Server) rangedIO() bool { return s.version >= 2 && !s.opts.DisableRangedIO }

// Stats returns a snapshot of the server's state.
func (s *Server) Stats() Stats {
	var st Stats
	s.pool.stats(&st)
	s.regs.stats(&st)
	st.FDHandoffs = s.fdHandoffs.Load()
	st.FDRejected = s.fdRejected.Load()
	st.FDRegistered = s.fdRegistered.Load()
	return st
}

// Close stops the server: calls arriving from now on answer "server is
// shutting down", calls in flight finish (gRPC's graceful stop, forced after
// a few seconds), the sockets are unlinked, and every region and the pool
// are unmapped once no op uses them. It is idempotent and leaves no goroutine
// behind.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Server) close() error {
	s.ops.shutdown()
	s.cancel()
	var errs []error
	if err := s.fdSock.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, fmt.Errorf("server: close fd socket: %w", err))
	}
	s.expireFDConns()

	stopped := make(chan struct{})
	go func() {
		s.gs.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(gracePeriod)
	select {
	case <-stopped:
	case <-t.C:
		s.log.Warn("umbp server: calls still running after the grace period; stopping them")
		s.gs.Stop()
		<-stopped
	}
	t.Stop()
	s.wg.Wait()

	s.grpcSock.close()
	s.fdSock.close()

	if !s.ops.wait(drainTimeout) {
		s.log.Error("umbp server: data operations still running; leaving their memory mapped")
		return errors.Join(append(errs, errors.New("server: operations still running at close; memory left mapped"))...)
	}
	if err := s.releaseMemory(); err != nil {
		errs = append(errs, err)
	}
	s.log.Info("umbp server: closed", "endpoint", s.Endpoint())
	return errors.Join(errs...)
}

// releaseMemory drops every region and unmaps the pool.
func (s *Server) releaseMemory() error {
	s.regs.closeAll()
	s.regs.wait()
	s.regs.waitWatchers()
	if s.pinned {
		if err := s.gpu.Unpin(s.pool.base()); err != nil {
			s.log.Warn("umbp server: unpin the DRAM pool", "err", err)
		}
		s.pinned = false
	}
	return s.pool.close()
}

// socket is a listening Unix socket whose path this server created.
type socket struct {
	path string
	ln   *net.UnixListener
	info os.FileInfo // the socket file, to unlink only our own
}

// probeTimeout bounds the connection that tells a live socket from a stale one.
const probeTimeout = time.Second

// NotSocketError refuses a socket path where something other than a
// socket stands. The server leaves it as it is: it removes only a socket,
// and only one no server listens on (or, with Options.Replace, a live
// server's).
type NotSocketError struct {
	// Path is the socket path.
	Path string
	// What says what stands there: "a regular file of 10 bytes", "an empty
	// directory", "a directory of 3 entries", "a symbolic link to …".
	What string
}

func (e *NotSocketError) Error() string {
	return fmt.Sprintf("server: %s is %s, not a socket; the server replaces only a socket that no server listens on, and left it as it is", e.Path, e.What)
}

// describe says what fi, found at path by Lstat, is.
func describe(path string, fi os.FileInfo) string {
	switch m := fi.Mode(); {
	case m.IsRegular():
		return fmt.Sprintf("a regular file of %d bytes", fi.Size())
	case m.IsDir():
		f, err := os.Open(path)
		if err != nil {
			return "a directory"
		}
		names, _ := f.Readdirnames(-1)
		_ = f.Close()
		switch len(names) {
		case 0:
			return "an empty directory"
		case 1:
			return "a directory of 1 entry"
		}
		return fmt.Sprintf("a directory of %d entries", len(names))
	case m&os.ModeSymlink != 0:
		if to, err := os.Readlink(path); err == nil {
			return fmt.Sprintf("a symbolic link to %s", to)
		}
		return "a symbolic link"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return fmt.Sprintf("a file of mode %v", fi.Mode())
}

// checkPath examines what stands at path before the server takes it.
// Nothing: (nil, nil). A socket no server listens on, left by a server that
// is gone: its FileInfo, for listen to replace. A socket a live server
// accepts connections on: ErrEndpointInUse naming that server (its pid when
// the kernel tells it), or with replace its FileInfo, logged. Anything
// else: a *NotSocketError.
func checkPath(path string, replace bool, log *slog.Logger) (os.FileInfo, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("server: socket path: %w", err)
	case fi.Mode().Type() != os.ModeSocket:
		return nil, &NotSocketError{Path: path, What: describe(path, fi)}
	}
	c, err := net.DialTimeout("unix", path, probeTimeout)
	switch {
	case err == nil:
	case errors.Is(err, syscall.ECONNREFUSED):
		return fi, nil // stale: its server is gone
	case errors.Is(err, os.ErrNotExist):
		return nil, nil // removed meanwhile
	case errors.Is(err, syscall.EAGAIN):
		// A full accept queue: a live server that is not keeping up.
	default:
		return nil, fmt.Errorf("server: cannot tell whether a server still answers on %s: %w", path, err)
	}
	who := "a server"
	if c != nil {
		if cred, err := peerCred(c.(*net.UnixConn)); err == nil {
			who = fmt.Sprintf("a server (pid %d, uid %d)", cred.Pid, cred.Uid)
		}
		_ = c.Close()
	}
	if replace {
		log.Warn("umbp server: replacing the sockets of a live server", "path", path, "server", who)
		return fi, nil
	}
	return nil, fmt.Errorf("%w: %s accepts connections on %s", ErrEndpointInUse, who, path)
}

// listen creates a Unix socket at path: parent directories 0700, the socket
// chmod 0600. old is what checkPath found there: nil for nothing, else the
// socket to replace, which is removed only if it is still that socket.
func listen(path string, old os.FileInfo) (*socket, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("server: create the socket directory: %w", err)
	}
	if old != nil {
		cur, err := os.Lstat(path)
		switch {
		case err == nil && !os.SameFile(cur, old):
			return nil, fmt.Errorf("server: %s changed while the server started; left as it is", path)
		case err == nil:
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("server: remove the old socket: %w", err)
			}
		case !errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("server: socket path: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		_ = os.Remove(path)
		return nil, fmt.Errorf("server: chmod the socket: %w", err)
	}
	info, err := os.Lstat(path)
	if err != nil {
		_ = ln.Close()
		_ = os.Remove(path)
		return nil, fmt.Errorf("server: stat the socket: %w", err)
	}
	return &socket{path: path, ln: ln, info: info}, nil
}

// close closes the listener and unlinks the path if it is still this
// socket (another server may have taken the path over).
func (k *socket) close() {
	_ = k.ln.Close()
	if cur, err := os.Lstat(k.path); err == nil && os.SameFile(cur, k.info) {
		_ = os.Remove(k.path)
	}
}

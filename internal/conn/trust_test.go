package conn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/internal/server"
)

// foreignUID is the uid the impostor servers run as (nobody).
const foreignUID = 65534

// serveEnv, when set in the environment, makes the test binary a server on
// the endpoint it names instead of running tests: the impostor that
// startForeign runs under another uid. It exits when its stdin closes, or
// when killed.
const serveEnv = "UMBP_CONN_TEST_SERVE"

func init() {
	if ep := os.Getenv(serveEnv); ep != "" {
		os.Exit(serveForeign(ep))
	}
}

func serveForeign(endpoint string) int {
	_, err := server.New(server.Options{
		Endpoint: endpoint,
		Capacity: 1 << 20,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	fmt.Println("listening")
	// Serve until the test process is gone.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// quietLog drops the warnings that refused connections log.
var quietLog = slog.New(slog.DiscardHandler)

func quiet(o *Options) { o.Logger = quietLog }

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: the test makes sockets owned by, and servers run as, another uid")
	}
}

// worldDir returns a short temporary directory that any uid may write,
// sticky (as /tmp is), so that a trusted server's socket may be in it.
func worldDir(t *testing.T) string {
	t.Helper()
	dir := shortDir(t)
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	return dir
}

// foreign is a server process, running as foreignUID unless said otherwise.
type foreign struct {
	endpoint         string
	grpcPath, fdPath string
	pid              int
}

// startForeign runs this test binary as a server on dir/n.grpc.sock under
// foreignUID (dir must be writable by it) and waits until it listens. Its
// socket files are owned by foreignUID, mode 0600.
func startForeign(t *testing.T, dir string) *foreign {
	t.Helper()
	requireRoot(t)
	return startServerProcess(t, dir, foreignUID)
}

// startServerProcess starts a server process on dir, running as uid, or
// as this process's user when uid is -1.
func startServerProcess(t *testing.T, dir string, uid int) *foreign {
	t.Helper()
	grpcPath := filepath.Join(dir, "n.grpc.sock")
	_, fdPath, err := fdpass.SocketPaths(grpcPath)
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + grpcPath
	// /proc/self/exe, opened by the child, is this binary even where the
	// directories on its path are closed to foreignUID.
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+endpoint)
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)},
		}
	}
	// Its stdin is a pipe that closes when this process exits: then it
	// exits too.
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a server as uid %d: %v", uid, err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		// Killed: a graceful exit of a race-enabled binary pauses a second.
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	t.Cleanup(stop)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "listening\n" {
		stop()
		t.Fatalf("server as uid %d did not start: %q %v; stderr: %s", uid, line, err, stderr.String())
	}
	return &foreign{endpoint: endpoint, grpcPath: grpcPath, fdPath: fdPath, pid: cmd.Process.Pid}
}

// chownRoot makes the foreign server's socket files root's, so that only
// the peer rule can tell.
func (f *foreign) chownRoot(t *testing.T) {
	t.Helper()
	for _, p := range []string{f.grpcPath, f.fdPath} {
		if err := os.Chown(p, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// wantUntrusted fails unless err wraps ErrUntrustedServer and says each of
// parts.
func wantUntrusted(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrUntrustedServer) {
		t.Fatalf("%s: %v, want errdefs.ErrUntrustedServer", what, err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: %q does not say %q", what, err, p)
		}
	}
}

func mustTrust(t *testing.T, extra ...int) *Trust {
	t.Helper()
	tr, err := NewTrust(extra)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// listenAt listens on a Unix socket at path, closed at cleanup.
func listenAt(t *testing.T, path string) *net.UnixListener {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestTrustFileRules(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "s.sock")
	listenAt(t, sock)
	tr := mustTrust(t)
	self := strconv.Itoa(os.Getuid())

	if err := os.Chmod(sock, 0o660); err != nil {
		t.Fatal(err)
	}
	if err := tr.checkFile(sock); err != nil {
		t.Fatalf("own socket, mode 0660: %v", err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, "mode 0666", tr.checkFile(sock), sock, "writable by others (mode 0666)")
	if err := os.Chmod(sock, 0o602); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, "mode 0602", tr.checkFile(sock), "writable by others (mode 0602)")
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, "regular file", tr.checkFile(file), file, "is not a socket")

	missing := filepath.Join(dir, "missing.sock")
	if err := tr.checkFile(missing); !errors.Is(err, os.ErrNotExist) || errors.Is(err, errdefs.ErrUntrustedServer) {
		t.Fatalf("missing socket: %v, want ErrNotExist only", err)
	}
	if err := tr.checkFilesIfPresent(missing, sock); err != nil {
		t.Fatalf("checkFilesIfPresent: %v", err)
	}

	// A symbolic link is judged by its owner and its target.
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	if err := tr.checkFile(link); err != nil {
		t.Fatalf("link to a good socket: %v", err)
	}
	fileLink := filepath.Join(dir, "file.sock")
	if err := os.Symlink(file, fileLink); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, "link to a file", tr.checkFile(fileLink), "is not a socket")

	if os.Getuid() != 0 {
		t.Log("not root: the owner rules are not tested")
		return
	}
	foreign := strconv.Itoa(foreignUID)
	if err := os.Chown(sock, foreignUID, foreignUID); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, "foreign owner", tr.checkFile(sock), sock, "owned by uid "+foreign, "this user (uid "+self+") or root")
	wantUntrusted(t, "link to a foreign socket", tr.checkFile(link), "owned by uid "+foreign)
	wantUntrusted(t, "checkFilesIfPresent", tr.checkFilesIfPresent(missing, sock), "owned by uid "+foreign)
	allowed := mustTrust(t, foreignUID)
	if err := allowed.checkFile(sock); err != nil {
		t.Fatalf("socket owned by a trusted uid: %v", err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, "trusted owner, mode 0666", allowed.checkFile(sock), "writable by others")
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sock, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, foreignUID, foreignUID); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, "foreign link", tr.checkFile(link), link, "symbolic link owned by uid "+foreign)
	if err := allowed.checkFile(link); err != nil {
		t.Fatalf("link owned by a trusted uid: %v", err)
	}
}

func TestTrustedUIDsValidated(t *testing.T) {
	for _, uids := range [][]int{{-1}, {1<<32 - 1}, {0, 1 << 40}} {
		_, err := NewTrust(uids)
		if !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("TrustedUIDs %v: %v, want rpc.ErrInvalidArgument", uids, err)
		}
	}
	tr := mustTrust(t, 0, os.Getuid(), 7, 7, 3)
	if fmt.Sprint(tr.extra) != "[3 7]" {
		t.Fatalf("extra uids %v", tr.extra)
	}
	if !strings.Contains(tr.who(), "a trusted uid (3, 7)") {
		t.Fatalf("who: %s", tr.who())
	}
}

func TestTrustPeerRule(t *testing.T) {
	// A server of this process passes.
	own := filepath.Join(shortDir(t), "s.sock")
	l := listenAt(t, own)
	go func() {
		c, err := l.Accept()
		if err == nil {
			_ = c.Close()
		}
	}()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: own, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := mustTrust(t).checkPeer(own, c); err != nil {
		t.Fatalf("own server: %v", err)
	}

	f := startForeign(t, worldDir(t))
	fc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: f.grpcPath, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	wantUntrusted(t, "foreign server", mustTrust(t).checkPeer(f.grpcPath, fc),
		fmt.Sprintf("peer process pid %d on socket %s runs as uid %d", f.pid, f.grpcPath, foreignUID))
	if err := mustTrust(t, foreignUID).checkPeer(f.grpcPath, fc); err != nil {
		t.Fatalf("foreign server, trusted uid: %v", err)
	}
}

func TestDialRefusesWritableSocket(t *testing.T) {
	for _, which := range []string{"grpc", "fd"} {
		t.Run(which, func(t *testing.T) {
			f := startFake(t)
			grpcPath, fdPath, _ := fdpass.SocketPaths(f.endpoint)
			path := map[string]string{"grpc": grpcPath, "fd": fdPath}[which]
			if err := os.Chmod(path, 0o666); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			c, err := Dial(context.Background(), Options{Endpoint: f.endpoint, Logger: quietLog})
			if err == nil {
				_ = c.Close()
			}
			wantUntrusted(t, "Dial", err, path, "writable by others (mode 0666)")
			if errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("%v also wraps errdefs.ErrUnavailable", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("Dial took %v", d)
			}
			if calls := f.take(); len(calls) != 0 {
				t.Fatalf("the server saw %v", calls)
			}
		})
	}
}

func TestDialRefusesForeignServer(t *testing.T) {
	requireRoot(t)
	f := startForeign(t, worldDir(t))
	dial := func() error {
		c, err := Dial(context.Background(), Options{Endpoint: f.endpoint, Logger: quietLog})
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	// Its sockets are its own.
	wantUntrusted(t, "Dial, foreign sockets", dial(), fmt.Sprintf("socket %s is owned by uid %d, not this user", f.grpcPath, foreignUID))

	// Sockets owned by root, served by foreignUID: the transport's dialer
	// refuses the connection, and Dial says so at once.
	f.chownRoot(t)
	start := time.Now()
	wantUntrusted(t, "Dial, foreign peer", dial(), fmt.Sprintf("peer process pid %d on socket %s runs as uid %d", f.pid, f.grpcPath, foreignUID))
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Dial took %v", d)
	}
}

func TestDialTrustedUID(t *testing.T) {
	requireRoot(t)
	f := startForeign(t, worldDir(t))
	c := dial(t, f.endpoint, quiet, func(o *Options) { o.Trust = mustTrust(t, foreignUID) })
	fd, mem := memfd(t, 4096)
	ctx := context.Background()
	if err := c.RegisterHost(ctx, fd, addr(mem), 4096); err != nil {
		t.Fatalf("RegisterHost to a trusted uid's server: %v", err)
	}
	if err := c.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRegisterHostRefusesUntrustedFDSocket: the descriptor stays home when
// the fd-handoff socket turns bad after Dial.
func TestRegisterHostRefusesUntrustedFDSocket(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint, quiet)
	if err := os.Chmod(c.FDSocketPath(), 0o666); err != nil {
		t.Fatal(err)
	}
	fd, mem := memfd(t, 4096)
	err := c.RegisterHost(context.Background(), fd, addr(mem), 4096)
	wantUntrusted(t, "RegisterHost", err, "fd handoff", c.FDSocketPath(), "writable by others")
	if regs := f.registrations(); len(regs) != 0 {
		t.Fatalf("the server received %v", regs)
	}
}

// TestServerSwappedAfterDial: a server of another uid that takes over the
// sockets after Dial gets no connection and no descriptor: the Conn does
// not redial its lost transport, and a new Dial refuses the server.
func TestServerSwappedAfterDial(t *testing.T) {
	requireRoot(t)
	f := &fake{dir: worldDir(t)}
	f.serve(t)
	c := dial(t, f.endpoint, quiet)
	f.stop()
	imp := startForeign(t, f.dir)
	imp.chownRoot(t)

	ctx := context.Background()
	if _, err := c.Ping(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Ping: %v, want errdefs.ErrUnavailable", err)
	}
	o := Options{Endpoint: f.endpoint, Logger: quietLog}
	if d, err := Dial(ctx, o); !errors.Is(err, errdefs.ErrUntrustedServer) {
		if d != nil {
			d.Close()
		}
		t.Fatalf("Dial to the impostor: %v, want errdefs.ErrUntrustedServer", err)
	}
	fd, mem := memfd(t, 4096)
	err := c.RegisterHost(ctx, fd, addr(mem), 4096)
	wantUntrusted(t, "RegisterHost", err, fmt.Sprintf("peer process pid %d on socket %s runs as uid %d", imp.pid, imp.fdPath, foreignUID))
}

// strangerTrust returns a policy that does not trust the owner of the
// socket files at paths, and that owner's uid: as root, the files are given
// to foreignUID; as any other user, the policy is that of another user (so
// this user is neither self nor root). Either way the owner rule, and the
// peer rule for a server of this process, are exercised whoever runs the
// suite.
func strangerTrust(t *testing.T, paths ...string) (*Trust, uint32) {
	t.Helper()
	uid := uint32(os.Getuid())
	if uid != 0 {
		return &Trust{self: uid + 1}, uid
	}
	for _, p := range paths {
		if err := os.Chown(p, foreignUID, foreignUID); err != nil {
			t.Fatal(err)
		}
	}
	return mustTrust(t), foreignUID
}

// TestTrustOwnerRuleAsAnyUser: a socket owned by a uid that is not trusted
// is refused, and a trusted uid added to the policy is accepted, whether or
// not the suite runs as root.
func TestTrustOwnerRuleAsAnyUser(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "s.sock")
	listenAt(t, sock)
	tr, owner := strangerTrust(t, sock)
	who := strconv.FormatUint(uint64(owner), 10)
	wantUntrusted(t, "socket of an untrusted owner", tr.checkFile(sock), sock, "owned by uid "+who, "not this user")
	wantUntrusted(t, "checkFilesIfPresent", tr.checkFilesIfPresent(filepath.Join(dir, "missing.sock"), sock), "owned by uid "+who)
	widened := *tr
	widened.extra = []uint32{owner}
	if err := widened.checkFile(sock); err != nil {
		t.Fatalf("socket of a trusted uid: %v", err)
	}
}

// TestDialRefusesUntrustedOwnerAsAnyUser: Dial refuses a server whose
// sockets belong to an untrusted uid, at once and before any call reaches
// it, whether or not the suite runs as root.
func TestDialRefusesUntrustedOwnerAsAnyUser(t *testing.T) {
	f := startFake(t)
	grpcPath, fdPath, _ := fdpass.SocketPaths(f.endpoint)
	tr, owner := strangerTrust(t, grpcPath, fdPath)
	start := time.Now()
	c, err := Dial(context.Background(), Options{Endpoint: f.endpoint, Logger: quietLog, Trust: tr})
	if err == nil {
		_ = c.Close()
	}
	wantUntrusted(t, "Dial", err, grpcPath, "owned by uid "+strconv.FormatUint(uint64(owner), 10))
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Dial took %v", d)
	}
	if calls := f.take(); len(calls) != 0 {
		t.Fatalf("the server saw %v", calls)
	}
	if os.Getuid() != 0 {
		// The process serving the socket is this one, whose uid the
		// stranger's policy does not trust either.
		conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: grpcPath, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		wantUntrusted(t, "peer of an untrusted uid", tr.checkPeer(grpcPath, conn), fmt.Sprintf("peer process pid %d", os.Getpid()))
	}
}

// A socket in a directory others may write to (and not sticky) is refused,
// for every user, root included: another user could take its name. The
// server's own directories are 0700; a sticky one, as /tmp, is accepted.
func TestTrustDirectoryRule(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "s.sock")
	listenAt(t, sock)
	tr := mustTrust(t)
	for _, tc := range []struct {
		mode os.FileMode
		want string // "" accepted
	}{
		{0o700, ""},
		{0o770, ""}, // a group that shares the server
		{0o777 | os.ModeSticky, ""},
		{0o777, "socket " + sock + " is in directory " + dir + ", which others may write to (mode 0777): another user could replace the socket; make the directory 0700, as the server's own are"},
		{0o703, "which others may write to (mode 0703)"},
	} {
		if err := os.Chmod(dir, tc.mode); err != nil {
			t.Fatal(err)
		}
		err := tr.checkFile(sock)
		if tc.want == "" {
			if err != nil {
				t.Errorf("directory mode %v (uid %d): %v", tc.mode, os.Getuid(), err)
			}
			continue
		}
		wantUntrusted(t, fmt.Sprintf("directory mode %v (uid %d)", tc.mode, os.Getuid()), err, tc.want)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}

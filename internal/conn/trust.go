package conn

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/rpc"
)

// The trusted-server check. Memory is shared with the server by handing it a
// memfd (over the fd-handoff socket) or a GPU IPC handle (over gRPC), so
// before either leaves the process the server must prove to be run by this
// user, root, or a uid the caller trusts explicitly (NewTrust):
//
//   - each socket file (the gRPC socket and the derived fd-handoff socket)
//     must be a socket, owned by a trusted uid and not writable by others
//     (mode&0o002 == 0). A symbolic link at the socket path is followed
//     only when the link itself is owned by a trusted uid; its target must
//     then pass the same rules. Group write permission is allowed, for
//     deployments that share a server through a group. The directory that
//     holds the socket path must not be writable by others either, unless
//     it is sticky (as /tmp is): the same for every user, root included.
//   - the process serving each socket, as the kernel reports it for the
//     connected socket (SO_PEERCRED: the credentials the server had when it
//     called listen), must run as a trusted uid.
//
// The file rules read the path, which may change under them; the peer rule
// reads the connected socket itself, so a swap cannot dodge it.
//
// Dial checks the socket files already present before anything connects,
// and the fd-handoff socket file again once the server is ready. The gRPC
// socket is checked on every connection the transport makes, so a server
// swapped in after Dial cannot slip in: its connection is refused (and
// Dial, while it waits, returns the refusal at once; later the Conn sees
// the server as unavailable). The fd-handoff socket is checked on every
// handoff: its file before connecting, then file and peer on the connected
// socket, before the descriptor is sent. There is no switch to turn the
// check off; trusting more uids is the only way to widen it.

// Trust is the set of uids whose servers may be given memory.
type Trust struct {
	self  uint32   // this process's real uid
	extra []uint32 // the uids NewTrust was given, sorted, without self and root
}

// maxUID is the largest valid uid: (uid_t)-1 means "no uid" to the kernel.
const maxUID = math.MaxUint32 - 1

// NewTrust returns the policy trusting this process's uid, root and extra.
func NewTrust(extra []int) (*Trust, error) {
	t := &Trust{self: uint32(os.Getuid())}
	for _, u := range extra {
		if u < 0 || u > maxUID {
			return nil, fmt.Errorf("%w: trusted uid %d is not a valid uid", rpc.ErrInvalidArgument, u)
		}
		v := uint32(u)
		if v != t.self && v != 0 && !slices.Contains(t.extra, v) {
			t.extra = append(t.extra, v)
		}
	}
	slices.Sort(t.extra)
	return t, nil
}

// trusted reports whether uid may run (or own the socket of) a server.
func (t *Trust) trusted(uid uint32) bool {
	return uid == t.self || uid == 0 || slices.Contains(t.extra, uid)
}

// who names the trusted uids, for error messages.
func (t *Trust) who() string {
	if len(t.extra) == 0 {
		return fmt.Sprintf("this user (uid %d) or root", t.self)
	}
	ids := make([]string, len(t.extra))
	for i, u := range t.extra {
		ids[i] = strconv.FormatUint(uint64(u), 10)
	}
	return fmt.Sprintf("this user (uid %d), root or a trusted uid (%s)", t.self, strings.Join(ids, ", "))
}

// untrusted returns an error wrapping ErrUntrustedServer.
func untrusted(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrUntrustedServer, fmt.Sprintf(format, args...))
}

// checkFile applies the socket-file rules to path. An error that does not
// wrap ErrUntrustedServer means the file could not be examined (it is
// missing, say); it wraps the os error.
func (t *Trust) checkFile(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		if !t.trusted(st.Uid) {
			return untrusted("socket path %s is a symbolic link owned by uid %d, not %s", path, st.Uid, t.who())
		}
		if err := unix.Stat(path, &st); err != nil {
			return &os.PathError{Op: "stat", Path: path, Err: err}
		}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return untrusted("%s is not a socket (%v)", path, fileMode(st.Mode))
	}
	if !t.trusted(st.Uid) {
		return untrusted("socket %s is owned by uid %d, not %s", path, st.Uid, t.who())
	}
	if st.Mode&0o002 != 0 {
		return untrusted("socket %s is writable by others (mode %04o)", path, st.Mode&0o7777)
	}
	// Its directory: one others may write to, without the sticky bit
	// that keeps them from renaming what is not theirs, lets them take
	// the socket's name away from the server. For every user, root too.
	dir := filepath.Dir(path)
	var ds unix.Stat_t
	if err := unix.Stat(dir, &ds); err != nil {
		return &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	if ds.Mode&0o002 != 0 && ds.Mode&unix.S_ISVTX == 0 {
		return untrusted("socket %s is in directory %s, which others may write to (mode %04o): another user could replace the socket; make the directory 0700, as the server's own are", path, dir, ds.Mode&0o7777)
	}
	return nil
}

// checkPeer applies the peer rule to c, connected to the socket at path.
func (t *Trust) checkPeer(path string, c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return untrusted("socket %s: cannot read the server's credentials: %v", path, err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		credErr = err
	}
	if credErr != nil {
		return untrusted("socket %s: cannot read the server's credentials: %v", path, credErr)
	}
	if !t.trusted(cred.Uid) {
		return untrusted("peer process pid %d on socket %s runs as uid %d, not %s", cred.Pid, path, cred.Uid, t.who())
	}
	return nil
}

// checkConn applies both rules to c, just connected to the socket at path:
// the file first, then the process serving it.
func (t *Trust) checkConn(path string, c *net.UnixConn) error {
	if err := t.checkFile(path); err != nil {
		return err
	}
	return t.checkPeer(path, c)
}

// checkFilesIfPresent applies the socket-file rules to every path that can
// be examined and returns the first violation; a socket that is missing (or
// otherwise out of reach) is left to the connection attempts that follow.
func (t *Trust) checkFilesIfPresent(paths ...string) error {
	for _, p := range paths {
		if err := t.checkFile(p); errors.Is(err, errdefs.ErrUntrustedServer) {
			return err
		}
	}
	return nil
}

// fileMode converts a stat mode to an os.FileMode, for messages.
func fileMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= os.ModeDir
	case unix.S_IFLNK:
		mode |= os.ModeSymlink
	case unix.S_IFIFO:
		mode |= os.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= os.ModeSocket
	case unix.S_IFCHR:
		mode |= os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		mode |= os.ModeDevice
	}
	return mode
}

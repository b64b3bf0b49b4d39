package fdpass

import (
	"fmt"
	"strings"
)

// MaxSocketPath is the longest socket path that fits sun_path with its NUL.
const MaxSocketPath = 107

// SocketPaths returns the gRPC socket path and the fd-handoff socket path of
// a server endpoint. The endpoint is a socket path, optionally prefixed with
// "unix://" or "unix:". The fd path is derived, never configured: a trailing
// ".grpc.sock" becomes ".fd.sock", any other path gets ".fd.sock" appended.
// Both paths must be absolute and fit a Unix socket address.
func SocketPaths(endpoint string) (grpcPath, fdPath string, err error) {
	p := endpoint
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = p[len("unix://"):]
	case strings.HasPrefix(p, "unix:"):
		p = p[len("unix:"):]
	}
	if !strings.HasPrefix(p, "/") {
		return "", "", fmt.Errorf("endpoint %q: socket path must be absolute", endpoint)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", "", fmt.Errorf("endpoint %q: socket path contains a NUL byte", endpoint)
	}
	if base, ok := strings.CutSuffix(p, ".grpc.sock"); ok {
		fdPath = base + ".fd.sock"
	} else {
		fdPath = p + ".fd.sock"
	}
	for _, s := range []string{p, fdPath} {
		if len(s) > MaxSocketPath {
			return "", "", fmt.Errorf("endpoint %q: socket path %q is %d bytes, at most %d fit a Unix socket address", endpoint, s, len(s), MaxSocketPath)
		}
	}
	return p, fdPath, nil
}

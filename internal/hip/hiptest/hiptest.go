// Package hiptest builds the fake GPU runtime (internal/hip/testdata/fakegpu.c)
// for tests of packages that use internal/hip: a shared library exporting the
// HIP or CUDA entry points over host memory, which hip.Open loads like the
// real runtime. See the C file for what it checks.
package hiptest

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Source returns the path of the fake runtime's C source, or "" when it is
// not on this machine (a test binary copied elsewhere).
func Source() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	src := filepath.Join(filepath.Dir(file), "..", "testdata", "fakegpu.c")
	if _, err := os.Stat(src); err != nil {
		return ""
	}
	return src
}

// BuildFake compiles the fake runtime into a shared library named name in a
// temporary directory of tb and returns its path. defines select the
// flavour: one of -DFAKE_HIP5, -DFAKE_HIP6, -DFAKE_CUDA, plus
// -DFAKE_DEVICES=n or -DFAKE_OMIT_IPC_OPEN. The C compiler is $CC, else gcc.
// It skips tb when there is no compiler or no source, and fails it when the
// build fails.
func BuildFake(tb testing.TB, name string, defines ...string) string {
	tb.Helper()
	src := Source()
	if src == "" {
		tb.Skip("the fake GPU runtime's source is not on this machine")
	}
	cc := strings.Fields(os.Getenv("CC"))
	if len(cc) == 0 {
		cc = []string{"gcc"}
	}
	if _, err := exec.LookPath(cc[0]); err != nil {
		tb.Skipf("no C compiler to build the fake GPU runtime: %v", err)
	}
	out := filepath.Join(tb.TempDir(), name)
	args := append(cc[1:], "-shared", "-fPIC", "-O1", "-pthread", "-Wall", "-Werror", "-o", out, src)
	args = append(args, defines...)
	if b, err := exec.Command(cc[0], args...).CombinedOutput(); err != nil {
		tb.Fatalf("building the fake GPU runtime: %v\n%s", err, b)
	}
	return out
}

// Foreign returns a copy of an IPC handle made by the fake runtime that the
// fake opens as if another process had made it. The fake, like the real
// runtimes, refuses to open a handle of its own process; it tells by the
// process id the handle carries at byte 8, which Foreign changes.
func Foreign(handle []byte) []byte {
	h := append([]byte(nil), handle...)
	if len(h) >= 12 {
		binary.NativeEndian.PutUint32(h[8:], binary.NativeEndian.Uint32(h[8:])+1)
	}
	return h
}

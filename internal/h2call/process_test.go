package h2call

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/server"
)

// serverEnv, set to an endpoint, makes the test binary serve the project's
// Go server there instead of running tests: a server in a process of its
// own, so that what a benchmark measures (time, allocations, garbage
// collection) is the client's alone, as against a real server.
const serverEnv = "H2CALL_TEST_SERVER"

// serveUntilStdinCloses serves ep, says "ready" on stdout, and returns
// when stdin closes.
func serveUntilStdinCloses(ep string) {
	srv, err := server.New(server.Options{Endpoint: ep, Capacity: 64 << 20, Logger: slog.New(slog.DiscardHandler), UnaryInterceptor: faultInterceptor})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
}

// standaloneProcess starts the server in a process of its own, with keys
// held-<i> for i < held stored, and returns its gRPC socket's path.
func standaloneProcess(tb testing.TB, held int) string {
	tb.Helper()
	ep := "unix://" + filepath.Join(shortDir(tb), "p.grpc.sock")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), serverEnv+"="+ep)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		tb.Fatalf("the server process said %q, %v", line, err)
	}
	grpcPath, fdPath, _ := fdpass.SocketPaths(ep)
	if held > 0 {
		store(tb, grpcPath, fdPath, held)
	}
	return grpcPath
}

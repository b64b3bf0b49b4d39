package main

import (
	"bytes"
	"context"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs the whole demonstration, small, against the project's
// server as a child process: the round trips must be byte-exact and the
// stop, continue, kill and restart must go as the demo says. Its bounds are
// generous (a busy machine must meet them): what it shows is the order of
// events, not their speed.
func TestDemo(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "umbp-standalone-server")
	if out, err := exec.Command("go", "build", "-C", "../../cmd/umbp-standalone-server", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the server: %v\n%s", err, out)
	}
	srv, err := startProcess(bin, 16*4*1024)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	var out bytes.Buffer
	d := demo{
		blocks: 16, layers: 4, blockBytes: 1024,
		lookupTO: 2 * time.Second, timeout: 3 * time.Second,
		log: slog.New(slog.DiscardHandler), out: &out, srv: srv,
	}
	if err := d.run(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"every byte matches engine A's",
		"SIGSTOP to the server",
		"a lookup of 16 keys answered 0 hits",
		"the job stays RUNNING",
		"every key not attempted (ErrNotAttempted: true)",
		"the blocked store ended COMPLETED",
		"lookups hit again (16 of 16) and engine B's next load is byte-exact",
		"SIGKILL to the server",
		"the handles noticed (WaitForStateChange): engine A reconnecting, engine B reconnecting, scheduler reconnecting",
		"not attempted (ErrNotAttempted: true)",
		"WaitForStateChange: engine A connected, engine B connected, scheduler connected",
		"a lookup: 0 of 16 blocks",
		"the same handles stored 16 blocks again and engine B's load is byte-exact",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo did not say %q:\n%s", want, out.String())
		}
	}
}

package umbp_test

import (
	"testing"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// TestStagingPreparedAtRegistration: on a server without ranged I/O, a
// handle whose layout makes multi-range blocks registers its staging buffer
// when it registers its memory, so the first staged store registers
// nothing on the engine's step.
func TestStagingPreparedAtRegistration(t *testing.T) {
	srv := newServer(t, umbptest.Options{Version: 1})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 4, 8, 1024) // four layers: four ranges a block
	if n := srv.Calls(umbptest.FDHandoff); n != 2 {
		t.Fatalf("%d fd handoffs at registration, want 2 (the KV buffer and a staging buffer)", n)
	}
	// The server has written every part of the staging buffer once.
	if put, get := srv.Calls("BatchPut"), srv.Calls("BatchGet"); put != 1 || get != 1 {
		t.Fatalf("%d BatchPut and %d BatchGet calls at registration, want 1 and 1 (the warm-up)", put, get)
	}
	plans := e.plans(t, "first", 0, 1, 2, 3, 4, 5, 6, 7)
	e.fill(plans, 7)
	job := e.w.Store(plans)
	waitJob(t, e.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("first staged store: %s %v", job.Status(), job.Err())
	}
	if n := srv.Calls(umbptest.FDHandoff); n != 2 {
		t.Fatalf("%d fd handoffs after the first staged store, want still 2", n)
	}

	// A warm-up that fails without an answer sets its buffer aside until
	// its server process has exited: the server may still be writing into
	// it. This server is in this process, so it stays aside; the first
	// staged transfer makes another (a server in another process:
	// TestStagingBufferBackOnceServerExits).
	srv4 := newServer(t, umbptest.Options{Version: 1})
	srv4.FailNext("BatchGet", 1)
	e4 := newEngine(t, newRuntime(t, testConfig(t, srv4.Endpoint())), 4, 8, 1024)
	job = e4.w.Store(e4.plans(t, "after-failed-warm-up", 0))
	waitJob(t, e4.w, job)
	if job.Status() != umbp.JobCompleted {
		t.Fatalf("staged store after a failed warm-up: %s %v", job.Status(), job.Err())
	}
	if n := srv4.Calls(umbptest.FDHandoff); n != 3 {
		t.Fatalf("%d fd handoffs, want 3 (the KV buffer, the failed staging buffer, a new one)", n)
	}

	// A warm-up the server answers without keeping the object (a pool too
	// small for it) leaves nothing in flight: its buffer is used.
	srv5 := newServer(t, umbptest.Options{Version: 1, Capacity: 32 << 10})
	e5 := newEngine(t, newRuntime(t, testConfig(t, srv5.Endpoint())), 4, 8, 1024)
	job = e5.w.Store(e5.plans(t, "after-refused-warm-up", 0))
	waitJob(t, e5.w, job)
	if n := srv5.Calls(umbptest.FDHandoff); n != 2 {
		t.Fatalf("%d fd handoffs, want 2 (the KV buffer and the staging buffer the refused warm-up kept)", n)
	}

	// One range a block: nothing to stage, nothing prepared.
	srv2 := newServer(t, umbptest.Options{Version: 1})
	newEngine(t, newRuntime(t, testConfig(t, srv2.Endpoint())), 1, 8, 1024)
	if n := srv2.Calls(umbptest.FDHandoff); n != 1 {
		t.Fatalf("%d fd handoffs for a one-range layout, want 1", n)
	}
	// A server with ranged I/O needs no staging.
	srv3 := newServer(t, umbptest.Options{})
	newEngine(t, newRuntime(t, testConfig(t, srv3.Endpoint())), 4, 8, 1024)
	if n := srv3.Calls(umbptest.FDHandoff); n != 1 {
		t.Fatalf("%d fd handoffs on a ranged server, want 1", n)
	}
}

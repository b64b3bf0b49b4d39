package umbp_test

import (
	"context"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// stateWatcher is what both handles offer to watch their state.
type stateWatcher interface {
	State() umbp.HandleState
	WaitForStateChange(ctx context.Context, from umbp.HandleState) bool
}

// bound is a deadline for waits that must end on an event; reaching it is a
// failure, not a step of the test.
func bound(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestWaitForStateChangeRestart: a server restart moves both handles from
// connected to reconnecting and, once they have attached to the new server,
// back to connected. Ping is stalled across the restart so that the
// reconnecting state lasts until the test resumes it.
func TestWaitForStateChangeRestart(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	e := newEngine(t, rt, 1, 4, 512)
	h := newScheduler(t, rt)
	ctx := bound(t)
	for _, w := range []stateWatcher{e.w, h} {
		if s := w.State(); s != umbp.StateConnected {
			t.Fatalf("state %s before the restart, want connected", s)
		}
	}
	srv.Stall("Ping")
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, w := range []stateWatcher{e.w, h} {
		if !w.WaitForStateChange(ctx, umbp.StateConnected) {
			t.Fatal("no state change after the server restarted")
		}
		if s := w.State(); s != umbp.StateReconnecting {
			t.Fatalf("state %s after the restart, want reconnecting", s)
		}
		// While the new server does not answer, the state stays.
		done, cancel := context.WithCancel(ctx)
		cancel()
		if w.WaitForStateChange(done, umbp.StateReconnecting) {
			t.Fatalf("WaitForStateChange(ended ctx, reconnecting) = true in state %s", w.State())
		}
	}
	srv.Resume("Ping")
	for _, w := range []stateWatcher{e.w, h} {
		if !w.WaitForStateChange(ctx, umbp.StateReconnecting) {
			t.Fatal("still reconnecting after the server answered again")
		}
		if s := w.State(); s != umbp.StateConnected {
			t.Fatalf("state %s after reconnecting, want connected", s)
		}
	}
	storeLoad(t, e, e, "after", 3, 2)
}

// TestWaitForStateChangeClose: Close wakes a waiter with StateClosed, which
// is final; a state that differs already answers at once, and a wait whose
// ctx ends answers false.
func TestWaitForStateChangeClose(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	rt := newRuntime(t, testConfig(t, srv.Endpoint()))
	ctx := bound(t)
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		w     stateWatcher
		close func() error
	}{{"worker", w, w.Close}, {"scheduler", h, h.Close}} {
		t.Run(tc.name, func(t *testing.T) {
			// A wait that its ctx ends.
			cctx, cancel := context.WithCancel(ctx)
			ended := make(chan bool)
			go func() { ended <- tc.w.WaitForStateChange(cctx, umbp.StateConnected) }()
			cancel()
			if <-ended {
				t.Fatal("WaitForStateChange = true with the handle still connected")
			}

			woke := make(chan bool)
			go func() { woke <- tc.w.WaitForStateChange(ctx, umbp.StateConnected) }()
			if err := tc.close(); err != nil {
				t.Fatal(err)
			}
			if !<-woke {
				t.Fatal("Close did not wake WaitForStateChange")
			}
			if s := tc.w.State(); s != umbp.StateClosed {
				t.Fatalf("state %s after Close, want closed", s)
			}
			if !tc.w.WaitForStateChange(ctx, umbp.StateConnected) {
				t.Fatal("WaitForStateChange(connected) on a closed handle = false")
			}
			done, cancel2 := context.WithCancel(ctx)
			cancel2()
			if tc.w.WaitForStateChange(done, umbp.StateClosed) {
				t.Fatal("WaitForStateChange(closed) ended with a state change")
			}
		})
	}
}

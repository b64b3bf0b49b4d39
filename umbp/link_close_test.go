package umbp

import (
	"log/slog"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// A supervisor that wakes after shutdown marked the link closed, but before
// shutdown stopped it, stops: it never dials (nor re-registers) for a closed
// handle, nor logs a failed reconnect.
func TestLinkSupervisorStopsWhenClosed(t *testing.T) {
	srv := umbptest.NewServer(t, umbptest.Options{Capacity: 1 << 20})
	rt, err := NewStandaloneRuntime(Config{Endpoint: srv.Endpoint(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := newLink(t.Context(), rt.cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		l.shutdown()
		l.unwatch()
		l.discard(l.conn())
	}()
	pings := srv.Calls("Ping")
	// shutdown's first step alone, then a wake-up.
	l.st.st.Store(int32(StateClosed))
	l.kick()
	select {
	case <-l.done:
	case <-time.After(time.Minute):
		t.Fatal("the supervisor of a closed link is still running")
	}
	if n := srv.Calls("Ping") - pings; n != 0 {
		t.Errorf("the supervisor of a closed link dialled the server (%d pings)", n)
	}
}

package umbp

import (
	"context"
	"fmt"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// HandleState is a handle's relation to its server.
type HandleState int32

const (
	// StateConnected: calls go to the server.
	StateConnected HandleState = iota
	// StateReconnecting: the server went away (or was replaced); lookups
	// answer misses and transfers are refused as not attempted, at once,
	// until the handle has attached to the server again and re-registered
	// its memory.
	StateReconnecting
	// StateClosed: the handle was closed.
	StateClosed
)

// String returns "connected", "reconnecting" or "closed".
func (s HandleState) String() string {
	switch s {
	case StateConnected:
		return "connected"
	case StateReconnecting:
		return "reconnecting"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("HandleState(%d)", int32(s))
}

// ServerCapabilities are what the server said of itself when the handle
// last attached.
type ServerCapabilities struct {
	// Ready: the server said it was ready to serve.
	Ready bool
	// RangedIO: the server takes scatter/gather batches (a v2 server with
	// its SSD tier off).
	RangedIO bool
	// Mode is the server's deployment mode, e.g. "STANDALONE_BACKEND_LOCAL".
	Mode string
}

// WaitForStateChange waits until the handle's state differs from from, as
// grpc.ClientConn.WaitForStateChange does: it returns true once State()
// is not from, and false if ctx ends first. A server restart moves a handle
// from StateConnected to StateReconnecting and, once it has attached to the
// new server, back to StateConnected; Close moves it to StateClosed, which
// is final.
//
//	for s := h.State(); s != umbp.StateClosed; s = h.State() {
//		if !h.WaitForStateChange(ctx, s) {
//			break // ctx ended
//		}
//		log.Info("UMBP pool", "state", h.State())
//	}
func (h *SchedulerHandle) WaitForStateChange(ctx context.Context, from HandleState) bool {
	return h.backend.waitForStateChange(ctx, from)
}

// WaitForStateChange waits until the handle's state differs from from, as
// grpc.ClientConn.WaitForStateChange does: it returns true once State()
// is not from, and false if ctx ends first. See
// SchedulerHandle.WaitForStateChange.
func (w *WorkerHandle) WaitForStateChange(ctx context.Context, from HandleState) bool {
	return w.link.waitForStateChange(ctx, from)
}

func capabilitiesOf(caps conn.Capabilities) ServerCapabilities {
	return ServerCapabilities{Ready: caps.Ready, RangedIO: caps.RangedIO, Mode: caps.Mode.String()}
}

package umbp

import "context"

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
	return h.link.waitForStateChange(ctx, from)
}

// WaitForStateChange waits until the handle's state differs from from, as
// grpc.ClientConn.WaitForStateChange does: it returns true once State()
// is not from, and false if ctx ends first. See
// SchedulerHandle.WaitForStateChange.
func (w *WorkerHandle) WaitForStateChange(ctx context.Context, from HandleState) bool {
	return w.link.waitForStateChange(ctx, from)
}

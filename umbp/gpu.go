package umbp

import (
	"context"
	"fmt"
)

// registerGPU registers GPU memory by IPC handle.
func (w *WorkerHandle) registerGPU(ctx context.Context, name string, b Buffer) error {
	_ = ctx
	return fmt.Errorf("GPU buffer %q at %#x: %w: this build registers host memory only", name, b.Ptr, ErrNotSupported)
}

package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/hip"
)

// GPU memory is shared with the server by IPC handle (docs/PROTOCOL.md,
// "Registering GPU memory"). A handle names a whole allocation and opens to
// its base, so the handle registers the whole allocation that holds a
// buffer, once, as one region (worker_base = allocation base, ipc_offset 0):
// every buffer inside it, and every range of a plan, resolves into that
// region. Device memory stays the engine's: the handle never frees it.

// gpuLoader loads the GPU runtime: hip.Load, or what a test put there.
var gpuLoader = struct {
	mu   sync.Mutex
	load func() (*hip.Runtime, error)
}{load: hip.Load}

// loadGPU returns the process's GPU runtime, or an error wrapping
// ErrNotSupported that says why none loaded, in one line; what each
// library tried gave goes to log at debug level.
func loadGPU(log *slog.Logger) (*hip.Runtime, error) {
	gpuLoader.mu.Lock()
	load := gpuLoader.load
	gpuLoader.mu.Unlock()
	rt, err := load()
	if err != nil {
		var le *hip.LoadError
		if errors.As(err, &le) {
			log.Debug("no GPU runtime", "tried", le.Details())
		}
		return nil, fmt.Errorf("no GPU runtime: %w", err)
	}
	return rt, nil
}

// addGPU registers the device allocation that holds b (LocationGPU, or
// LocationAuto memory outside every HostBuffer) with the server behind c
// and adds it as a region, or adds name to the region of that allocation
// when it is registered already; the caller holds the registration lock.
func (s *regionSet) addGPU(ctx context.Context, c *conn.Conn, name string, b Buffer, log *slog.Logger) error {
	rt, err := loadGPU(log)
	if err != nil {
		if b.Location == LocationAuto {
			// The caller's mistake, most likely: host memory (the Go heap)
			// given where only a HostBuffer's is taken. The runtime's
			// absence is what rules GPU memory out, not what is wrong.
			return fmt.Errorf("%w: memory at %#x (%d bytes) lies in no HostBuffer (host memory must come from NewHostBuffer), and it cannot be GPU memory: %v", ErrInvalidBuffer, b.Ptr, b.Size, err)
		}
		return fmt.Errorf("GPU buffer at %#x (%d bytes): %w", b.Ptr, b.Size, err)
	}
	mt, dev, err := rt.PointerInfo(b.Ptr)
	if err != nil {
		return fmt.Errorf("pointer attributes of %#x: %w", b.Ptr, err)
	}
	switch mt {
	case hip.MemoryDevice:
	case hip.MemoryManaged:
		return fmt.Errorf("%w: memory at %#x is managed (unified) memory, which has no IPC handle: use device memory", ErrNotSupported, b.Ptr)
	default:
		what := "host memory"
		if mt == hip.MemoryHost {
			what = "pinned host memory"
		}
		return fmt.Errorf("%w: memory at %#x is %s, not GPU memory: the server can map host memory only from a memfd, so host memory must come from NewHostBuffer", ErrInvalidBuffer, b.Ptr, what)
	}
	if b.Location == LocationGPU && b.Device != dev {
		return fmt.Errorf("%w: buffer names device %d but the memory at %#x is on device %d", ErrInvalidBuffer, b.Device, b.Ptr, dev)
	}
	allocBase, allocSize, err := rt.AddressRange(dev, b.Ptr)
	if err != nil {
		return fmt.Errorf("allocation that holds %#x on device %d: %w", b.Ptr, dev, err)
	}
	if b.Ptr < allocBase || b.Size > allocSize || uint64(b.Ptr-allocBase) > allocSize-b.Size {
		return fmt.Errorf("%w: GPU buffer %#x+%d does not lie inside its allocation %#x+%d on device %d", ErrInvalidBuffer, b.Ptr, b.Size, allocBase, allocSize, dev)
	}
	handle, err := rt.IpcGetMemHandle(dev, allocBase)
	if err != nil {
		return fmt.Errorf("IPC handle of the allocation %#x on device %d: %w", allocBase, dev, err)
	}
	g := &gpuAlloc{device: dev, allocBase: allocBase, allocSize: allocSize, handle: handle}
	if s.addGPUName(name, g, false) {
		return nil
	}
	// A new allocation, or one that replaced a registered allocation at the
	// same address (another handle, or size): the server then retires the
	// old one's regions and opens the new handle.
	if err := g.register(ctx, c, allocBase, allocSize); err != nil {
		if errors.Is(err, errdefs.ErrRefused) && !c.Capabilities().RangedIO {
			err = fmt.Errorf("%w: this server does not serve ranged I/O (a v1 server, or one with its SSD tier on) and takes no GPU memory: %w", ErrNotSupported, err)
		}
		return fmt.Errorf("register the allocation %#x (%d bytes) on device %d: %w", allocBase, allocSize, dev, err)
	}
	if s.addGPUName(name, g, true) {
		return nil
	}
	s.add(&memRegion{names: []string{name}, base: allocBase, size: allocSize, loc: LocationGPU, gpu: g})
	return nil
}

//go:build !cgo || !linux

package hip

import "fmt"

const cgoEnabled = false

// Runtime is a loaded GPU runtime. In this build (without cgo, or not on
// Linux) no runtime can be loaded and every method returns ErrNotSupported.
type Runtime struct{}

func open(Options) (*Runtime, error) {
	return nil, fmt.Errorf("hip: GPU runtime %w: built without cgo or not on Linux", ErrNotSupported)
}

// Vendor returns which runtime was loaded.
func (*Runtime) Vendor() Vendor { return "" }

// Library returns the path or soname the runtime library was opened as.
func (*Runtime) Library() string { return "" }

// String describes the loaded runtime.
func (*Runtime) String() string { return "no GPU runtime" }

// RuntimeVersion returns the runtime's version.
func (*Runtime) RuntimeVersion() int { return 0 }

// DeviceCount returns the number of devices the runtime sees.
func (*Runtime) DeviceCount() (int, error) { return 0, ErrNotSupported }

// SetDevice sets the calling OS thread's current device.
func (*Runtime) SetDevice(int) error { return ErrNotSupported }

// GetDevice returns the calling OS thread's current device.
func (*Runtime) GetDevice() (int, error) { return 0, ErrNotSupported }

// PointerInfo says where the memory at ptr lives.
func (*Runtime) PointerInfo(uintptr) (MemoryType, int, error) { return 0, -1, ErrNotSupported }

// AddressRange returns the base and size of the allocation that holds ptr.
func (*Runtime) AddressRange(int, uintptr) (uintptr, uint64, error) { return 0, 0, ErrNotSupported }

// IpcGetMemHandle returns an IPC handle for the allocation that holds ptr.
func (*Runtime) IpcGetMemHandle(int, uintptr) (IpcMemHandle, error) {
	return IpcMemHandle{}, ErrNotSupported
}

// IpcOpenMemHandle maps another process's allocation into this one.
func (*Runtime) IpcOpenMemHandle(int, IpcMemHandle) (uintptr, error) { return 0, ErrNotSupported }

// IpcCloseMemHandle unmaps memory opened with IpcOpenMemHandle.
func (*Runtime) IpcCloseMemHandle(int, uintptr) error { return ErrNotSupported }

// Malloc allocates device memory.
func (*Runtime) Malloc(int, uint64) (uintptr, error) { return 0, ErrNotSupported }

// Free frees device memory.
func (*Runtime) Free(int, uintptr) error { return ErrNotSupported }

// HostRegister pins host memory.
func (*Runtime) HostRegister(uintptr, uint64) error { return ErrNotSupported }

// HostRegisterWithFlags pins host memory with explicit flags.
func (*Runtime) HostRegisterWithFlags(uintptr, uint64, uint32) error { return ErrNotSupported }

// HostUnregister undoes HostRegister.
func (*Runtime) HostUnregister(uintptr) error { return ErrNotSupported }

// Memcpy copies memory synchronously.
func (*Runtime) Memcpy(int, uintptr, uintptr, uint64, MemcpyKind) error { return ErrNotSupported }

// MemcpyAsync queues a copy on a stream.
func (*Runtime) MemcpyAsync(int, uintptr, uintptr, uint64, MemcpyKind, Stream) error {
	return ErrNotSupported
}

// CopyToDevice copies a Go byte slice to device memory.
func (*Runtime) CopyToDevice(int, uintptr, []byte) error { return ErrNotSupported }

// CopyFromDevice copies device memory into a Go byte slice.
func (*Runtime) CopyFromDevice(int, []byte, uintptr) error { return ErrNotSupported }

// StreamCreate creates a stream.
func (*Runtime) StreamCreate(int) (Stream, error) { return 0, ErrNotSupported }

// StreamSynchronize waits for a stream.
func (*Runtime) StreamSynchronize(int, Stream) error { return ErrNotSupported }

// StreamDestroy destroys a stream.
func (*Runtime) StreamDestroy(int, Stream) error { return ErrNotSupported }

// EventCreate creates an event.
func (*Runtime) EventCreate(int) (Event, error) { return 0, ErrNotSupported }

// EventRecord records an event on a stream.
func (*Runtime) EventRecord(int, Event, Stream) error { return ErrNotSupported }

// EventSynchronize waits for an event.
func (*Runtime) EventSynchronize(int, Event) error { return ErrNotSupported }

// EventQuery queries an event.
func (*Runtime) EventQuery(int, Event) (bool, error) { return false, ErrNotSupported }

// EventDestroy destroys an event.
func (*Runtime) EventDestroy(int, Event) error { return ErrNotSupported }

// DeviceSynchronize waits for all work on a device.
func (*Runtime) DeviceSynchronize(int) error { return ErrNotSupported }

// CanMemcpyBatch reports false: there is no GPU runtime.
func (*Runtime) CanMemcpyBatch() bool { return false }

// MemcpyBatchAsync returns ErrNotSupported.
func (*Runtime) MemcpyBatchAsync(int, []uintptr, []uintptr, []uint64, MemcpyKind, uint32, Stream) error {
	return ErrNotSupported
}

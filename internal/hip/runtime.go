package hip

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Runtime is a loaded GPU runtime. It is immutable after loading and safe
// for concurrent use; every call goes straight to the vendor's runtime. A
// build without cgo, or not on Linux, can load none: [Open] and [Load] fail
// with ErrNotSupported.
type Runtime struct {
	tab      *table
	vendor   Vendor
	library  string
	driver   string
	version  int
	names    [fnCount]string
	driverFn [fnCount]bool
}

// rc is a call's result: the code the runtime returned and the slot of the
// function that returned it.
type rc struct{ code, fn int }

// err turns a call's result into an *Error, or nil on success. It is small
// enough to be inlined, so that a successful call makes no call but the
// runtime's.
func (r *Runtime) err(rc rc) error {
	if rc.code == 0 {
		return nil
	}
	return r.fail(rc)
}

// fail is err for a failed call. A Runtime without a table, which is all a
// build without cgo can have, gives ErrNotSupported.
func (r *Runtime) fail(rc rc) error {
	if r.tab == nil {
		return ErrNotSupported
	}
	return &Error{Op: r.names[rc.fn], Code: rc.code, Msg: r.tab.errorString(r.driverFn[rc.fn], rc.code)}
}

// Vendor returns which runtime was loaded: "hip" or "cuda".
func (r *Runtime) Vendor() Vendor { return r.vendor }

// Library returns the path or soname the runtime library was opened as.
func (r *Runtime) Library() string { return r.library }

// String describes the loaded runtime for logs, e.g.
// "cuda 13000 (libcudart.so.13; driver libcuda.so.1)"; for the zero
// Runtime, which holds none, "no GPU runtime".
func (r *Runtime) String() string {
	if r.tab == nil {
		return "no GPU runtime"
	}
	if r.driver != "" {
		return fmt.Sprintf("%s %d (%s; driver %s)", r.vendor, r.version, r.library, r.driver)
	}
	return fmt.Sprintf("%s %d (%s)", r.vendor, r.version, r.library)
}

// RuntimeVersion returns hipRuntimeGetVersion's or cudaRuntimeGetVersion's
// value, read when the runtime was loaded.
func (r *Runtime) RuntimeVersion() int { return r.version }

// DeviceCount returns the number of devices the runtime sees.
func (r *Runtime) DeviceCount() (int, error) {
	n, rc := r.tab.deviceCount()
	if err := r.err(rc); err != nil {
		return 0, err
	}
	return n, nil
}

// SetDevice sets the calling OS thread's current device. Goroutines move
// between threads, so this is only meaningful under runtime.LockOSThread;
// the other methods select their device themselves.
func (r *Runtime) SetDevice(device int) error {
	return r.err(r.tab.setDevice(device))
}

// GetDevice returns the calling OS thread's current device (see SetDevice).
func (r *Runtime) GetDevice() (int, error) {
	d, rc := r.tab.getDevice()
	if err := r.err(rc); err != nil {
		return 0, err
	}
	return d, nil
}

// PointerInfo says where the memory at ptr lives and, for device memory,
// on which device (for registered host memory: the device current when it
// was registered; -1 for unregistered memory). Runtimes that reject
// unregistered host pointers with an invalid-value error report
// MemoryUnregistered.
func (r *Runtime) PointerInfo(ptr uintptr) (MemoryType, int, error) {
	var words [pointerAttributesSize / 8]uint64 // 8-byte aligned
	buf := (*[pointerAttributesSize]byte)(unsafe.Pointer(&words))
	rc := r.tab.pointerAttributes(ptr, buf)
	if rc.code == errInvalidValue {
		return MemoryUnregistered, -1, nil
	}
	if err := r.err(rc); err != nil {
		return 0, -1, err
	}
	mt, dev, ok := decodePointerAttributes(r.vendor, r.version, buf)
	if !ok {
		raw := int32(binary.NativeEndian.Uint32(buf[0:4]))
		return 0, -1, fmt.Errorf("hip: %s: unknown memory type %d", r.names[fnPointerAttributes], raw)
	}
	return mt, dev, nil
}

// AddressRange returns the base and size of the device allocation that
// holds ptr (hipMemGetAddressRange; on CUDA cuMemGetAddressRange_v2 with
// device's primary context made current first).
func (r *Runtime) AddressRange(device int, ptr uintptr) (uintptr, uint64, error) {
	base, size, rc := r.tab.addressRange(device, ptr)
	if err := r.err(rc); err != nil {
		return 0, 0, err
	}
	return base, size, nil
}

// IpcGetMemHandle returns an IPC handle for the allocation that holds ptr.
// The handle names the whole allocation and opens to its base, so callers
// export the allocation base (see AddressRange) and send the offset.
func (r *Runtime) IpcGetMemHandle(device int, ptr uintptr) (IpcMemHandle, error) {
	h, rc := r.tab.ipcGet(device, ptr)
	if err := r.err(rc); err != nil {
		return IpcMemHandle{}, err
	}
	return h, nil
}

// IpcOpenMemHandle maps another process's allocation into this one on
// device, with IpcMemLazyEnablePeerAccess, and returns its base. A process
// cannot open its own handles.
func (r *Runtime) IpcOpenMemHandle(device int, h IpcMemHandle) (uintptr, error) {
	p, rc := r.tab.ipcOpen(device, &h, IpcMemLazyEnablePeerAccess)
	if err := r.err(rc); err != nil {
		return 0, err
	}
	return p, nil
}

// IpcCloseMemHandle unmaps memory opened with IpcOpenMemHandle.
func (r *Runtime) IpcCloseMemHandle(device int, ptr uintptr) error {
	return r.err(r.tab.handleOp(device, fnIpcClose, ptr))
}

// Malloc allocates size bytes of device memory on device.
func (r *Runtime) Malloc(device int, size uint64) (uintptr, error) {
	p, rc := r.tab.malloc(device, size)
	if err := r.err(rc); err != nil {
		return 0, err
	}
	return p, nil
}

// Free frees device memory allocated with Malloc on device.
func (r *Runtime) Free(device int, ptr uintptr) error {
	return r.err(r.tab.free(device, ptr))
}

// HostRegister pins size bytes of host memory at ptr (not Go-heap memory)
// with HostRegisterDefault. The registration belongs to the context of the
// device current on the calling thread; use HostRegisterWithFlags with
// HostRegisterPortable to pin for every device.
func (r *Runtime) HostRegister(ptr uintptr, size uint64) error {
	return r.HostRegisterWithFlags(ptr, size, HostRegisterDefault)
}

// HostRegisterWithFlags is HostRegister with explicit hipHostRegister /
// cudaHostRegister flags.
func (r *Runtime) HostRegisterWithFlags(ptr uintptr, size uint64, flags uint32) error {
	return r.err(r.tab.hostRegister(ptr, size, flags))
}

// HostUnregister undoes HostRegister.
func (r *Runtime) HostUnregister(ptr uintptr) error {
	return r.err(r.tab.hostUnregister(ptr))
}

// Memcpy copies n bytes from src to dst on device and returns when the copy
// is done (for pageable host sources: when the source may be reused).
func (r *Runtime) Memcpy(device int, dst, src uintptr, n uint64, kind MemcpyKind) error {
	return r.err(r.tab.memcpy(device, dst, src, n, kind))
}

// MemcpyAsync queues a copy of n bytes from src to dst on stream. Host
// memory must stay valid, and for true asynchrony be pinned, until the
// stream has been synchronised.
func (r *Runtime) MemcpyAsync(device int, dst, src uintptr, n uint64, kind MemcpyKind, stream Stream) error {
	return r.err(r.tab.memcpyAsync(device, dst, src, n, kind, stream))
}

// CopyToDevice copies src (any Go memory) to device memory at dst,
// synchronously.
func (r *Runtime) CopyToDevice(device int, dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return r.err(r.tab.memcpyToDevice(device, dst, src))
}

// CopyFromDevice copies len(dst) bytes of device memory at src into dst
// (any Go memory), synchronously.
func (r *Runtime) CopyFromDevice(device int, dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	return r.err(r.tab.memcpyFromDevice(device, dst, src))
}

// minBatchCUDAVersion is the first CUDA runtime with cudaMemcpyBatchAsync.
const minBatchCUDAVersion = 12080

// CanMemcpyBatch reports whether MemcpyBatchAsync is available: a CUDA
// runtime of 12.8 or later. A driver that cannot make the call still makes
// MemcpyBatchAsync fail with an error wrapping ErrNotSupported.
func (r *Runtime) CanMemcpyBatch() bool {
	return r.vendor == VendorCUDA && r.version >= minBatchCUDAVersion && r.tab.has(fnMemcpyBatchAsync)
}

// MemcpyBatchAsync queues len(dsts) copies of sizes[i] bytes from srcs[i] to
// dsts[i] on stream s with one call (cudaMemcpyBatchAsync), all in the
// direction kind (MemcpyHostToDevice or MemcpyDeviceToHost, host memory
// pinned) and ordered after the stream's earlier work; the copies of one
// batch may run in any order. flags are cudaMemcpyFlags. Without
// CanMemcpyBatch it returns an error wrapping ErrNotSupported.
func (r *Runtime) MemcpyBatchAsync(device int, dsts, srcs []uintptr, sizes []uint64, kind MemcpyKind, flags uint32, s Stream) error {
	if !r.CanMemcpyBatch() {
		return fmt.Errorf("hip: batched copies %w: %s has no cudaMemcpyBatchAsync", ErrNotSupported, r)
	}
	if len(srcs) != len(dsts) || len(sizes) != len(dsts) {
		return fmt.Errorf("hip: MemcpyBatchAsync: %d destinations, %d sources, %d sizes", len(dsts), len(srcs), len(sizes))
	}
	if kind != MemcpyHostToDevice && kind != MemcpyDeviceToHost {
		return fmt.Errorf("hip: MemcpyBatchAsync: kind %d, want host to device or device to host", kind)
	}
	if len(dsts) == 0 {
		return nil
	}
	rc := r.tab.memcpyBatchAsync(device, r.version, dsts, srcs, sizes, kind, flags, s)
	err := r.err(rc)
	if c := rc.code; c == errCUDANotSupported || c == errCUDARequiresNewerDriver {
		return fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return err
}

// StreamCreate creates a stream on device with StreamNonBlocking.
func (r *Runtime) StreamCreate(device int) (Stream, error) {
	s, rc := r.tab.streamCreate(device, StreamNonBlocking)
	if err := r.err(rc); err != nil {
		return 0, err
	}
	return s, nil
}

// StreamSynchronize waits for everything queued on s.
func (r *Runtime) StreamSynchronize(device int, s Stream) error {
	return r.err(r.tab.handleOp(device, fnStreamSynchronize, uintptr(s)))
}

// StreamDestroy destroys s.
func (r *Runtime) StreamDestroy(device int, s Stream) error {
	return r.err(r.tab.handleOp(device, fnStreamDestroy, uintptr(s)))
}

// EventCreate creates an event on device with EventDisableTiming.
func (r *Runtime) EventCreate(device int) (Event, error) {
	e, rc := r.tab.eventCreate(device, EventDisableTiming)
	if err := r.err(rc); err != nil {
		return 0, err
	}
	return e, nil
}

// EventRecord records ev on stream s.
func (r *Runtime) EventRecord(device int, ev Event, s Stream) error {
	return r.err(r.tab.eventRecord(device, ev, s))
}

// EventSynchronize waits until the work before ev's last record is done.
func (r *Runtime) EventSynchronize(device int, ev Event) error {
	return r.err(r.tab.handleOp(device, fnEventSynchronize, uintptr(ev)))
}

// EventQuery reports whether the work before ev's last record is done,
// without waiting.
func (r *Runtime) EventQuery(device int, ev Event) (bool, error) {
	rc := r.tab.handleOp(device, fnEventQuery, uintptr(ev))
	if rc.code == errNotReady {
		return false, nil
	}
	if err := r.err(rc); err != nil {
		return false, err
	}
	return true, nil
}

// EventDestroy destroys ev.
func (r *Runtime) EventDestroy(device int, ev Event) error {
	return r.err(r.tab.handleOp(device, fnEventDestroy, uintptr(ev)))
}

// DeviceSynchronize waits for all work on device.
func (r *Runtime) DeviceSynchronize(device int) error {
	return r.err(r.tab.deviceSynchronize(device))
}

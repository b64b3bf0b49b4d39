//go:build cgo && linux

package hip

/*
#cgo LDFLAGS: -ldl
#include "trampolines.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unsafe"
)

const cgoEnabled = true

const fnCount = int(C.UMBP_FN_COUNT)

// symbol names the function behind one table slot for each vendor.
type symbol struct {
	fn   int
	hip  string // empty: not used with HIP
	cuda string // empty: not used with CUDA
	// optional symbols may be missing; calls check for NULL first.
	optional bool
	// cudaDriver symbols come from libcuda rather than libcudart.
	cudaDriver bool
}

var symbols = []symbol{
	{fn: C.UMBP_FN_INIT, hip: "hipInit"},
	{fn: C.UMBP_FN_RUNTIME_VERSION, hip: "hipRuntimeGetVersion", cuda: "cudaRuntimeGetVersion"},
	{fn: C.UMBP_FN_DEVICE_COUNT, hip: "hipGetDeviceCount", cuda: "cudaGetDeviceCount"},
	{fn: C.UMBP_FN_SET_DEVICE, hip: "hipSetDevice", cuda: "cudaSetDevice"},
	{fn: C.UMBP_FN_GET_DEVICE, hip: "hipGetDevice", cuda: "cudaGetDevice"},
	{fn: C.UMBP_FN_MALLOC, hip: "hipMalloc", cuda: "cudaMalloc"},
	{fn: C.UMBP_FN_FREE, hip: "hipFree", cuda: "cudaFree"},
	{fn: C.UMBP_FN_HOST_REGISTER, hip: "hipHostRegister", cuda: "cudaHostRegister"},
	{fn: C.UMBP_FN_HOST_UNREGISTER, hip: "hipHostUnregister", cuda: "cudaHostUnregister"},
	{fn: C.UMBP_FN_MEMCPY, hip: "hipMemcpy", cuda: "cudaMemcpy"},
	{fn: C.UMBP_FN_MEMCPY_ASYNC, hip: "hipMemcpyAsync", cuda: "cudaMemcpyAsync"},
	{fn: C.UMBP_FN_STREAM_CREATE, hip: "hipStreamCreateWithFlags", cuda: "cudaStreamCreateWithFlags"},
	{fn: C.UMBP_FN_STREAM_SYNCHRONIZE, hip: "hipStreamSynchronize", cuda: "cudaStreamSynchronize"},
	{fn: C.UMBP_FN_STREAM_DESTROY, hip: "hipStreamDestroy", cuda: "cudaStreamDestroy"},
	{fn: C.UMBP_FN_EVENT_CREATE, hip: "hipEventCreateWithFlags", cuda: "cudaEventCreateWithFlags"},
	{fn: C.UMBP_FN_EVENT_RECORD, hip: "hipEventRecord", cuda: "cudaEventRecord"},
	{fn: C.UMBP_FN_EVENT_SYNCHRONIZE, hip: "hipEventSynchronize", cuda: "cudaEventSynchronize"},
	{fn: C.UMBP_FN_EVENT_QUERY, hip: "hipEventQuery", cuda: "cudaEventQuery"},
	{fn: C.UMBP_FN_EVENT_DESTROY, hip: "hipEventDestroy", cuda: "cudaEventDestroy"},
	{fn: C.UMBP_FN_POINTER_ATTRIBUTES, hip: "hipPointerGetAttributes", cuda: "cudaPointerGetAttributes"},
	{fn: C.UMBP_FN_ADDRESS_RANGE, hip: "hipMemGetAddressRange", cuda: "cuMemGetAddressRange_v2", cudaDriver: true},
	{fn: C.UMBP_FN_IPC_GET, hip: "hipIpcGetMemHandle", cuda: "cudaIpcGetMemHandle"},
	{fn: C.UMBP_FN_IPC_OPEN, hip: "hipIpcOpenMemHandle", cuda: "cudaIpcOpenMemHandle"},
	{fn: C.UMBP_FN_IPC_CLOSE, hip: "hipIpcCloseMemHandle", cuda: "cudaIpcCloseMemHandle"},
	{fn: C.UMBP_FN_ERROR_STRING, hip: "hipGetErrorString", cuda: "cudaGetErrorString"},
	{fn: C.UMBP_FN_DEVICE_SYNCHRONIZE, hip: "hipDeviceSynchronize", cuda: "cudaDeviceSynchronize"},
	{fn: C.UMBP_FN_GET_LAST_ERROR, hip: "hipGetLastError", cuda: "cudaGetLastError", optional: true},
	{fn: C.UMBP_FN_DRIVER_ERROR_STRING, cuda: "cuGetErrorString", optional: true, cudaDriver: true},
	// HIP's hipMemcpyBatchAsync (7.1 and later) is left out: it refuses
	// attributes in some releases and was slower than single copies.
	{fn: C.UMBP_FN_MEMCPY_BATCH_ASYNC, cuda: "cudaMemcpyBatchAsync", optional: true},
}

func (s symbol) name(v Vendor) string {
	if v == VendorCUDA {
		return s.cuda
	}
	return s.hip
}

// Runtime is a loaded GPU runtime. It is immutable after loading and safe
// for concurrent use; every call goes straight to the vendor's runtime.
type Runtime struct {
	tab      *C.umbp_table
	vendor   Vendor
	library  string
	driver   string
	version  int
	names    [fnCount]string
	driverFn [fnCount]bool
}

func newRuntime(v Vendor, library string) *Runtime {
	cv := C.int(C.UMBP_VENDOR_HIP)
	if v == VendorCUDA {
		cv = C.UMBP_VENDOR_CUDA
	}
	r := &Runtime{tab: C.umbp_table_new(cv), vendor: v, library: library}
	if r.tab == nil {
		panic("hip: out of memory allocating the function table")
	}
	for _, s := range symbols {
		r.names[s.fn] = s.name(v)
		r.driverFn[s.fn] = v == VendorCUDA && s.cudaDriver
	}
	return r
}

// release frees the table of a runtime that failed to load. Its libraries
// stay loaded.
func (r *Runtime) release() {
	C.free(unsafe.Pointer(r.tab))
	r.tab = nil
}

const errBufSize = 1024

func dlopen(path string) (unsafe.Pointer, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [errBufSize]C.char
	h := C.umbp_dlopen(cpath, &buf[0], C.size_t(len(buf)))
	if h == nil {
		msg := C.GoString(&buf[0])
		if !strings.Contains(msg, path) {
			msg = path + ": " + msg
		}
		return nil, errors.New(msg)
	}
	return h, nil
}

// bind resolves, from the library h, the symbols of r's vendor that live in
// that library (the driver's when driver is set). It returns the names of
// the required symbols that are missing.
func (r *Runtime) bind(h unsafe.Pointer, driver bool) (missing []string) {
	var buf [errBufSize]C.char
	for _, s := range symbols {
		name := s.name(r.vendor)
		if name == "" || (r.vendor == VendorCUDA && s.cudaDriver != driver) {
			continue
		}
		cname := C.CString(name)
		rc := C.umbp_bind(r.tab, C.int(s.fn), h, cname, &buf[0], C.size_t(len(buf)))
		C.free(unsafe.Pointer(cname))
		if rc != 0 && !s.optional {
			missing = append(missing, name)
		}
	}
	return missing
}

func open(opts Options) (*Runtime, error) {
	var why []string
	if r := openHIP(opts.HIPLibraries, &why); r != nil {
		return r, nil
	}
	if r := openCUDA(opts.CUDARuntimeLibraries, opts.CUDADriverLibraries, &why); r != nil {
		return r, nil
	}
	return nil, &LoadError{Tried: why}
}

// openHIP uses the first HIP library that loads with every symbol, if it
// initialises and counts a device.
func openHIP(paths []string, why *[]string) *Runtime {
	return openFirst(VendorHIP, paths, why)
}

// openCUDA uses the first CUDA runtime that loads with every symbol and
// counts a device, with the first driver library that has the driver
// symbols. The driver is opened after the runtime has initialised, so that
// its soname finds the copy the runtime loaded.
func openCUDA(rtPaths, drvPaths []string, why *[]string) *Runtime {
	r := openFirst(VendorCUDA, rtPaths, why)
	if r == nil {
		return nil
	}
	for _, d := range drvPaths {
		dh, err := dlopen(d)
		if err != nil {
			*why = append(*why, "CUDA driver "+err.Error())
			continue
		}
		if missing := r.bind(dh, true); len(missing) > 0 {
			*why = append(*why, fmt.Sprintf("CUDA driver %s: missing symbols %s", d, strings.Join(missing, ", ")))
			continue
		}
		r.driver = d
		return r
	}
	*why = append(*why, "CUDA: no usable driver library")
	r.release()
	return nil
}

// openFirst returns a runtime of vendor on the first of paths that loads
// with every symbol of its own library, once it has initialised and counted
// a device; a library that loads but fails that ends the search. Why each
// candidate was passed over goes to why.
func openFirst(v Vendor, paths []string, why *[]string) *Runtime {
	label := strings.ToUpper(string(v))
	for _, p := range paths {
		h, err := dlopen(p)
		if err != nil {
			*why = append(*why, label+" "+err.Error())
			continue
		}
		r := newRuntime(v, p)
		if missing := r.bind(h, false); len(missing) > 0 {
			*why = append(*why, fmt.Sprintf("%s %s: missing symbols %s", label, p, strings.Join(missing, ", ")))
			r.release()
			continue
		}
		if err := r.probe(); err != nil {
			*why = append(*why, fmt.Sprintf("%s %s: %v", label, p, err))
			r.release()
			return nil
		}
		return r
	}
	return nil
}

// probe initialises the runtime, reads its version and requires a device.
func (r *Runtime) probe() error {
	if r.vendor == VendorHIP {
		if err := r.err(C.umbp_init(r.tab)); err != nil {
			return err
		}
	}
	n, err := r.DeviceCount()
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("%s: no devices", r.names[C.UMBP_FN_DEVICE_COUNT])
	}
	var v C.int
	if err := r.err(C.umbp_runtime_version(r.tab, &v)); err != nil {
		return err
	}
	r.version = int(v)
	if r.vendor == VendorCUDA && r.version < minCUDAVersion {
		return fmt.Errorf("CUDA runtime version %d is older than %d", r.version, minCUDAVersion)
	}
	return nil
}

// err turns a call's result into an *Error, or nil on success.
func (r *Runtime) err(rc C.umbp_rc) error {
	if rc.code == 0 {
		return nil
	}
	fn := int(rc.fn)
	e := &Error{Op: r.names[fn], Code: int(rc.code)}
	drv := C.int(0)
	if r.driverFn[fn] {
		drv = 1
	}
	if s := C.umbp_error_string(r.tab, drv, rc.code); s != nil {
		e.Msg = C.GoString(s)
	}
	return e
}

// Vendor returns which runtime was loaded: "hip" or "cuda".
func (r *Runtime) Vendor() Vendor { return r.vendor }

// Library returns the path or soname the runtime library was opened as.
func (r *Runtime) Library() string { return r.library }

// String describes the loaded runtime for logs, e.g.
// "cuda 13000 (libcudart.so.13; driver libcuda.so.1)".
func (r *Runtime) String() string {
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
	var n C.int
	if err := r.err(C.umbp_device_count(r.tab, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// SetDevice sets the calling OS thread's current device. Goroutines move
// between threads, so this is only meaningful under runtime.LockOSThread;
// the other methods select their device themselves.
func (r *Runtime) SetDevice(device int) error {
	return r.err(C.umbp_set_device(r.tab, C.int(device)))
}

// GetDevice returns the calling OS thread's current device (see SetDevice).
func (r *Runtime) GetDevice() (int, error) {
	var d C.int
	if err := r.err(C.umbp_get_device(r.tab, &d)); err != nil {
		return 0, err
	}
	return int(d), nil
}

// PointerInfo says where the memory at ptr lives and, for device memory,
// on which device (for registered host memory: the device current when it
// was registered; -1 for unregistered memory). Runtimes that reject
// unregistered host pointers with an invalid-value error report
// MemoryUnregistered.
func (r *Runtime) PointerInfo(ptr uintptr) (MemoryType, int, error) {
	var words [pointerAttributesSize / 8]uint64 // 8-byte aligned
	buf := (*[pointerAttributesSize]byte)(unsafe.Pointer(&words))
	rc := C.umbp_pointer_attributes(r.tab, C.uintptr_t(ptr), unsafe.Pointer(buf))
	if rc.code == errInvalidValue {
		return MemoryUnregistered, -1, nil
	}
	if err := r.err(rc); err != nil {
		return 0, -1, err
	}
	mt, dev, ok := decodePointerAttributes(r.vendor, r.version, buf)
	if !ok {
		raw := int32(binary.NativeEndian.Uint32(buf[0:4]))
		return 0, -1, fmt.Errorf("hip: %s: unknown memory type %d", r.names[C.UMBP_FN_POINTER_ATTRIBUTES], raw)
	}
	return mt, dev, nil
}

// AddressRange returns the base and size of the device allocation that
// holds ptr (hipMemGetAddressRange; on CUDA cuMemGetAddressRange_v2 with
// device's primary context made current first).
func (r *Runtime) AddressRange(device int, ptr uintptr) (uintptr, uint64, error) {
	var base C.uintptr_t
	var size C.size_t
	if err := r.err(C.umbp_address_range(r.tab, C.int(device), C.uintptr_t(ptr), &base, &size)); err != nil {
		return 0, 0, err
	}
	return uintptr(base), uint64(size), nil
}

// IpcGetMemHandle returns an IPC handle for the allocation that holds ptr.
// The handle names the whole allocation and opens to its base, so callers
// export the allocation base (see AddressRange) and send the offset.
func (r *Runtime) IpcGetMemHandle(device int, ptr uintptr) (IpcMemHandle, error) {
	var h IpcMemHandle
	if err := r.err(C.umbp_ipc_get(r.tab, C.int(device), C.uintptr_t(ptr), unsafe.Pointer(&h[0]))); err != nil {
		return IpcMemHandle{}, err
	}
	return h, nil
}

// IpcOpenMemHandle maps another process's allocation into this one on
// device, with IpcMemLazyEnablePeerAccess, and returns its base. A process
// cannot open its own handles.
func (r *Runtime) IpcOpenMemHandle(device int, h IpcMemHandle) (uintptr, error) {
	var p C.uintptr_t
	rc := C.umbp_ipc_open(r.tab, C.int(device), unsafe.Pointer(&h[0]), IpcMemLazyEnablePeerAccess, &p)
	if err := r.err(rc); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// IpcCloseMemHandle unmaps memory opened with IpcOpenMemHandle.
func (r *Runtime) IpcCloseMemHandle(device int, ptr uintptr) error {
	return r.err(C.umbp_handle_op(r.tab, C.int(device), C.UMBP_FN_IPC_CLOSE, C.uintptr_t(ptr)))
}

// Malloc allocates size bytes of device memory on device.
func (r *Runtime) Malloc(device int, size uint64) (uintptr, error) {
	var p C.uintptr_t
	if err := r.err(C.umbp_malloc(r.tab, C.int(device), C.size_t(size), &p)); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// Free frees device memory allocated with Malloc on device.
func (r *Runtime) Free(device int, ptr uintptr) error {
	return r.err(C.umbp_free(r.tab, C.int(device), C.uintptr_t(ptr)))
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
	return r.err(C.umbp_host_register(r.tab, C.uintptr_t(ptr), C.size_t(size), C.uint(flags)))
}

// HostUnregister undoes HostRegister.
func (r *Runtime) HostUnregister(ptr uintptr) error {
	return r.err(C.umbp_host_unregister(r.tab, C.uintptr_t(ptr)))
}

// Memcpy copies n bytes from src to dst on device and returns when the copy
// is done (for pageable host sources: when the source may be reused).
func (r *Runtime) Memcpy(device int, dst, src uintptr, n uint64, kind MemcpyKind) error {
	return r.err(C.umbp_memcpy(r.tab, C.int(device), C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), C.int(kind)))
}

// MemcpyAsync queues a copy of n bytes from src to dst on stream. Host
// memory must stay valid, and for true asynchrony be pinned, until the
// stream has been synchronised.
func (r *Runtime) MemcpyAsync(device int, dst, src uintptr, n uint64, kind MemcpyKind, stream Stream) error {
	return r.err(C.umbp_memcpy_async(r.tab, C.int(device), C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n),
		C.int(kind), C.uintptr_t(stream)))
}

// CopyToDevice copies src (any Go memory) to device memory at dst,
// synchronously.
func (r *Runtime) CopyToDevice(device int, dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return r.err(C.umbp_memcpy_to_device(r.tab, C.int(device), C.uintptr_t(dst), unsafe.Pointer(&src[0]),
		C.size_t(len(src))))
}

// CopyFromDevice copies len(dst) bytes of device memory at src into dst
// (any Go memory), synchronously.
func (r *Runtime) CopyFromDevice(device int, dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	return r.err(C.umbp_memcpy_from_device(r.tab, C.int(device), unsafe.Pointer(&dst[0]), C.uintptr_t(src),
		C.size_t(len(dst))))
}

// minBatchCUDAVersion is the first CUDA runtime with cudaMemcpyBatchAsync.
const minBatchCUDAVersion = 12080

// CanMemcpyBatch reports whether MemcpyBatchAsync is available: a CUDA
// runtime of 12.8 or later. A driver that cannot make the call still makes
// MemcpyBatchAsync fail with an error wrapping ErrNotSupported.
func (r *Runtime) CanMemcpyBatch() bool {
	return r.vendor == VendorCUDA && r.version >= minBatchCUDAVersion && r.tab.fn[C.UMBP_FN_MEMCPY_BATCH_ASYNC] != nil
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
	rc := C.umbp_memcpy_batch_async(r.tab, C.int(device), C.int(r.version),
		(*C.uintptr_t)(unsafe.Pointer(&dsts[0])), (*C.uintptr_t)(unsafe.Pointer(&srcs[0])),
		(*C.size_t)(unsafe.Pointer(&sizes[0])), C.size_t(len(dsts)), C.int(kind), C.uint(flags), C.uintptr_t(s))
	err := r.err(rc)
	if c := int(rc.code); c == errCUDANotSupported || c == errCUDARequiresNewerDriver {
		return fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return err
}

// StreamCreate creates a stream on device with StreamNonBlocking.
func (r *Runtime) StreamCreate(device int) (Stream, error) {
	var s C.uintptr_t
	if err := r.err(C.umbp_stream_create(r.tab, C.int(device), StreamNonBlocking, &s)); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// StreamSynchronize waits for everything queued on s.
func (r *Runtime) StreamSynchronize(device int, s Stream) error {
	return r.err(C.umbp_handle_op(r.tab, C.int(device), C.UMBP_FN_STREAM_SYNCHRONIZE, C.uintptr_t(s)))
}

// StreamDestroy destroys s.
func (r *Runtime) StreamDestroy(device int, s Stream) error {
	return r.err(C.umbp_handle_op(r.tab, C.int(device), C.UMBP_FN_STREAM_DESTROY, C.uintptr_t(s)))
}

// EventCreate creates an event on device with EventDisableTiming.
func (r *Runtime) EventCreate(device int) (Event, error) {
	var e C.uintptr_t
	if err := r.err(C.umbp_event_create(r.tab, C.int(device), EventDisableTiming, &e)); err != nil {
		return 0, err
	}
	return Event(e), nil
}

// EventRecord records ev on stream s.
func (r *Runtime) EventRecord(device int, ev Event, s Stream) error {
	return r.err(C.umbp_event_record(r.tab, C.int(device), C.uintptr_t(ev), C.uintptr_t(s)))
}

// EventSynchronize waits until the work before ev's last record is done.
func (r *Runtime) EventSynchronize(device int, ev Event) error {
	return r.err(C.umbp_handle_op(r.tab, C.int(device), C.UMBP_FN_EVENT_SYNCHRONIZE, C.uintptr_t(ev)))
}

// EventQuery reports whether the work before ev's last record is done,
// without waiting.
func (r *Runtime) EventQuery(device int, ev Event) (bool, error) {
	rc := C.umbp_handle_op(r.tab, C.int(device), C.UMBP_FN_EVENT_QUERY, C.uintptr_t(ev))
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
	return r.err(C.umbp_handle_op(r.tab, C.int(device), C.UMBP_FN_EVENT_DESTROY, C.uintptr_t(ev)))
}

// DeviceSynchronize waits for all work on device.
func (r *Runtime) DeviceSynchronize(device int) error {
	return r.err(C.umbp_device_synchronize(r.tab, C.int(device)))
}

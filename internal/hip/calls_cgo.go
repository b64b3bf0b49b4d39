//go:build cgo && linux

package hip

/*
#cgo LDFLAGS: -ldl
#include "trampolines.h"
*/
import "C"

import (
	"errors"
	"strings"
	"unsafe"
)

// This file is the Go face of trampolines.h: the table, dlopen and dlsym,
// and one method of *table per trampoline, converting between Go and C
// types. calls_nocgo.go gives a build without cgo the same methods.

const cgoEnabled = true

// The C enum numbers the table's slots as the fn constants do. An "invalid
// array index" compile error here means they have drifted apart.
func _() {
	var x [1]struct{}
	_ = x[fnInit-C.UMBP_FN_INIT]
	_ = x[fnRuntimeVersion-C.UMBP_FN_RUNTIME_VERSION]
	_ = x[fnDeviceCount-C.UMBP_FN_DEVICE_COUNT]
	_ = x[fnSetDevice-C.UMBP_FN_SET_DEVICE]
	_ = x[fnGetDevice-C.UMBP_FN_GET_DEVICE]
	_ = x[fnMalloc-C.UMBP_FN_MALLOC]
	_ = x[fnFree-C.UMBP_FN_FREE]
	_ = x[fnHostRegister-C.UMBP_FN_HOST_REGISTER]
	_ = x[fnHostUnregister-C.UMBP_FN_HOST_UNREGISTER]
	_ = x[fnMemcpy-C.UMBP_FN_MEMCPY]
	_ = x[fnMemcpyAsync-C.UMBP_FN_MEMCPY_ASYNC]
	_ = x[fnStreamCreate-C.UMBP_FN_STREAM_CREATE]
	_ = x[fnStreamSynchronize-C.UMBP_FN_STREAM_SYNCHRONIZE]
	_ = x[fnStreamDestroy-C.UMBP_FN_STREAM_DESTROY]
	_ = x[fnEventCreate-C.UMBP_FN_EVENT_CREATE]
	_ = x[fnEventRecord-C.UMBP_FN_EVENT_RECORD]
	_ = x[fnEventSynchronize-C.UMBP_FN_EVENT_SYNCHRONIZE]
	_ = x[fnEventQuery-C.UMBP_FN_EVENT_QUERY]
	_ = x[fnEventDestroy-C.UMBP_FN_EVENT_DESTROY]
	_ = x[fnPointerAttributes-C.UMBP_FN_POINTER_ATTRIBUTES]
	_ = x[fnAddressRange-C.UMBP_FN_ADDRESS_RANGE]
	_ = x[fnIpcGet-C.UMBP_FN_IPC_GET]
	_ = x[fnIpcOpen-C.UMBP_FN_IPC_OPEN]
	_ = x[fnIpcClose-C.UMBP_FN_IPC_CLOSE]
	_ = x[fnErrorString-C.UMBP_FN_ERROR_STRING]
	_ = x[fnDeviceSynchronize-C.UMBP_FN_DEVICE_SYNCHRONIZE]
	_ = x[fnGetLastError-C.UMBP_FN_GET_LAST_ERROR]
	_ = x[fnDriverErrorString-C.UMBP_FN_DRIVER_ERROR_STRING]
	_ = x[fnMemcpyBatchAsync-C.UMBP_FN_MEMCPY_BATCH_ASYNC]
	_ = x[fnCount-C.UMBP_FN_COUNT]
}

// table is the C function table: the vendor and one function pointer per
// slot, allocated with calloc and freed only when a load fails.
type table C.umbp_table

func (t *table) c() *C.umbp_table { return (*C.umbp_table)(t) }

func rcOf(r C.umbp_rc) rc { return rc{code: int(r.code), fn: int(r.fn)} }

// newTable returns an empty table for vendor, or nil when out of memory.
func newTable(v Vendor) *table {
	cv := C.int(C.UMBP_VENDOR_HIP)
	if v == VendorCUDA {
		cv = C.UMBP_VENDOR_CUDA
	}
	return (*table)(C.umbp_table_new(cv))
}

func freeTable(t *table) { C.free(unsafe.Pointer(t)) }

const errBufSize = 1024

// dlopen opens path RTLD_NOW|RTLD_LOCAL. The error names path.
func dlopen(path string) (library, error) {
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
	return library(h), nil
}

// bind looks name up in h into slot fn, which it clears first, and reports
// whether the symbol was found.
func (t *table) bind(fn int, h library, name string) bool {
	var buf [errBufSize]C.char
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.umbp_bind(t.c(), C.int(fn), unsafe.Pointer(h), cname, &buf[0], C.size_t(len(buf))) == 0
}

// has reports whether slot fn is bound.
func (t *table) has(fn int) bool { return t.fn[fn] != nil }

// errorString returns the runtime's text for code, from the driver's call
// when driver is set; "" when there is none.
func (t *table) errorString(driver bool, code int) string {
	drv := C.int(0)
	if driver {
		drv = 1
	}
	if s := C.umbp_error_string(t.c(), drv, C.int(code)); s != nil {
		return C.GoString(s)
	}
	return ""
}

func (t *table) initialize() rc { return rcOf(C.umbp_init(t.c())) }

func (t *table) runtimeVersion() (int, rc) {
	var v C.int
	r := C.umbp_runtime_version(t.c(), &v)
	return int(v), rcOf(r)
}

func (t *table) deviceCount() (int, rc) {
	var n C.int
	r := C.umbp_device_count(t.c(), &n)
	return int(n), rcOf(r)
}

func (t *table) setDevice(dev int) rc { return rcOf(C.umbp_set_device(t.c(), C.int(dev))) }

func (t *table) getDevice() (int, rc) {
	var d C.int
	r := C.umbp_get_device(t.c(), &d)
	return int(d), rcOf(r)
}

func (t *table) malloc(dev int, size uint64) (uintptr, rc) {
	var p C.uintptr_t
	r := C.umbp_malloc(t.c(), C.int(dev), C.size_t(size), &p)
	return uintptr(p), rcOf(r)
}

func (t *table) free(dev int, p uintptr) rc {
	return rcOf(C.umbp_free(t.c(), C.int(dev), C.uintptr_t(p)))
}

func (t *table) hostRegister(p uintptr, n uint64, flags uint32) rc {
	return rcOf(C.umbp_host_register(t.c(), C.uintptr_t(p), C.size_t(n), C.uint(flags)))
}

func (t *table) hostUnregister(p uintptr) rc {
	return rcOf(C.umbp_host_unregister(t.c(), C.uintptr_t(p)))
}

func (t *table) memcpy(dev int, dst, src uintptr, n uint64, kind MemcpyKind) rc {
	return rcOf(C.umbp_memcpy(t.c(), C.int(dev), C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), C.int(kind)))
}

func (t *table) memcpyAsync(dev int, dst, src uintptr, n uint64, kind MemcpyKind, s Stream) rc {
	return rcOf(C.umbp_memcpy_async(t.c(), C.int(dev), C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n),
		C.int(kind), C.uintptr_t(s)))
}

// memcpyToDevice copies src, which must not be empty, to dst.
func (t *table) memcpyToDevice(dev int, dst uintptr, src []byte) rc {
	return rcOf(C.umbp_memcpy_to_device(t.c(), C.int(dev), C.uintptr_t(dst), unsafe.Pointer(&src[0]),
		C.size_t(len(src))))
}

// memcpyFromDevice copies src into dst, which must not be empty.
func (t *table) memcpyFromDevice(dev int, dst []byte, src uintptr) rc {
	return rcOf(C.umbp_memcpy_from_device(t.c(), C.int(dev), unsafe.Pointer(&dst[0]), C.uintptr_t(src),
		C.size_t(len(dst))))
}

// memcpyBatchAsync makes one batched call for dsts, srcs and sizes, which
// must be of one length, not zero.
func (t *table) memcpyBatchAsync(dev, version int, dsts, srcs []uintptr, sizes []uint64, kind MemcpyKind, flags uint32, s Stream) rc {
	return rcOf(C.umbp_memcpy_batch_async(t.c(), C.int(dev), C.int(version),
		(*C.uintptr_t)(unsafe.Pointer(&dsts[0])), (*C.uintptr_t)(unsafe.Pointer(&srcs[0])),
		(*C.size_t)(unsafe.Pointer(&sizes[0])), C.size_t(len(dsts)), C.int(kind), C.uint(flags), C.uintptr_t(s)))
}

func (t *table) streamCreate(dev int, flags uint32) (Stream, rc) {
	var s C.uintptr_t
	r := C.umbp_stream_create(t.c(), C.int(dev), C.uint(flags), &s)
	return Stream(s), rcOf(r)
}

func (t *table) eventCreate(dev int, flags uint32) (Event, rc) {
	var e C.uintptr_t
	r := C.umbp_event_create(t.c(), C.int(dev), C.uint(flags), &e)
	return Event(e), rcOf(r)
}

func (t *table) eventRecord(dev int, ev Event, s Stream) rc {
	return rcOf(C.umbp_event_record(t.c(), C.int(dev), C.uintptr_t(ev), C.uintptr_t(s)))
}

// handleOp calls slot fn, a function of one handle (a stream, an event or
// an IPC mapping), on device dev.
func (t *table) handleOp(dev, fn int, h uintptr) rc {
	return rcOf(C.umbp_handle_op(t.c(), C.int(dev), C.int(fn), C.uintptr_t(h)))
}

func (t *table) deviceSynchronize(dev int) rc {
	return rcOf(C.umbp_device_synchronize(t.c(), C.int(dev)))
}

func (t *table) pointerAttributes(p uintptr, buf *[pointerAttributesSize]byte) rc {
	return rcOf(C.umbp_pointer_attributes(t.c(), C.uintptr_t(p), unsafe.Pointer(buf)))
}

func (t *table) addressRange(dev int, p uintptr) (uintptr, uint64, rc) {
	var base C.uintptr_t
	var size C.size_t
	r := C.umbp_address_range(t.c(), C.int(dev), C.uintptr_t(p), &base, &size)
	return uintptr(base), uint64(size), rcOf(r)
}

func (t *table) ipcGet(dev int, p uintptr) (IpcMemHandle, rc) {
	var h IpcMemHandle
	r := C.umbp_ipc_get(t.c(), C.int(dev), C.uintptr_t(p), unsafe.Pointer(&h[0]))
	return h, rcOf(r)
}

func (t *table) ipcOpen(dev int, h *IpcMemHandle, flags uint32) (uintptr, rc) {
	var p C.uintptr_t
	r := C.umbp_ipc_open(t.c(), C.int(dev), unsafe.Pointer(&h[0]), C.uint(flags), &p)
	return uintptr(p), rcOf(r)
}

// Package hip is a small binding to the GPU runtime, loaded at run time with
// dlopen so that the library builds, links and runs on machines without a GPU
// or a GPU software stack.
//
// The AMD HIP runtime (libamdhip64) is preferred. Where it is absent or finds
// no device, the NVIDIA CUDA runtime (libcudart) is used instead, together
// with the CUDA driver (libcuda) for the one call the runtime lacks. Both
// vendors sit behind the same API: callers see one [Runtime] and one set of
// constants, whichever was loaded.
//
// Nothing is linked at build time but libdl. Every runtime entry point is
// looked up with dlsym into a table and called through a small C function;
// a missing library or symbol makes [Load] fail with an error matching
// [ErrNotSupported], never a crash. Libraries are opened RTLD_NOW|RTLD_LOCAL
// and never closed.
//
// The runtimes keep the "current device" per OS thread, and goroutines move
// between threads. Every method that needs a device therefore takes it as an
// argument and selects it inside the same C call that performs the operation.
// A negative device leaves the calling thread's current device untouched.
//
// Pointers are plain uintptr values: device memory, and host memory that is
// not managed by the Go heap (mmap, memfd). Passing the address of Go-heap
// memory as a uintptr is the caller's responsibility; [Runtime.CopyToDevice]
// and [Runtime.CopyFromDevice] take Go byte slices safely.
package hip

import (
	"encoding/binary"
	"fmt"

	"github.com/umbp-go/umbp-go/internal/errdefs"
)

// ErrNotSupported reports that no usable GPU runtime could be loaded: no
// library, a missing symbol, no device, or a build without cgo. Errors from
// [Load] and [Open] wrap it; match with errors.Is.
var ErrNotSupported = errdefs.ErrNotSupported

// Vendor names the runtime that was loaded.
type Vendor string

// The vendors a [Runtime] can be.
const (
	// VendorHIP is AMD's HIP runtime (libamdhip64).
	VendorHIP Vendor = "hip"
	// VendorCUDA is NVIDIA's CUDA runtime (libcudart) with the driver (libcuda).
	VendorCUDA Vendor = "cuda"
)

// MemoryType says where memory behind a pointer lives, as decoded from the
// runtime's pointer attributes. Its values are this package's own, the same
// for both vendors and every runtime version.
type MemoryType int

// Memory types reported by [Runtime.PointerInfo].
const (
	// MemoryUnregistered is host memory the runtime does not know about
	// (plain malloc or mmap memory), or an address no allocation covers.
	MemoryUnregistered MemoryType = iota
	// MemoryHost is host memory registered with or allocated by the runtime
	// (pinned, page-locked).
	MemoryHost
	// MemoryDevice is device memory.
	MemoryDevice
	// MemoryManaged is managed (unified) memory, migrated on demand.
	MemoryManaged
)

// String returns the memory type's name.
func (m MemoryType) String() string {
	switch m {
	case MemoryUnregistered:
		return "unregistered"
	case MemoryHost:
		return "host"
	case MemoryDevice:
		return "device"
	case MemoryManaged:
		return "managed"
	}
	return fmt.Sprintf("MemoryType(%d)", int(m))
}

// MemcpyKind is the direction of a copy. Its values are those of
// hipMemcpyKind and cudaMemcpyKind, which agree.
type MemcpyKind int

// Copy directions.
const (
	// MemcpyHostToHost copies host to host.
	MemcpyHostToHost MemcpyKind = 0
	// MemcpyHostToDevice copies host to device.
	MemcpyHostToDevice MemcpyKind = 1
	// MemcpyDeviceToHost copies device to host.
	MemcpyDeviceToHost MemcpyKind = 2
	// MemcpyDeviceToDevice copies device to device.
	MemcpyDeviceToDevice MemcpyKind = 3
	// MemcpyDefault lets the runtime infer the direction from the addresses.
	MemcpyDefault MemcpyKind = 4
)

// String returns the copy direction's name.
func (k MemcpyKind) String() string {
	switch k {
	case MemcpyHostToHost:
		return "HtoH"
	case MemcpyHostToDevice:
		return "HtoD"
	case MemcpyDeviceToHost:
		return "DtoH"
	case MemcpyDeviceToDevice:
		return "DtoD"
	case MemcpyDefault:
		return "default"
	}
	return fmt.Sprintf("MemcpyKind(%d)", int(k))
}

// Stream is a runtime stream handle. The zero Stream is the default (null)
// stream.
type Stream uintptr

// Event is a runtime event handle.
type Event uintptr

// IpcHandleSize is the size in bytes of an IPC memory handle on both vendors.
const IpcHandleSize = 64

// IpcMemHandle is an inter-process memory handle (hipIpcMemHandle_t,
// cudaIpcMemHandle_t). It names the whole allocation that holds the pointer
// it was made from, and opens to that allocation's base.
type IpcMemHandle [IpcHandleSize]byte

// Flags passed to the runtime. Their values agree between HIP and CUDA.
const (
	// IpcMemLazyEnablePeerAccess is the flag passed to IpcOpenMemHandle, the
	// only one both runtimes accept.
	IpcMemLazyEnablePeerAccess = 1
	// StreamNonBlocking is the flag StreamCreate uses: the stream does not
	// synchronise with the legacy default stream.
	StreamNonBlocking = 1
	// EventDisableTiming is the flag EventCreate uses.
	EventDisableTiming = 2
	// HostRegisterDefault is the flag HostRegister uses.
	HostRegisterDefault = 0
	// HostRegisterPortable makes a host registration count as pinned for
	// every device's context, not only the one current when registering.
	HostRegisterPortable = 1
)

// errInvalidValue is hipErrorInvalidValue and cudaErrorInvalidValue.
const errInvalidValue = 1

// errNotReady is hipErrorNotReady and cudaErrorNotReady.
const errNotReady = 600

// cudaErrorNotSupported and cudaErrorCallRequiresNewerDriver: the runtime
// or driver cannot make the call at all.
const (
	errCUDANotSupported        = 801
	errCUDARequiresNewerDriver = 36
)

// pointerAttributesSize is the zeroed buffer handed to the pointer-attribute
// call: larger than HIP's struct (32 bytes) and CUDA 13's (88 bytes).
const pointerAttributesSize = 128

// Error is a failed runtime call: the call's name (hipMalloc, cudaMalloc,
// cuMemGetAddressRange_v2, ...), the numeric code it returned and the
// runtime's text for that code.
type Error struct {
	// Op is the runtime function that failed.
	Op string
	// Code is the hipError_t, cudaError_t or CUresult it returned.
	Code int
	// Msg is the runtime's description of Code; empty when unavailable.
	Msg string
}

// Error formats as "hipIpcOpenMemHandle: error 201 (invalid device context)".
func (e *Error) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("%s: error %d", e.Op, e.Code)
	}
	return fmt.Sprintf("%s: error %d (%s)", e.Op, e.Code, e.Msg)
}

// hipROCm6Version is the first hipRuntimeGetVersion value of ROCm 6
// (HIP_VERSION = major*10000000 + minor*100000 + patch).
const hipROCm6Version = 60000000

// decodeMemoryType maps a runtime's raw memory type to a MemoryType. HIP
// before ROCm 6 numbered Host 0, Device 1, Array 2, Unified 3, Managed 4; ROCm
// 6 numbers Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11;
// CUDA numbers Unregistered 0, Host 1, Device 2, Managed 3. HIP's isManaged
// field turns host or device memory into managed memory. ok is false for
// values the runtime does not define.
func decodeMemoryType(v Vendor, version int, raw int32, isManaged bool) (mt MemoryType, ok bool) {
	switch {
	case v == VendorCUDA:
		switch raw {
		case 0:
			return MemoryUnregistered, true
		case 1:
			return MemoryHost, true
		case 2:
			return MemoryDevice, true
		case 3:
			return MemoryManaged, true
		}
		return 0, false
	case v == VendorHIP && version >= hipROCm6Version:
		switch raw {
		case 0:
			return MemoryUnregistered, true
		case 1:
			mt = MemoryHost
		case 2, 10:
			mt = MemoryDevice
		case 3, 11:
			return MemoryManaged, true
		default:
			return 0, false
		}
	case v == VendorHIP:
		switch raw {
		case 0:
			mt = MemoryHost
		case 1, 2:
			mt = MemoryDevice
		case 3, 4:
			return MemoryManaged, true
		default:
			return 0, false
		}
	default:
		return 0, false
	}
	if isManaged {
		return MemoryManaged, true
	}
	return mt, true
}

// decodePointerAttributes reads the fields this package uses from the
// buffer the pointer-attribute call filled: the int type at offset 0, the int
// device at 4 and, for HIP, the int isManaged at 24 (after the two pointers).
// The device is -1 for unregistered memory.
func decodePointerAttributes(v Vendor, version int, buf *[pointerAttributesSize]byte) (mt MemoryType, device int, ok bool) {
	raw := int32(binary.NativeEndian.Uint32(buf[0:4]))
	device = int(int32(binary.NativeEndian.Uint32(buf[4:8])))
	managed := v == VendorHIP && binary.NativeEndian.Uint32(buf[24:28]) != 0
	mt, ok = decodeMemoryType(v, version, raw, managed)
	if !ok {
		return 0, -1, false
	}
	if mt == MemoryUnregistered {
		device = -1
	}
	return mt, device, true
}

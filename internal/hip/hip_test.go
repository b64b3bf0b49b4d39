package hip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

func TestErrorFormat(t *testing.T) {
	e := &Error{Op: "hipIpcOpenMemHandle", Code: 201, Msg: "invalid device context"}
	if got, want := e.Error(), "hipIpcOpenMemHandle: error 201 (invalid device context)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = &Error{Op: "cuMemGetAddressRange_v2", Code: 500}
	if got, want := e.Error(), "cuMemGetAddressRange_v2: error 500"; got != want {
		t.Errorf("Error() without text = %q, want %q", got, want)
	}

	wrapped := fmt.Errorf("register region: %w", &Error{Op: "cudaMalloc", Code: 2, Msg: "out of memory"})
	var got *Error
	if !errors.As(wrapped, &got) {
		t.Fatalf("errors.As(%v, *Error) = false", wrapped)
	}
	if got.Op != "cudaMalloc" || got.Code != 2 {
		t.Errorf("errors.As gave %+v", got)
	}
	if errors.Is(wrapped, ErrNotSupported) {
		t.Errorf("a runtime call's error matches ErrNotSupported")
	}
}

func TestStrings(t *testing.T) {
	for mt, want := range map[MemoryType]string{
		MemoryUnregistered: "unregistered", MemoryHost: "host", MemoryDevice: "device",
		MemoryManaged: "managed", MemoryType(9): "MemoryType(9)",
	} {
		if got := mt.String(); got != want {
			t.Errorf("MemoryType(%d).String() = %q, want %q", int(mt), got, want)
		}
	}
	for k, want := range map[MemcpyKind]string{
		MemcpyHostToHost: "HtoH", MemcpyHostToDevice: "HtoD", MemcpyDeviceToHost: "DtoH",
		MemcpyDeviceToDevice: "DtoD", MemcpyDefault: "default", MemcpyKind(7): "MemcpyKind(7)",
	} {
		if got := k.String(); got != want {
			t.Errorf("MemcpyKind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

func TestConstants(t *testing.T) {
	// Values both vendors' headers define; the C side passes them through.
	checks := []struct {
		name      string
		got, want int
	}{
		{"MemcpyHostToDevice", int(MemcpyHostToDevice), 1},
		{"MemcpyDeviceToHost", int(MemcpyDeviceToHost), 2},
		{"MemcpyDeviceToDevice", int(MemcpyDeviceToDevice), 3},
		{"MemcpyDefault", int(MemcpyDefault), 4},
		{"IpcMemLazyEnablePeerAccess", IpcMemLazyEnablePeerAccess, 1},
		{"StreamNonBlocking", StreamNonBlocking, 1},
		{"EventDisableTiming", EventDisableTiming, 2},
		{"HostRegisterDefault", HostRegisterDefault, 0},
		{"HostRegisterPortable", HostRegisterPortable, 1},
		{"IpcHandleSize", IpcHandleSize, 64},
		{"len(IpcMemHandle)", len(IpcMemHandle{}), 64},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

const (
	rocm5 = 50731921 // ROCm 5.7.1
	rocm6 = 60032830 // ROCm 6.0.0
	rocm7 = 70051831 // ROCm 7.0
)

func TestDecodeMemoryType(t *testing.T) {
	type row struct {
		v       Vendor
		version int
		raw     int32
		managed bool
		want    MemoryType
		ok      bool
	}
	rows := []row{
		// ROCm 5: Host 0, Device 1, Array 2, Unified 3, Managed 4.
		{VendorHIP, rocm5, 0, false, MemoryHost, true},
		{VendorHIP, rocm5, 1, false, MemoryDevice, true},
		{VendorHIP, rocm5, 2, false, MemoryDevice, true},
		{VendorHIP, rocm5, 3, false, MemoryManaged, true},
		{VendorHIP, rocm5, 4, false, MemoryManaged, true},
		{VendorHIP, rocm5, 1, true, MemoryManaged, true},
		{VendorHIP, rocm5, 0, true, MemoryManaged, true},
		{VendorHIP, rocm5, 5, false, 0, false},
		{VendorHIP, rocm5, -1, false, 0, false},
		// ROCm 6 and later: Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11.
		{VendorHIP, rocm6, 0, false, MemoryUnregistered, true},
		{VendorHIP, rocm6, 1, false, MemoryHost, true},
		{VendorHIP, rocm6, 2, false, MemoryDevice, true},
		{VendorHIP, rocm6, 3, false, MemoryManaged, true},
		{VendorHIP, rocm6, 10, false, MemoryDevice, true},
		{VendorHIP, rocm6, 11, false, MemoryManaged, true},
		{VendorHIP, rocm6, 2, true, MemoryManaged, true},
		{VendorHIP, rocm6, 0, true, MemoryUnregistered, true},
		{VendorHIP, rocm6, 4, false, 0, false},
		{VendorHIP, hipROCm6Version, 1, false, MemoryHost, true},
		{VendorHIP, hipROCm6Version - 1, 1, false, MemoryDevice, true},
		{VendorHIP, rocm7, 2, false, MemoryDevice, true},
		// CUDA: Unregistered 0, Host 1, Device 2, Managed 3.
		{VendorCUDA, 13000, 0, false, MemoryUnregistered, true},
		{VendorCUDA, 13000, 1, false, MemoryHost, true},
		{VendorCUDA, 12080, 2, false, MemoryDevice, true},
		{VendorCUDA, 13000, 3, false, MemoryManaged, true},
		{VendorCUDA, 13000, 2, true, MemoryDevice, true}, // no isManaged field on CUDA
		{VendorCUDA, 13000, 10, false, 0, false},
		{Vendor("other"), 0, 1, false, 0, false},
	}
	for _, r := range rows {
		got, ok := decodeMemoryType(r.v, r.version, r.raw, r.managed)
		if got != r.want || ok != r.ok {
			t.Errorf("decodeMemoryType(%s, %d, %d, managed=%v) = %v, %v; want %v, %v",
				r.v, r.version, r.raw, r.managed, got, ok, r.want, r.ok)
		}
	}
}

func attrBuf(typ, device, isManaged int32, fill byte) *[pointerAttributesSize]byte {
	var b [pointerAttributesSize]byte
	for i := range b {
		b[i] = fill
	}
	binary.NativeEndian.PutUint32(b[0:], uint32(typ))
	binary.NativeEndian.PutUint32(b[4:], uint32(device))
	binary.NativeEndian.PutUint32(b[24:], uint32(isManaged))
	return &b
}

func TestDecodePointerAttributes(t *testing.T) {
	type row struct {
		name    string
		v       Vendor
		version int
		buf     *[pointerAttributesSize]byte
		want    MemoryType
		dev     int
		ok      bool
	}
	rows := []row{
		{"hip6 device", VendorHIP, rocm6, attrBuf(2, 3, 0, 0), MemoryDevice, 3, true},
		{"hip6 host", VendorHIP, rocm6, attrBuf(1, 0, 0, 0), MemoryHost, 0, true},
		{"hip6 unregistered", VendorHIP, rocm6, attrBuf(0, 0, 0, 0), MemoryUnregistered, -1, true},
		{"hip6 managed flag", VendorHIP, rocm6, attrBuf(2, 1, 1, 0), MemoryManaged, 1, true},
		{"hip5 device", VendorHIP, rocm5, attrBuf(1, 7, 0, 0), MemoryDevice, 7, true},
		{"hip5 host", VendorHIP, rocm5, attrBuf(0, 0, 0, 0), MemoryHost, 0, true},
		{"cuda device, garbage after offset 8", VendorCUDA, 13000, attrBuf(2, 1, 1, 0xa5), MemoryDevice, 1, true},
		{"cuda unregistered device -2", VendorCUDA, 13000, attrBuf(0, -2, 0, 0), MemoryUnregistered, -1, true},
		{"cuda unknown", VendorCUDA, 13000, attrBuf(9, 0, 0, 0), 0, -1, false},
	}
	for _, r := range rows {
		mt, dev, ok := decodePointerAttributes(r.v, r.version, r.buf)
		if mt != r.want || dev != r.dev || ok != r.ok {
			t.Errorf("%s: got %v, %d, %v; want %v, %d, %v", r.name, mt, dev, ok, r.want, r.dev, r.ok)
		}
	}
}

package server

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveNTCopy: the CPU has the 256-bit loads and non-temporal stores
// ntCopy uses.
var haveNTCopy = cpu.X86.HasAVX2

// ntCopy copies n bytes, a non-zero multiple of 128, from src to dst, which
// is 32-byte aligned, with non-temporal stores (copynt_amd64.s). The
// regions must not overlap.
//
//go:noescape
func ntCopy(dst, src *byte, n uintptr)

// copyCold copies src to dst, of the same length, with stores that bypass
// the cache where the CPU has them; short or overlapping regions (which the
// server never copies between) go as copy copies them.
func copyCold(dst, src []byte) {
	n := min(len(dst), len(src))
	if !haveNTCopy || n < 2*ntBlock || overlap(dst[:n], src[:n]) {
		copy(dst, src)
		return
	}
	head := int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst))) & 31)
	body := (n - head) &^ (ntBlock - 1)
	copy(dst[:head], src[:head])
	ntCopy(&dst[head], &src[head], uintptr(body))
	copy(dst[head+body:n], src[head+body:n])
}

// ntBlock is what ntCopy copies at a time.
const ntBlock = 128

// overlap reports whether a and b (non-empty) share a byte.
func overlap(a, b []byte) bool {
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

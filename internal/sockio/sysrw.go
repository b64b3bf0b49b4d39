//go:build !race

package sockio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// sysRead and sysWrite are one read and one write of a non-blocking
// socket, as raw system calls (IO).
func sysRead(fd uintptr, b []byte) (int, unix.Errno) {
	r, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(r), e
}

func sysWrite(fd uintptr, b []byte) (int, unix.Errno) {
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(r), e
}

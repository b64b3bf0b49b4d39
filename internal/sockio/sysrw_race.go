//go:build race

package sockio

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// sysRead and sysWrite under the race detector: syscall's Read and Write,
// which tell it what the kernel read and wrote (a raw system call does
// not), with the runtime's system-call entry that IO otherwise skips.
func sysRead(fd uintptr, b []byte) (int, unix.Errno) {
	n, err := syscall.Read(int(fd), b)
	return n, errnoOf(err)
}

func sysWrite(fd uintptr, b []byte) (int, unix.Errno) {
	n, err := syscall.Write(int(fd), b)
	return n, errnoOf(err)
}

func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	return err.(syscall.Errno)
}

//go:build linux

package soft

import (
	"syscall"
	"unsafe"
)

// readvFD is readv(2) into two buffers, without allocating: the iovec
// array lives on the stack and points at memory the caller keeps alive.
func readvFD(fd int, bufs *[2][]byte) (int, error) {
	var iov [2]syscall.Iovec
	n := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		iov[n].Base = &b[0]
		iov[n].SetLen(len(b))
		n++
	}
	r, _, e := syscall.Syscall(syscall.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

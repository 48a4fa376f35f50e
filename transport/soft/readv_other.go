//go:build !linux

package soft

import "syscall"

// readvFD falls back to read(2) of the first buffer.
func readvFD(fd int, bufs *[2][]byte) (int, error) {
	return syscall.Read(fd, bufs[0])
}

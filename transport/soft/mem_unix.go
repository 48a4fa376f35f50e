//go:build unix

package soft

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/transport"
)

// mapMemory returns length bytes of zeroed anonymous memory outside the Go
// heap, rounded up to whole pages (the mapping; the caller slices it).
func mapMemory(length int) ([]byte, error) {
	page := os.Getpagesize()
	size := (length + page - 1) &^ (page - 1)
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("soft: map %d bytes: %v: %w", size, err, transport.ErrInsufficientResources)
	}
	return b, nil
}

// unmapMemory gives a mapping from mapMemory back. After it, any access
// to the memory faults: the reason an owned region is unmapped only when
// it is closed and unpinned.
func unmapMemory(b []byte) {
	if err := unix.Munmap(b); err != nil {
		panic(fmt.Sprintf("soft: unmap %d bytes at %p: %v", len(b), &b[0], err))
	}
}

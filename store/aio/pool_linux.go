//go:build linux

package aio

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Defaults of a Pool, each with its reason.
const (
	// DefaultBufSize is a buffer's size: 128 KiB, the target's MDTS
	// (target/tcp.DefaultMaxTransfer), so one buffer holds the largest
	// transfer of one command and a command never needs two.
	DefaultBufSize = 128 << 10
	// DefaultBufCount is the buffers of one pool: DefaultDepth (64), one
	// per request an engine holds in flight, 8 MiB per poll group: the
	// same as target/tcp's large buffers (64 × 128 KiB), which this pool
	// is meant to become.
	DefaultBufCount = DefaultDepth
)

// Pool is a fixed set of equal, page-aligned buffers carved from one
// anonymous mapping made once. The mapping is outside the Go heap: the
// collector never moves or frees it, so the disk may write into a buffer
// while no Go pointer refers to it, and every buffer is aligned for
// O_DIRECT by construction. One goroutine (a poll group) owns a Pool:
// Get and Put are a slice push and pop, no atomics, no lock.
type Pool struct {
	mem  []byte
	size int
	held []bool
	free []int32
}

// NewPool maps count buffers of size bytes (size a multiple of Align;
// 0 and 0 take the defaults).
func NewPool(size, count int) (*Pool, error) {
	if size == 0 {
		size = DefaultBufSize
	}
	if count == 0 {
		count = DefaultBufCount
	}
	if size < 0 || size%Align != 0 || size > MaxIO {
		return nil, fmt.Errorf("%w: pool buffer size %d (a multiple of %d up to %d)", ErrAlign, size, Align, MaxIO)
	}
	if count < 1 || count > 1<<20 {
		return nil, fmt.Errorf("aio: pool of %d buffers (1..%d)", count, 1<<20)
	}
	mem, err := unix.Mmap(-1, 0, size*count, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("aio: map %d buffers of %d bytes: %w", count, size, err)
	}
	p := &Pool{mem: mem, size: size, held: make([]bool, count), free: make([]int32, count)}
	for i := range p.free {
		p.free[i] = int32(count - 1 - i)
	}
	return p, nil
}

// Get takes a free buffer: its index and its bytes (len Size); ok is
// false when all are held.
func (p *Pool) Get() (idx int32, buf []byte, ok bool) {
	n := len(p.free)
	if n == 0 {
		return -1, nil, false
	}
	idx = p.free[n-1]
	p.free = p.free[:n-1]
	p.held[idx] = true
	return idx, p.Buf(idx), true
}

// Put gives buffer idx back. Giving back one that is not held is a bug
// (one buffer serving two commands) and panics.
func (p *Pool) Put(idx int32) {
	if idx < 0 || int(idx) >= len(p.held) || !p.held[idx] {
		panic(fmt.Sprintf("aio: pool buffer %d given back but not held", idx))
	}
	p.held[idx] = false
	p.free = append(p.free, idx)
}

// Buf is buffer idx's bytes.
func (p *Pool) Buf(idx int32) []byte {
	off := int(idx) * p.size
	return p.mem[off : off+p.size : off+p.size]
}

// Size is one buffer's size; Free the buffers not held.
func (p *Pool) Size() int { return p.size }
func (p *Pool) Free() int { return len(p.free) }

// Close unmaps the pool. No buffer may be in flight: the disk would
// write into memory the process no longer owns.
func (p *Pool) Close() error {
	if p.mem == nil {
		return nil
	}
	err := unix.Munmap(p.mem)
	p.mem = nil
	return err
}

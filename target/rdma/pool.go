package rdma

import (
	"fmt"
	"sync/atomic"

	"github.com/blk-project/blk/transport"
)

// dataBuf is one registered data buffer: the sink of an RDMA READ (host
// write data) or the source of an RDMA WRITE (host read data).
type dataBuf struct {
	pool  *pool
	index int32
	held  atomic.Bool
	data  []byte
	sge   transport.SGE
}

// pool is a fixed set of equal data buffers in one registered region. Its
// free list is a lock-free stack linked through next (index+1; 0 is
// empty). Any goroutine may put; only the owning core's notification
// goroutine gets, so the stack has no ABA problem (a popped entry cannot
// be popped and pushed back by anyone else while get looks at it).
type pool struct {
	mr   transport.MemoryRegion
	size uint32 // of every buffer
	bufs []dataBuf
	next []int32
	head atomic.Int32
	free atomic.Int32
}

func newPool(pd transport.PD, n, size uint32) (*pool, error) {
	p := &pool{size: size, bufs: make([]dataBuf, n), next: make([]int32, n)}
	if n == 0 {
		return p, nil
	}
	// Remote write: an iWARP RDMA READ response is a tagged write into
	// the sink. Remote read is not needed: the target only reads from
	// the host and writes to it. Provider-owned memory: the pool is
	// closed with the port, after every queue drained (Port.Close waits
	// for each connection's teardown, which waits for Queue.Drained).
	mr, err := pd.AllocateMemory(int(n)*int(size), transport.AccessLocalWrite|transport.AccessRemoteWrite)
	if err != nil {
		return nil, fmt.Errorf("register %d data buffers of %d bytes: %w", n, size, err)
	}
	p.mr = mr
	reg := mr.Bytes()
	for i := range p.bufs {
		off := uint32(i) * size
		b := &p.bufs[i]
		b.pool = p
		b.index = int32(i)
		b.data = reg[off : off+size : off+size]
		b.sge = mr.SGE(off, size)
		p.push(b)
	}
	return p, nil
}

// get takes a free buffer or returns nil. Owning core only.
func (p *pool) get() *dataBuf {
	for {
		h := p.head.Load()
		if h == 0 {
			return nil
		}
		b := &p.bufs[h-1]
		if p.head.CompareAndSwap(h, p.next[h-1]) {
			b.held.Store(true)
			p.free.Add(-1)
			return b
		}
	}
}

// put gives a buffer back; any goroutine. Giving one back twice panics:
// it would hand one buffer to two commands.
func (p *pool) put(b *dataBuf) {
	if !b.held.CompareAndSwap(true, false) {
		panic(fmt.Sprintf("rdma: data buffer %d given back twice", b.index))
	}
	p.push(b)
}

func (p *pool) push(b *dataBuf) {
	p.free.Add(1)
	for {
		h := p.head.Load()
		p.next[b.index] = h
		if p.head.CompareAndSwap(h, b.index+1) {
			return
		}
	}
}

func (p *pool) close() error {
	if p.mr == nil {
		return nil
	}
	return p.mr.Close()
}

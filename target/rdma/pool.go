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
	// frmr is the buffer's fast-register region (ReadSinkPerRead): each
	// READ into the buffer registers it there, for that READ alone. lent
	// says a registration may still be live: set when the fast-register
	// is posted, cleared once the invalidate after it is known to have
	// run (the response SEND behind it completed); a buffer given back
	// while lent gets a fresh region instead (renew), so that no key a
	// host saw outlives its command.
	frmr transport.MemoryRegion
	lent bool
}

// pool is a fixed set of equal data buffers in one registered region. Its
// free list is a lock-free stack linked through next (index+1; 0 is
// empty). Any goroutine may put; only the owning core's notification
// goroutine gets, so the stack has no ABA problem (a popped entry cannot
// be popped and pushed back by anyone else while get looks at it).
type pool struct {
	mr   transport.MemoryRegion
	pd   transport.PD
	size uint32 // of every buffer
	bufs []dataBuf
	next []int32
	head atomic.Int32
	free atomic.Int32
	lost atomic.Int32 // buffers dropped: their region could not be renewed
	// reserve of the buffers are for fused seconds only (getAny).
	reserve int32
}

// newPool makes a pool of n buffers and, when n > 0, reserve more
// (Config.FusedReserve).
func newPool(pd transport.PD, n, reserve, size uint32, sink ReadSink) (*pool, error) {
	if n == 0 {
		return &pool{pd: pd, size: size}, nil
	}
	n += reserve
	p := &pool{pd: pd, size: size, bufs: make([]dataBuf, n), next: make([]int32, n), reserve: int32(reserve)}
	// Local write only, unless the adapter is iWARP without fast
	// registration (ReadSinkShared): there an RDMA READ response, a
	// tagged write into the sink, needs the sink remotely writable.
	// Remote read is never needed: the target only reads from the host
	// and writes to it. Provider-owned memory: the pool is closed with
	// the port, after every queue drained (Port.Close waits for each
	// connection's teardown, which waits for Queue.Drained).
	access := transport.AccessLocalWrite
	if sink == ReadSinkShared {
		access |= transport.AccessRemoteWrite
	}
	mr, err := pd.AllocateMemory(int(n)*int(size), access)
	if err != nil {
		return nil, fmt.Errorf("register %d data buffers of %d bytes: %w", n, size, err)
	}
	p.mr = mr
	if sink == ReadSinkPerRead {
		if _, ok := pd.(transport.FastRegisterPD); !ok {
			return nil, fmt.Errorf("register %d data buffers: the adapter reports fast registration, but its PD cannot fast-register", n)
		}
	}
	reg := mr.Bytes()
	for i := range p.bufs {
		off := uint32(i) * size
		b := &p.bufs[i]
		b.pool = p
		b.index = int32(i)
		b.data = reg[off : off+size : off+size]
		b.sge = mr.SGE(off, size)
		if sink == ReadSinkPerRead {
			if b.frmr, err = pd.(transport.FastRegisterPD).AllocateMR(size); err != nil {
				p.close()
				return nil, fmt.Errorf("fast-register region %d of %d bytes: %w", i, size, err)
			}
		}
		p.push(b)
	}
	return p, nil
}

// renew replaces the fast-register region of a buffer whose last
// registration may still be live (its command failed between the
// fast-register and the invalidate): closing the region retires every
// key it had. It reports whether the buffer may be used again.
func (p *pool) renew(b *dataBuf) bool {
	_ = b.frmr.Close()
	var err error
	b.frmr, err = p.pd.(transport.FastRegisterPD).AllocateMR(p.size)
	if err != nil {
		b.frmr = nil
		return false
	}
	b.lent = false
	return true
}

// release gives a buffer back after its command, renewing its
// fast-register region first if a registration may be live (lent). A
// buffer whose region cannot be renewed is dropped from the pool
// (counted in lost) rather than lent again with a live key.
func (p *pool) release(b *dataBuf) {
	if b.lent && !p.renew(b) {
		p.lost.Add(1)
		if !b.held.CompareAndSwap(true, false) {
			panic(fmt.Sprintf("rdma: data buffer %d given back twice", b.index))
		}
		return
	}
	p.put(b)
}

// get takes a free buffer, not of the reserve, or returns nil. Owning
// core only.
func (p *pool) get() *dataBuf {
	if p.free.Load() <= p.reserve {
		return nil
	}
	return p.getAny()
}

// getAny takes a free buffer, the reserve's too (a fused second whose
// first waits), or returns nil. Owning core only.
func (p *pool) getAny() *dataBuf {
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
	for i := range p.bufs {
		if m := p.bufs[i].frmr; m != nil {
			_ = m.Close()
		}
	}
	return p.mr.Close()
}

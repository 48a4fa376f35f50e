//go:build linux

package tcp

import "fmt"

// dataBuf is one data buffer: the destination of a host's write data
// (read from the socket straight into it) or the source of read data
// (written to the socket from it).
type dataBuf struct {
	pool *pool
	idx  int32
	held bool
	data []byte
}

// pool is a fixed set of equal data buffers carved from one allocation,
// owned by one poll group: only its goroutine takes and gives back, so
// the free list is a plain stack (no atomics, no lock). Nothing is
// registered: TCP moves data through the kernel's socket buffers.
type pool struct {
	size uint32
	bufs []dataBuf
	free []int32
	// reserve of the buffers are for fused seconds only (getAny).
	reserve int
}

// newPool makes a pool of n buffers and reserve more (Config.FusedReserve).
func newPool(n, reserve, size uint32) *pool {
	n += reserve
	p := &pool{size: size, bufs: make([]dataBuf, n), free: make([]int32, 0, n), reserve: int(reserve)}
	mem := make([]byte, uint64(n)*uint64(size))
	for i := range p.bufs {
		off := uint64(i) * uint64(size)
		p.bufs[i] = dataBuf{pool: p, idx: int32(i), data: mem[off : off+uint64(size) : off+uint64(size)]}
		p.free = append(p.free, int32(len(p.bufs)-1-i))
	}
	return p
}

// get takes a free buffer, not of the reserve, or returns nil.
func (p *pool) get() *dataBuf {
	if len(p.free) <= p.reserve {
		return nil
	}
	return p.getAny()
}

// getAny takes a free buffer, the reserve's too (a fused second whose
// first waits), or returns nil.
func (p *pool) getAny() *dataBuf {
	n := len(p.free)
	if n == 0 {
		return nil
	}
	b := &p.bufs[p.free[n-1]]
	p.free = p.free[:n-1]
	b.held = true
	return b
}

// put gives a buffer back; twice is a bug (one buffer for two commands).
func (p *pool) put(b *dataBuf) {
	if !b.held {
		panic(fmt.Sprintf("tcp: data buffer %d of %d bytes given back twice", b.idx, p.size))
	}
	b.held = false
	p.free = append(p.free, b.idx)
}

// reqFIFO is the group's queue of commands waiting for a data buffer, in
// arrival order, linked through req.wnext: it never allocates and holds
// any number of them.
type reqFIFO struct {
	head, tail *req
	n          int
}

func (f *reqFIFO) push(r *req) {
	r.wnext = nil
	if f.tail == nil {
		f.head = r
	} else {
		f.tail.wnext = r
	}
	f.tail = r
	f.n++
}

func (f *reqFIFO) pop() *req {
	r := f.head
	if r == nil {
		return nil
	}
	f.head = r.wnext
	if f.head == nil {
		f.tail = nil
	}
	r.wnext = nil
	f.n--
	return r
}

// unlink takes r, which follows prev (nil: r is the head), off the
// FIFO.
func (f *reqFIFO) unlink(prev, r *req) {
	if prev == nil {
		f.head = r.wnext
	} else {
		prev.wnext = r.wnext
	}
	if f.tail == r {
		f.tail = prev
	}
	r.wnext = nil
	f.n--
}

// removeConn unlinks every request of c (its connection is closing).
func (f *reqFIFO) removeConn(c *conn, each func(*req)) {
	var prev *req
	for r := f.head; r != nil; {
		next := r.wnext
		if r.c == c {
			if prev == nil {
				f.head = next
			} else {
				prev.wnext = next
			}
			if f.tail == r {
				f.tail = prev
			}
			r.wnext = nil
			f.n--
			each(r)
		} else {
			prev = r
		}
		r = next
	}
}

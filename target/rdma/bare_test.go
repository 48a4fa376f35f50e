package rdma_test

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

// The bare transport baseline of the benchmarks: the same messages and
// RDMA operations an NVMe/RDMA command makes, with nothing of NVMe and no
// storage behind them. A 64-byte "capsule" names an operation, a length
// and the host's buffer; the server answers a read with an RDMA WRITE of
// that length plus a 16-byte SEND, a write with an RDMA READ followed by
// the 16-byte SEND. Both sides use the transport engine (per-core CQs,
// SRQ buffers), as the target and the initiator do, so the ratio of the
// two measures what NVMe, the target core and the volume cost.

const (
	bareRead  = 1
	bareWrite = 2
)

type bareServer struct {
	engine *transport.Engine
	ln     transport.Listener
	pd     transport.PD
	data   transport.MemoryRegion
	slots  [][1]transport.SGE // per SRQ buffer index, per core
	wg     sync.WaitGroup
	mu     sync.Mutex
	qps    []transport.QP
}

// The capsule's layout: byte 0 op, 4-7 the client's slot, 8-11 length,
// 16-23 the client's buffer address, 24-27 its key. The server answers
// with the first 16 bytes of its receive buffer (the capsule itself), so
// the slot comes back in the response.

func newBareServer(tb testing.TB, a transport.Adapter, maxLen uint32) *bareServer {
	s := &bareServer{}
	var err error
	if s.pd, err = a.CreatePD(); err != nil {
		tb.Fatal(err)
	}
	if s.engine, err = transport.NewEngine(a, s.pd, transport.EngineConfig{Cores: 2, BufferSize: 64, Buffers: 1024, InitiatorDepth: 256, InitiatorSGE: 1}, transport.HandlerFunc(s.handle)); err != nil {
		tb.Fatal(err)
	}
	// One data region shared by every in-flight request: the baseline
	// moves bytes, it does not keep them apart.
	if s.data, err = s.pd.RegisterMemory(make([]byte, maxLen), transport.AccessLocalWrite|transport.AccessRemoteWrite); err != nil {
		tb.Fatal(err)
	}
	if s.ln, err = a.Listen("127.0.0.1:0"); err != nil {
		tb.Fatal(err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			req, err := s.ln.GetConnectionRequest(context.Background())
			if err != nil {
				return
			}
			bc := &bareConn{}
			qp, _, err := s.engine.CreateQP(bc, 0, 16)
			if err != nil {
				req.Reject(nil)
				continue
			}
			bc.qp = qp
			if err := req.Accept(context.Background(), qp, transport.ConnParams{}); err != nil {
				s.engine.CloseQP(qp)
				continue
			}
			s.mu.Lock()
			s.qps = append(s.qps, qp)
			s.mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		s.ln.Close()
		s.wg.Wait()
		s.engine.Close()
		s.data.Close()
		s.pd.Close()
	})
	return s
}

// handle runs on the server's core goroutines.
func (s *bareServer) handle(core *transport.Core, c *transport.Completion) {
	switch c.Type {
	case transport.OpReceive:
		b := core.RecvBuf(c)
		if b == nil {
			return
		}
		if c.Status != nil {
			b.Repost()
			return
		}
		qp := c.QPContext.(*bareConn).qp
		msg := b.Bytes()
		op := msg[0]
		n := binary.LittleEndian.Uint32(msg[8:])
		addr := binary.LittleEndian.Uint64(msg[16:])
		key := binary.LittleEndian.Uint32(msg[24:])
		sge := [1]transport.SGE{s.data.SGE(0, n)}
		if op == bareRead {
			qp.Write(nil, sge[:], addr, key, transport.FlagSilentSuccess|transport.FlagDefer)
			rsp := [1]transport.SGE{b.SGE(16)}
			qp.Send(nil, rsp[:], transport.FlagInline|transport.FlagSilentSuccess)
			b.Repost()
			return
		}
		// Write: fetch, then answer from the read's completion.
		qp.Read(b, sge[:], addr, key, 0)
	case transport.OpRead:
		b := c.RequestContext.(*transport.RecvBuf)
		rsp := [1]transport.SGE{b.SGE(16)}
		c.QPContext.(*bareConn).qp.Send(nil, rsp[:], transport.FlagInline|transport.FlagSilentSuccess)
		b.Repost()
	}
}

// bareConn is a server QP's context (set before the QP is accepted, so
// before any of its completions).
type bareConn struct{ qp transport.QP }

// bareClient keeps depth requests in flight on one QP and measures each.
type bareClient struct {
	engine  *transport.Engine
	qp      transport.QP
	data    transport.MemoryRegion
	capsule transport.MemoryRegion
	op      byte
	size    uint32
	depth   int

	start   []time.Time
	lat     []time.Duration
	issued  atomic.Int64
	done    atomic.Int64
	target  int64
	finish  chan struct{}
	latMu   sync.Mutex
	started atomic.Bool
}

func newBareClient(tb testing.TB, a transport.Adapter, addr string, op byte, size uint32, depth int) *bareClient {
	c := &bareClient{op: op, size: size, depth: depth, start: make([]time.Time, depth)}
	pd, err := a.CreatePD()
	if err != nil {
		tb.Fatal(err)
	}
	if c.engine, err = transport.NewEngine(a, pd, transport.EngineConfig{Cores: 1, BufferSize: 16, Buffers: 512, InitiatorDepth: 256, InitiatorSGE: 1}, transport.HandlerFunc(c.handle)); err != nil {
		tb.Fatal(err)
	}
	if c.data, err = pd.RegisterMemory(make([]byte, size), transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead); err != nil {
		tb.Fatal(err)
	}
	if c.capsule, err = pd.RegisterMemory(make([]byte, 64*depth), transport.AccessLocalWrite); err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < depth; i++ {
		m := c.capsule.Bytes()[i*64:]
		m[0] = op
		binary.LittleEndian.PutUint32(m[4:], uint32(i))
		binary.LittleEndian.PutUint32(m[8:], size)
		binary.LittleEndian.PutUint64(m[16:], c.data.Addr())
		binary.LittleEndian.PutUint32(m[24:], c.data.RKey())
	}
	if c.qp, _, err = c.engine.CreateQP(nil, 0, 64); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Connect(ctx, c.qp, addr, transport.ConnParams{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.qp.Disconnect()
		c.engine.Close()
		c.data.Close()
		c.capsule.Close()
		pd.Close()
	})
	return c
}

func (c *bareClient) post(slot int) {
	c.start[slot] = time.Now()
	sge := [1]transport.SGE{c.capsule.SGE(uint32(slot)*64, 64)}
	c.qp.Send(nil, sge[:], transport.FlagInline|transport.FlagSilentSuccess)
}

func (c *bareClient) handle(core *transport.Core, comp *transport.Completion) {
	b := core.RecvBuf(comp)
	if b == nil {
		return
	}
	if comp.Status != nil {
		b.Repost()
		return
	}
	slot := int(binary.LittleEndian.Uint32(b.Bytes()[4:]))
	b.Repost()
	c.lat[c.done.Load()%int64(len(c.lat))] = time.Since(c.start[slot])
	if c.done.Add(1) >= c.target {
		if c.started.CompareAndSwap(true, false) {
			close(c.finish)
		}
		return
	}
	if c.issued.Add(1) <= c.target {
		c.post(slot)
	}
}

// run performs n requests with depth in flight and returns the elapsed
// time and the latencies.
func (c *bareClient) run(n int) (time.Duration, []time.Duration) {
	c.lat = make([]time.Duration, n)
	c.target = int64(n)
	c.done.Store(0)
	c.finish = make(chan struct{})
	c.started.Store(true)
	t0 := time.Now()
	k := min(c.depth, n)
	c.issued.Store(int64(k))
	for i := 0; i < k; i++ {
		c.post(i)
	}
	<-c.finish
	return time.Since(t0), c.lat
}

func newBarePair(tb testing.TB, op byte, size uint32, depth int) *bareClient {
	sa, err := soft.New(soft.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := soft.New(soft.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sa.Close(); ca.Close() })
	s := newBareServer(tb, sa, size)
	return newBareClient(tb, ca, s.ln.Addr().String(), op, size, depth)
}

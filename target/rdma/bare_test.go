package rdma_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

// The bare transport baseline of the benchmarks: the messages and RDMA
// operations an NVMe/RDMA I/O command makes, with nothing of NVMe and no
// storage behind them. A 64-byte "capsule" names an operation, a length,
// the client's slot and its buffer; the server answers
//
//   - a read with an RDMA WRITE of that length into the client's buffer,
//     then a 16-byte SEND;
//   - a write of at most bareInCapsule bytes, which arrives in the same
//     SEND as the capsule (as our initiator sends a 4 KiB write in the
//     capsule), with the 16-byte SEND;
//   - a larger write with an RDMA READ of it, then the 16-byte SEND.
//
// Both sides use the transport engine (per-core CQs, SRQ buffers) with
// the same core counts as the target (2) and a one-queue host (1), so the
// ratio of the two measures what NVMe, our initiator, the target core and
// the volume add to the transport. The baseline uses the transport the
// cheapest correct way: the client's capsule SEND and the server's
// response SEND are unsignaled (the response implies the capsule was
// taken; the server's buffers are per client slot, so nothing waits for a
// SEND completion), and neither side copies data.

const (
	bareRead  = 1
	bareWrite = 2

	// bareCapsule is the command part of a capsule (an SQE's size).
	bareCapsule = 64
	// bareResponse is the response (a CQE's size).
	bareResponse = nvme.CQESize
	// bareInCapsule is the most write data sent in the capsule: the
	// target's DefaultInCapsule.
	bareInCapsule = rdma.DefaultInCapsule
	// bareMaxLen is the largest transfer: 128 KiB, the largest the
	// benchmarks move (the target's mid-sized data buffer).
	bareMaxLen = 128 << 10
	// bareSlots is the client slots the server keeps a data buffer for
	// (the deepest queue the baseline runs; the target keeps 64 mid-sized
	// buffers per core).
	bareSlots = 64
)

// The capsule's layout: byte 0 op, 4-7 the client's slot, 8-11 length,
// 16-23 the client's buffer address, 24-27 its key, 32-39 the LBA (which
// the server ignores; it is there because an NVMe capsule carries one).
// The server answers with the first 16 bytes of its receive buffer (the
// capsule itself, as the target builds its response in the receive
// buffer), so the slot comes back in the response.
func putBareCapsule(m []byte, op byte, slot int, n uint32, addr uint64, key uint32, lba uint64) {
	m[0] = op
	binary.LittleEndian.PutUint32(m[4:], uint32(slot))
	binary.LittleEndian.PutUint32(m[8:], n)
	binary.LittleEndian.PutUint64(m[16:], addr)
	binary.LittleEndian.PutUint32(m[24:], key)
	binary.LittleEndian.PutUint64(m[32:], lba)
}

// bareServer is the baseline's server: an engine of 2 cores with receive
// buffers of a capsule plus bareInCapsule bytes (the target's), and a data
// buffer per client slot.
type bareServer struct {
	engine *transport.Engine
	ln     transport.Listener
	pd     transport.PD
	data   transport.MemoryRegion // bareSlots × bareMaxLen
	wg     sync.WaitGroup

	// scratch is each core's SGE lists for posting (the provider copies
	// them at post), so that the handler allocates nothing.
	scratch []bareScratch

	commands, inCapsule, reads, writes, errs atomic.Uint64
	// fetched counts RDMA READs completed; lastSize is the size of the
	// last capsule received. Tests read them (an atomic is what orders
	// the test's look at the data region after the transport's writes,
	// for the race detector: it cannot see through the TCP hop).
	fetched, lastSize atomic.Uint64
}

func newBareServer(a transport.Adapter, addr string) (s *bareServer, err error) {
	s = &bareServer{}
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	if s.pd, err = a.CreatePD(); err != nil {
		return nil, err
	}
	// Sized like the target's engine for one queue of up to 128 entries:
	// one receive buffer per command in flight, two initiator requests
	// (data transfer, response) per command.
	cfg := transport.EngineConfig{Cores: 2, QPsPerCore: 16, BufferSize: bareCapsule + bareInCapsule,
		SRQDepth: 256, Buffers: 256, InitiatorDepth: 256, InitiatorSGE: 1,
		NoPin: true} // as the target's engine (rdma.Config.PinCores off)
	if s.engine, err = transport.NewEngine(a, s.pd, cfg, transport.HandlerFunc(s.handle)); err != nil {
		return nil, err
	}
	s.scratch = make([]bareScratch, len(s.engine.Cores()))
	mem := make([]byte, bareSlots*bareMaxLen)
	for i := range mem {
		mem[i] = bareServerByte(i)
	}
	if s.data, err = s.pd.RegisterMemory(mem, transport.AccessLocalWrite|transport.AccessRemoteWrite); err != nil {
		return nil, err
	}
	if s.ln, err = a.Listen(addr); err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *bareServer) accept() {
	defer s.wg.Done()
	for {
		req, err := s.ln.GetConnectionRequest(context.Background())
		if err != nil {
			return
		}
		bc := &bareConn{}
		qp, _, err := s.engine.CreateQP(bc, 0, bareResponse)
		if err != nil {
			req.Reject(nil)
			continue
		}
		bc.qp = qp
		ctx, cancel := context.WithTimeout(context.Background(), transport.DefaultConnectTimeout)
		err = req.Accept(ctx, qp, transport.ConnParams{})
		cancel()
		if err != nil {
			s.engine.CloseQP(qp)
			continue
		}
	}
}

// Close stops the server and frees everything.
func (s *bareServer) Close() error { return s.release() }

func (s *bareServer) release() error {
	var errs []error
	if s.ln != nil {
		errs = append(errs, s.ln.Close())
		s.wg.Wait()
	}
	if s.engine != nil {
		errs = append(errs, s.engine.Close())
	}
	if s.data != nil {
		errs = append(errs, s.data.Close())
	}
	if s.pd != nil {
		errs = append(errs, s.pd.Close())
	}
	return errors.Join(errs...)
}

// bareServerByte is byte i of the server's data region as created: what
// a read of a slot no write has touched returns.
func bareServerByte(i int) byte { return byte(i*7 + i>>12) }

// stats are the server's counters in the child's "STATS" form (the
// target's names).
func (s *bareServer) stats() string {
	e := s.engine.Stats()
	return fmt.Sprintf("commands=%d incapsule=%d rdmareads=%d rdmawrites=%d errors=%d completions=%d notifications=%d",
		s.commands.Load(), s.inCapsule.Load(), s.reads.Load(), s.writes.Load(), s.errs.Load(), e.Completions, e.Notifications)
}

type bareScratch struct {
	data, rsp [1]transport.SGE
	_         [64]byte // keep the cores' lists on separate cache lines
}

// handle runs on the server's core goroutines.
func (s *bareServer) handle(core *transport.Core, c *transport.Completion) {
	sc := &s.scratch[core.Index()]
	switch c.Type {
	case transport.OpReceive:
		b := core.RecvBuf(c)
		if b == nil {
			return
		}
		bc, _ := c.QPContext.(*bareConn)
		if c.Status != nil || bc == nil || c.Bytes < bareCapsule {
			if c.Status == nil {
				s.errs.Add(1)
			}
			b.Repost()
			return
		}
		s.commands.Add(1)
		s.lastSize.Store(uint64(c.Bytes))
		msg := b.Bytes()
		op := msg[0]
		slot := binary.LittleEndian.Uint32(msg[4:])
		n := binary.LittleEndian.Uint32(msg[8:])
		addr := binary.LittleEndian.Uint64(msg[16:])
		key := binary.LittleEndian.Uint32(msg[24:])
		if slot >= bareSlots || n > bareMaxLen {
			s.errs.Add(1)
			b.Repost()
			bc.qp.Disconnect()
			return
		}
		sc.data[0] = s.data.SGE(slot*bareMaxLen, n)
		switch {
		case op == bareRead:
			s.writes.Add(1)
			if err := bc.qp.Write(nil, sc.data[:], addr, key, transport.FlagSilentSuccess|transport.FlagDefer); err != nil {
				s.errs.Add(1)
			}
			s.respond(bc, b, &sc.rsp)
		case op == bareWrite && c.Bytes > bareCapsule:
			// In the capsule: nothing to fetch.
			s.inCapsule.Add(1)
			s.respond(bc, b, &sc.rsp)
		default:
			// Fetch, then answer from the read's completion.
			s.reads.Add(1)
			if err := bc.qp.Read(b, sc.data[:], addr, key, 0); err != nil {
				s.errs.Add(1)
				b.Repost()
			}
		}
	case transport.OpRead:
		b := c.RequestContext.(*transport.RecvBuf)
		if c.Status != nil {
			b.Repost()
			return
		}
		s.fetched.Add(1)
		s.respond(c.QPContext.(*bareConn), b, &sc.rsp)
	}
}

// bareConn is a server QP's context (set before the QP is accepted, so
// before any of its completions).
type bareConn struct{ qp transport.QP }

// respond sends the first 16 bytes of b inline (copied at post, so b is
// reposted at once), as the target sends its response.
func (s *bareServer) respond(bc *bareConn, b *transport.RecvBuf, rsp *[1]transport.SGE) {
	rsp[0] = b.SGE(bareResponse)
	if err := bc.qp.Send(nil, rsp[:], transport.FlagInline|transport.FlagSilentSuccess); err != nil {
		s.errs.Add(1)
	}
	b.Repost()
}

// bareClient is the baseline's host: its I/O QPs on an engine of one
// core per QP up to the processors (as the initiator sizes its engine), a
// capsule and a data buffer per slot, each slot one request in flight,
// slot i on QP i mod the QPs (depth/QPs slots each, as the initiator
// keeps depth/queues commands on each of its queues).
type bareClient struct {
	engine  *transport.Engine
	pd      transport.PD
	idle    transport.QP           // the admin queue's stand-in
	qps     []transport.QP         // the I/O queues' stand-ins
	data    transport.MemoryRegion // depth × size
	capsule transport.MemoryRegion // depth × bareCapsule
	op      byte
	size    uint32
	depth   int
	sges    [][2]transport.SGE // per slot: its capsule, its data

	// done is called with each answered slot (or -1 and an error), on the
	// client's core goroutine.
	done atomic.Pointer[func(slot int, err error)]
}

func newBareClient(tb testing.TB, a transport.Adapter, addr string, op byte, size uint32, depth, queues int) *bareClient {
	tb.Helper()
	if size > bareMaxLen || depth > bareSlots || queues < 1 || depth%queues != 0 {
		tb.Fatalf("bare client: size %d, depth %d beyond %d, %d, or not spread evenly over %d queues", size, depth, bareMaxLen, bareSlots, queues)
	}
	c := &bareClient{op: op, size: size, depth: depth}
	var err error
	if c.pd, err = a.CreatePD(); err != nil {
		tb.Fatal(err)
	}
	// Cores and QPs per core as the initiator's engineSizing: one core
	// per I/O queue up to the processors, the admin QP's stand-in
	// counted. One receive buffer (a response) per slot: at most depth
	// responses are in flight, towards whichever cores. Initiator depth:
	// one SEND per slot of the QP, doubled because the SENDs are
	// unsignaled: the provider frees an unsignaled SEND's entry once it
	// is on the wire, which may be after its response has arrived and the
	// slot has been reused, so up to one more SEND per slot may still hold
	// an entry.
	cores := min(queues, max(runtime.NumCPU(), 1))
	cfg := transport.EngineConfig{Cores: cores, QPsPerCore: uint32((queues + 1 + cores - 1) / cores), BufferSize: bareResponse,
		SRQDepth: uint32(max(depth, 2)), Buffers: uint32(max(depth, 2)), InitiatorDepth: uint32(2 * max(depth/queues, 2)), InitiatorSGE: 2,
		NoPin: true} // as the initiator's engine
	if c.engine, err = transport.NewEngine(a, c.pd, cfg, transport.HandlerFunc(c.handle)); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.close)
	if c.data, err = c.pd.RegisterMemory(make([]byte, int(size)*depth), transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead); err != nil {
		tb.Fatal(err)
	}
	if c.capsule, err = c.pd.RegisterMemory(make([]byte, bareCapsule*depth), transport.AccessLocalWrite); err != nil {
		tb.Fatal(err)
	}
	c.sges = make([][2]transport.SGE, depth)
	for i := 0; i < depth; i++ {
		putBareCapsule(c.capsule.Bytes()[i*bareCapsule:], op, i, size, c.data.Addr()+uint64(i)*uint64(size), c.data.RKey(), 0)
		c.sges[i] = [2]transport.SGE{c.capsule.SGE(uint32(i)*bareCapsule, bareCapsule), c.data.SGE(uint32(i)*size, size)}
	}
	// An idle QP first, as our initiator connects its admin queue before
	// the I/O queue: the server (like the target) then places the data
	// QP on its second core, so that the host's and the server's
	// notification goroutines are pinned to different processors in both
	// the baseline and the NVMe run.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.idle, _, err = c.engine.CreateQP(nil, 0, bareCapsule); err != nil {
		tb.Fatal(err)
	}
	if _, err := a.Connect(ctx, c.idle, addr, transport.ConnParams{}); err != nil {
		tb.Fatal(err)
	}
	for range queues {
		qp, _, err := c.engine.CreateQP(c, 0, bareCapsule)
		if err != nil {
			tb.Fatal(err)
		}
		c.qps = append(c.qps, qp)
		if _, err := a.Connect(ctx, qp, addr, transport.ConnParams{}); err != nil {
			tb.Fatal(err)
		}
		// A connection that ends while requests are in flight fails them.
		go func() {
			<-qp.Done()
			if f := c.done.Load(); f != nil {
				(*f)(-1, fmt.Errorf("bare client: connection ended: %v", qp.Err()))
			}
		}()
	}
	return c
}

func (c *bareClient) close() {
	c.done.Store(nil)
	for _, qp := range append(c.qps, c.idle) {
		if qp != nil {
			qp.Disconnect()
		}
	}
	c.engine.Close()
	if c.data != nil {
		c.data.Close()
	}
	if c.capsule != nil {
		c.capsule.Close()
	}
	c.pd.Close()
}

// buf is slot's data buffer (a read's destination, a write's source).
func (c *bareClient) buf(slot int) []byte {
	return c.data.Bytes()[slot*int(c.size) : (slot+1)*int(c.size)]
}

// submit sends slot's capsule for the block at lba: with the write's data
// in the same SEND if it fits in the capsule, else alone and inline.
func (c *bareClient) submit(slot int, lba uint64) error {
	m := c.capsule.Bytes()[slot*bareCapsule:]
	binary.LittleEndian.PutUint64(m[32:], lba)
	sges := &c.sges[slot]
	qp := c.qps[slot%len(c.qps)]
	if c.op == bareWrite && c.size <= bareInCapsule {
		return qp.Send(nil, sges[:], transport.FlagSilentSuccess)
	}
	return qp.Send(nil, sges[:1], transport.FlagInline|transport.FlagSilentSuccess)
}

func (c *bareClient) handle(core *transport.Core, comp *transport.Completion) {
	f := c.done.Load()
	b := core.RecvBuf(comp)
	if b == nil {
		// Unsignaled sends complete only on error.
		if comp.Status != nil && f != nil {
			(*f)(-1, fmt.Errorf("bare client: %v: %w", comp.Type, comp.Status))
		}
		return
	}
	if comp.Status != nil || comp.Bytes != bareResponse {
		b.Repost()
		if f != nil {
			(*f)(-1, fmt.Errorf("bare client: response of %d bytes, status %v", comp.Bytes, comp.Status))
		}
		return
	}
	slot := int(binary.LittleEndian.Uint32(b.Bytes()[4:]))
	b.Repost()
	if slot >= c.depth {
		if f != nil {
			(*f)(-1, fmt.Errorf("bare client: response for slot %d of %d", slot, c.depth))
		}
		return
	}
	if f != nil {
		(*f)(slot, nil)
	}
}

// TestBareBaseline checks that the baseline really moves the bytes: a
// write in the capsule arrives whole in the server's receive buffer, one
// fetched by RDMA READ lands in the server's slot buffer, and a read
// places the server's slot buffer in the client's.
func TestBareBaseline(t *testing.T) {
	sa, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sa.Close() })
	s, err := newBareServer(sa, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ca, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Close() })
	for _, tc := range []struct {
		name string
		op   byte
		size uint32
		slot int
	}{
		{"write-in-capsule", bareWrite, 4096, 0},
		{"write-rdma-read", bareWrite, 32 << 10, 0},
		{"read", bareRead, 32 << 10, 1}, // a slot no write touched
	} {
		t.Run(tc.name, func(t *testing.T) {
			const depth = 2
			c := newBareClient(t, ca, s.ln.Addr().String(), tc.op, tc.size, depth, 1)
			results := make(chan error, depth)
			f := func(slot int, err error) {
				if err == nil && slot != tc.slot {
					err = fmt.Errorf("answer for slot %d, want %d", slot, tc.slot)
				}
				results <- err
			}
			c.done.Store(&f)
			want := bytes.Repeat([]byte{byte(tc.size >> 10), tc.op}, int(tc.size)/2)
			if tc.op == bareWrite {
				copy(c.buf(tc.slot), want)
			} else {
				for i := range want {
					want[i] = bareServerByte(tc.slot*bareMaxLen + i)
				}
			}
			fetched := s.fetched.Load()
			if err := c.submit(tc.slot, 7); err != nil {
				t.Fatal(err)
			}
			if err := <-results; err != nil {
				t.Fatal(err)
			}
			switch tc.name {
			case "write-in-capsule":
				if n := s.lastSize.Load(); n != bareCapsule+uint64(tc.size) {
					t.Fatalf("capsule of %d bytes arrived, want %d", n, bareCapsule+tc.size)
				}
			case "write-rdma-read":
				if s.fetched.Load() != fetched+1 {
					t.Fatal("no RDMA READ completed")
				}
				if !bytes.Equal(s.data.Bytes()[tc.slot*bareMaxLen:tc.slot*bareMaxLen+int(tc.size)], want) {
					t.Fatal("the server's slot buffer does not hold the written data")
				}
			case "read":
				if !bytes.Equal(c.buf(tc.slot), want) {
					t.Fatal("the client's buffer does not hold the server's data")
				}
			}
		})
	}
	if st := s.stats(); !strings.Contains(st, "commands=3 incapsule=1 rdmareads=1 rdmawrites=1 errors=0") {
		t.Errorf("server stats %q", st)
	}
}

package tcp_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/tcp"
)

// benchHost is a pipelined NVMe/TCP host for one I/O queue that
// allocates nothing per I/O, for the benchmarks and the allocation guard:
// every slot (a command in flight) has its capsule PDU, its H2CData PDU
// and its buffer built once; submit patches the LBA and CID, and one
// Write sends the PDU. One reader goroutine parses what the target sends
// (R2T: answered from the reader; C2HData: placed in the slot's buffer;
// CapsuleResp or SUCCESS: the slot's completion). The same host drives
// the target and the bare baseline server.
type benchHost struct {
	nc      net.Conn
	size    int
	write   bool
	inline  bool // writes go in the capsule
	maxH2C  uint32
	slots   []benchSlot
	done    func(slot int, err error)
	rbuf    []byte
	failed  atomic.Bool
	readerW sync.WaitGroup
	// copies: C2HData placed in the slot buffers (verify) or dropped.
	keep bool
}

type benchSlot struct {
	capsule []byte // CapsuleCmd PDU (+ in-capsule data)
	h2c     []byte // H2CData PDU header + data
	buf     []byte // read destination / write source
	cid     uint16
}

// dialBench connects an admin queue and one I/O queue of depth entries
// (the admin queue stays open: closing it would tear the controller
// down) and returns the I/O queue's host.
func dialBench(tb testing.TB, addr string, write bool, size, depth int) *benchHost {
	tb.Helper()
	admin := dialRaw(tb, addr)
	admin.mustIC(nvme.TCPDigests{})
	rsp := admin.connect(0, 31, 0, nvme.CNTLIDDynamic)
	if rsp.Status != 0 {
		tb.Fatalf("admin Connect: %v", rsp.Status)
	}
	cntlid := nvme.ConnectResponseCNTLID(rsp.DW0)
	cc := nvme.MakeCC(nvme.CCFields{EN: true, IOSQES: 6, IOCQES: 4})
	admin.mustExchange(propSet(nvme.PropCC, uint64(cc)), nil, nil, nil)
	for i := 0; ; i++ {
		if admin.mustExchange(propGet(nvme.PropCSTS, false), nil, nil, nil).rsp.DW0&1 != 0 {
			break
		}
		if i > 5000 {
			tb.Fatal("CSTS.RDY never set")
		}
		time.Sleep(time.Millisecond)
	}
	var sf nvme.Command
	(&nvme.FeatureCommand{FID: nvme.FeatureNumQueues, CDW11: nvme.NumQueues(1, 1)}).EncodeSet(&sf)
	admin.mustExchange(sf, nil, nil, nil)
	io := dialRaw(tb, addr)
	io.mustIC(nvme.TCPDigests{})
	if rsp := io.connect(1, uint16(max(depth, 2)-1), 0, cntlid); rsp.Status != 0 {
		tb.Fatalf("I/O Connect: %v", rsp.Status)
	}
	// The raw host's setup left 10 s deadlines on the socket: a run may
	// take longer (the loop has its own bound).
	io.nc.SetDeadline(time.Time{})
	h := &benchHost{nc: io.nc, size: size, write: write, inline: write && size <= 8192, maxH2C: io.maxH2C,
		slots: make([]benchSlot, depth), rbuf: make([]byte, 512<<10)}
	if write && !h.inline && uint32(size) > h.maxH2C {
		tb.Fatalf("write of %d above MAXH2CDATA %d: the bench host sends one H2CData", size, h.maxH2C)
	}
	for i := range h.slots {
		s := &h.slots[i]
		s.cid = uint16(i)
		s.buf = make([]byte, size)
		op := nvme.IORead
		if write {
			op = nvme.IOWrite
			copy(s.buf, pattern(size, byte(i)))
		}
		cmd := rw(op, 1, 0, uint32(size/testBlock))
		cmd.CID, cmd.Flags = s.cid, 0x40
		switch {
		case h.inline:
			cmd.DPTR = nvme.InCapsuleSGL(0, uint32(size))
			s.capsule = io.capsulePDU(cmd, s.buf)
		default:
			cmd.DPTR = nvme.TransportSGL(uint32(size))
			s.capsule = io.capsulePDU(cmd, nil)
		}
		if write && !h.inline {
			s.h2c = io.h2cPDU(s.cid, 0, 0, s.buf, true)
		}
	}
	h.readerW.Add(1)
	go h.reader()
	tb.Cleanup(func() {
		h.nc.Close()
		h.readerW.Wait()
	})
	return h
}

// submit sends slot's command for the block at lba.
func (h *benchHost) submit(slot int, lba uint64) error {
	s := &h.slots[slot]
	sqe := s.capsule[nvme.TCPCommonHeaderSize:]
	binary.LittleEndian.PutUint32(sqe[40:], uint32(lba))
	binary.LittleEndian.PutUint32(sqe[44:], uint32(lba>>32))
	_, err := h.nc.Write(s.capsule)
	return err
}

func (h *benchHost) fail(err error) {
	if h.failed.CompareAndSwap(false, true) && h.done != nil {
		h.done(-1, err)
	}
}

// reader parses the target's PDUs and completes slots.
func (h *benchHost) reader() {
	defer h.readerW.Done()
	b := h.rbuf
	r, w := 0, 0
	for {
		// Parse whole PDUs.
		for w-r >= nvme.TCPCommonHeaderSize {
			plen := int(binary.LittleEndian.Uint32(b[r+4:]))
			typ := b[r]
			if plen < nvme.TCPCommonHeaderSize || plen > len(b) {
				h.fail(fmt.Errorf("bench host: PDU type %#x PLEN %d", typ, plen))
				return
			}
			if w-r < plen {
				break
			}
			p := b[r : r+plen]
			r += plen
			if err := h.pdu(typ, p); err != nil {
				h.fail(err)
				return
			}
		}
		if r == w {
			r, w = 0, 0
		} else if len(b)-r < 160<<10 {
			w = copy(b, b[r:w])
			r = 0
		}
		n, err := h.nc.Read(b[w:])
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
				h.fail(err)
			} else {
				h.fail(fmt.Errorf("bench host: connection ended: %w", err))
			}
			return
		}
		w += n
	}
}

func (h *benchHost) slotOf(cid uint16) (*benchSlot, int, error) {
	if int(cid) >= len(h.slots) {
		return nil, 0, fmt.Errorf("bench host: CID %d of %d slots", cid, len(h.slots))
	}
	return &h.slots[cid], int(cid), nil
}

func (h *benchHost) pdu(typ byte, p []byte) error {
	switch typ {
	case nvme.TCPCapsuleResp:
		cid := binary.LittleEndian.Uint16(p[nvme.TCPCommonHeaderSize+12:])
		st := binary.LittleEndian.Uint16(p[nvme.TCPCommonHeaderSize+14:]) >> 1
		_, slot, err := h.slotOf(cid)
		if err != nil {
			return err
		}
		if st != 0 {
			return fmt.Errorf("bench host: command %d: status %#x", cid, st)
		}
		h.done(slot, nil)
	case nvme.TCPC2HData:
		cid := binary.LittleEndian.Uint16(p[8:])
		s, slot, err := h.slotOf(cid)
		if err != nil {
			return err
		}
		if h.keep {
			copy(s.buf, p[p[3]:])
		}
		if p[1]&nvme.TCPFlagSuccess != 0 {
			h.done(slot, nil)
		}
	case nvme.TCPR2T:
		cid := binary.LittleEndian.Uint16(p[8:])
		s, _, err := h.slotOf(cid)
		if err != nil {
			return err
		}
		if s.h2c == nil {
			return fmt.Errorf("bench host: R2T for a read")
		}
		copy(s.h2c[10:12], p[10:12]) // TTAG
		if _, err := h.nc.Write(s.h2c); err != nil {
			return err
		}
	default:
		return fmt.Errorf("bench host: unexpected PDU type %#x", typ)
	}
	return nil
}

// bareServer is the benchmarks' baseline: a TCP server that moves the
// same bytes as the target for the same host, with nothing of NVMe
// behind them. It frames PDUs as NVMe/TCP does and answers ICReq with an
// ICResp, every admin and fabrics command with a success CapsuleResp
// (DW0 1: CNTLID 1, CSTS.RDY), a read with a C2HData of its length from a
// fixed buffer and a CapsuleResp, an in-capsule write with a CapsuleResp,
// and a write without data with an R2T, then its H2CData with a
// CapsuleResp. One goroutine per connection, locked to its thread so its
// CPU time can be read as the target's poll groups' is; blocking reads
// into one buffer, one Write per answer, no copies.
type bareServer struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	tids []int
	nc   []net.Conn
}

func newBareServer(tb testing.TB) *bareServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &bareServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.nc = append(s.nc, nc)
			s.mu.Unlock()
			s.wg.Add(1)
			go s.serve(nc)
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, nc := range s.nc {
			nc.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *bareServer) serve(nc net.Conn) {
	defer s.wg.Done()
	defer nc.Close()
	runtime.LockOSThread()
	s.mu.Lock()
	s.tids = append(s.tids, tcp.Gettid())
	s.mu.Unlock()
	b := make([]byte, 512<<10)
	o := &bareOut{data: make([]byte, 128<<10), hdrs: make([]byte, 0, 64<<10)}
	r, w := 0, 0
	for {
		// Answer every whole PDU read, then write the answers at once
		// (as the target writes once per pass).
		for w-r >= 8 {
			plen := int(binary.LittleEndian.Uint32(b[r+4:]))
			if plen < 8 || plen > len(b) {
				return
			}
			if w-r < plen {
				break
			}
			p := b[r : r+plen]
			r += plen
			if !o.answer(p) {
				return
			}
		}
		if !o.flush(nc) {
			return
		}
		if r == w {
			r, w = 0, 0
		} else if len(b)-r < 160<<10 {
			w = copy(b, b[r:w])
			r = 0
		}
		n, err := nc.Read(b[w:])
		if err != nil {
			return
		}
		w += n
	}
}

// bareOut gathers a batch of answers: headers in hdrs, read data as
// slices of one fixed buffer (its content is not checked), written with
// one writev; nothing is copied.
type bareOut struct {
	data []byte
	hdrs []byte
	vec  [][]byte
	bufs net.Buffers
}

func (o *bareOut) hdr(n int) []byte {
	if cap(o.hdrs)-len(o.hdrs) < n {
		return nil
	}
	at := len(o.hdrs)
	o.hdrs = o.hdrs[:at+n]
	h := o.hdrs[at : at+n : at+n]
	clear(h)
	return h
}

// add queues b.
func (o *bareOut) add(b []byte) { o.vec = append(o.vec, b) }

func (o *bareOut) resp(cid uint16) {
	h := o.hdr(24)
	(&nvme.TCPHeader{Type: nvme.TCPCapsuleResp, HLen: 24, PLen: 24}).Marshal(h)
	binary.LittleEndian.PutUint32(h[8:], 1)
	binary.LittleEndian.PutUint16(h[20:], cid)
	o.add(h)
}

// answer answers one PDU; false ends the connection.
func (o *bareOut) answer(p []byte) bool {
	if cap(o.hdrs)-len(o.hdrs) < 256 {
		return false
	}
	switch p[0] {
	case nvme.TCPICReq:
		h := o.hdr(nvme.TCPICSize)
		(&nvme.TCPICRespPDU{MaxH2CData: 128 << 10}).Marshal((*[nvme.TCPICSize]byte)(h))
		o.add(h)
	case nvme.TCPCapsuleCmd:
		sqe := p[8:72]
		cid := binary.LittleEndian.Uint16(sqe[2:])
		length := binary.LittleEndian.Uint32(sqe[24+8:])
		sglID := sqe[24+15]
		switch {
		case sqe[0] == uint8(nvme.IORead) && length > 0 && length <= uint32(len(o.data)):
			h := o.hdr(24)
			(&nvme.TCPHeader{Type: nvme.TCPC2HData, Flags: nvme.TCPFlagLastPDU, HLen: 24, PDO: 24, PLen: 24 + length}).Marshal(h)
			(&nvme.TCPDataPDU{CCCID: cid, Length: length}).Marshal(h)
			o.add(h)
			o.add(o.data[:length])
			o.resp(cid)
		case sqe[0] == uint8(nvme.IOWrite) && sglID == nvme.SGLIDTransportDataTCP && length > 0:
			h := o.hdr(24)
			(&nvme.TCPHeader{Type: nvme.TCPR2T, HLen: 24, PLen: 24}).Marshal(h)
			(&nvme.TCPDataPDU{CCCID: cid, TTag: cid, Length: length}).Marshal(h)
			o.add(h)
		default:
			o.resp(cid)
		}
	case nvme.TCPH2CData:
		o.resp(binary.LittleEndian.Uint16(p[8:]))
	default:
		return false
	}
	return true
}

func (o *bareOut) flush(nc net.Conn) bool {
	if len(o.vec) == 0 {
		return true
	}
	o.bufs = append(o.bufs[:0], o.vec...)
	_, err := o.bufs.WriteTo(nc)
	clear(o.vec)
	o.vec = o.vec[:0]
	o.hdrs = o.hdrs[:0]
	return err == nil
}

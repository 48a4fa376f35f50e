//go:build linux

package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// connState is where a connection is. Its poll group owns it.
type connState uint8

const (
	// connICWait: accepted, waiting for the ICReq.
	connICWait connState = iota
	// connLive: ICResp sent; commands flow.
	connLive
	// connClosing: no more input is taken; queued output (a TermReq, the
	// responses before it) is being written.
	connClosing
	// connLinger: output written and FIN sent; reading (and dropping)
	// until the host closes or the close deadline, so that closing
	// with unread input does not reset the connection before the host
	// has read the TermReq.
	connLinger
	// connClosed: the socket is closed; requests still in the core are
	// reclaimed as they complete.
	connClosed
)

// rxPhase is where the receive side is in the current PDU.
type rxPhase uint8

const (
	rxHeader rxPhase = iota // the next PDU's header
	rxData                  // the current PDU's data: into dst, or dropped
	rxDigest                // the current PDU's data digest
)

// pduKind is what the data being received belongs to.
type pduKind uint8

const (
	pduCapsule pduKind = iota // a CapsuleCmd's in-capsule data
	pduH2C                    // an H2CData PDU's data
	pduTermReq                // an H2CTermReq's copy of a header
)

const (
	// rxBufSize is a connection's receive staging buffer: 16 KiB. Headers
	// are read into it in bulk (a burst of 32 CapsuleCmds of 72 bytes is
	// one read); data is read straight into its data buffer unless it
	// arrived in the same read as its header (then copied, and counted):
	// readv puts the rest of the data in the data buffer and what follows
	// it here. It holds an 8 KiB in-capsule write with its header whole.
	rxBufSize = 16 << 10
	// readBudget is the reads of one connection per pass before the group
	// turns to the others (edge-triggered: the group remembers the rest).
	readBudget = 4
	// lingerTimeout bounds how long a closing connection waits to write
	// its last PDUs and for the host to close.
	lingerTimeout = 2 * time.Second
	// txPerReq is the most PDU pieces one command has queued at once: a
	// C2HData header, its data and data digest, and a CapsuleResp.
	txPerReq = 4
	// txSpare is the ring room beyond the commands': ICResp and TermReq.
	txSpare = 4
)

var (
	errPortClosed   = errors.New("tcp: port closed")
	errCloseTimeout = errors.New("tcp: closing connection timed out")
	// errConnectTimeout: no ICReq, or no command, within ConnectTimeout.
	errConnectTimeout = errors.New("tcp: connect timeout")
	errDataDigest     = errors.New("tcp: data digest mismatch")
	errHostTerm       = errors.New("tcp: host terminated the connection (H2CTermReq)")
	errTerminated     = errors.New("tcp: connection terminated (C2HTermReq sent)")
)

// conn is one accepted TCP connection: one NVMe queue. It is the core's
// Responder. Everything but the fields marked otherwise belongs to its
// poll group's goroutine.
type conn struct {
	p      *Port
	g      *group
	nc     *net.TCPConn
	rc     syscall.RawConn
	remote string
	local  string

	// Set by other goroutines.
	anext, cnext *conn // the group's adopt and disconnect stacks
	discQueued   atomic.Bool
	discReason   atomic.Pointer[error]

	state  connState
	pslot  int32 // epoll slot, -1 when not registered
	dg     nvme.TCPDigests
	hd     int // header digest length (0 or 4)
	q      *target.Queue
	qid    uint16
	reqs   []req
	free   []uint16 // free request slots (stack)
	inCore int      // requests between Execute and their completion
	sqhd   uint32
	reason error // why the connection closes
	gone   bool
	// pending: accepted, its queue not connected yet (Port.pending and
	// Port.pendingBy[src] count it until unpend, pending.go).
	pending bool
	src     string // the peer's IP, as sourceOf gives it
	// counted: in the port's pending budget (guarded by Port.pmu; an
	// eviction clears it on the accept goroutine).
	counted bool
	// registered: the group has put the socket in its epoll set, so a
	// Disconnect can close it (pending.go evicts only such).
	registered atomic.Bool
	// timed: in the group's timed list, until deadline.
	timed bool

	readable, writable bool
	inReady, inFlush   bool
	rxPaused           bool // in-capsule data waits for a buffer
	// seq and prevFuse stamp each capsule (target.Request.Seq and
	// PrevFuse: fused commands are paired by arrival).
	seq      uint32
	prevFuse uint8
	// firstRun has bit Seq mod its length set for a fused first that
	// has executed (its second may take a buffer; fused.go), cleared
	// when the next capsule of that bit arrives.
	firstRun target.FirstRun
	// deadline is when an establishing connection (no queue yet) is
	// dropped, or a closing one closed.
	deadline time.Time

	rx      rxState
	tx      txRing
	icresp  [nvme.TCPICSize]byte
	term    [nvme.TCPTermReqHeaderSize + nvme.TCPTermReqMaxData]byte
	readFn  func(fd uintptr) bool
	writeFn func(fd uintptr) bool
	riov    [2]syscall.Iovec
	riovN   int
	rn      int
	rerr    error
	wn      int
	werr    error
}

type rxState struct {
	buf   []byte
	r, w  int
	phase rxPhase
	kind  pduKind
	req   *req
	dst   []byte // where data goes; nil drops it
	got   int
	need  int
	ddgst bool // a data digest follows
	crc   uint32
	fes   uint16 // H2CTermReq: the host's FES and FEI
	fei   uint32
}

// txEntry is one piece of a queued PDU; r, when set, is the request whose
// slot is freed once the piece is written (its last one).
type txEntry struct {
	b []byte
	r *req
}

// txRing is a connection's queued output: a fixed ring sized for every
// request of the queue at once plus the connection's own PDUs.
type txRing struct {
	e       []txEntry
	head, n int
}

func (t *txRing) push(b []byte, r *req) {
	if t.n == len(t.e) {
		panic("tcp: transmit ring overflow") // sized for every request's PDUs
	}
	t.e[(t.head+t.n)%len(t.e)] = txEntry{b: b, r: r}
	t.n++
}

func newConn(p *Port, nc *net.TCPConn) (*conn, error) {
	rc, err := nc.SyscallConn()
	if err != nil {
		return nil, err
	}
	c := &conn{p: p, nc: nc, rc: rc, pslot: -1, remote: nc.RemoteAddr().String(), local: nc.LocalAddr().String()}
	c.rx.buf = make([]byte, rxBufSize)
	c.tx.e = make([]txEntry, txSpare)
	c.readFn = c.readFD
	c.writeFn = c.writevFD
	return c, nil
}

// canRead says the connection takes input now.
func (c *conn) canRead() bool {
	switch c.state {
	case connICWait, connLive:
		return !c.rxPaused
	case connLinger:
		return true
	}
	return false
}

// Complete implements target.Responder: the request goes back to its
// poll group, which sends its data and response. Any goroutine.
func (c *conn) Complete(tr *target.Request) {
	r := tr.Binding.(*req)
	c.g.pushDone(r)
}

// Disconnect implements target.Responder: the group writes what is
// queued, then closes. Any goroutine, any number of times.
func (c *conn) Disconnect(reason error) {
	if c.discQueued.CompareAndSwap(false, true) {
		c.discReason.Store(&reason)
		c.g.pushCtl(c)
	}
}

// pump reads and parses what the socket has, up to the read budget.
func (c *conn) pump() {
	if c.state == connLinger {
		c.drainLinger()
		return
	}
	for i := 0; i < readBudget; i++ {
		if !c.consume() || !c.canRead() || !c.readable {
			return
		}
		if !c.readMore() {
			return
		}
	}
	c.consume()
}

// readMore reads once: straight into the current PDU's data buffer (and
// the staging buffer after it) when the staging buffer is empty in the
// middle of data, else into the staging buffer. It reports whether
// anything was read.
func (c *conn) readMore() bool {
	x := &c.rx
	if x.r == x.w {
		x.r, x.w = 0, 0
	} else if x.w == len(x.buf) || x.phase == rxHeader && len(x.buf)-x.r < nvme.TCPMaxHeaderSize {
		x.w = copy(x.buf, x.buf[x.r:x.w])
		x.r = 0
	}
	var n, want int
	var err error
	if x.phase == rxData && x.dst != nil && x.r == x.w {
		d := x.dst[x.got:x.need]
		want = len(d) + len(x.buf) - x.w
		n, err = c.readv(d, x.buf[x.w:])
		if n > 0 {
			k := min(n, len(d))
			if x.ddgst {
				x.crc = nvme.TCPDigestUpdate(x.crc, d[:k])
			}
			x.got += k
			x.w += n - k
		}
	} else {
		want = len(x.buf) - x.w
		n, err = c.readv(x.buf[x.w:], nil)
		if n > 0 {
			x.w += n
		}
	}
	c.g.st.reads.Add(1)
	switch {
	case err == syscall.EAGAIN:
		c.readable = false
		return false
	case err != nil:
		c.closeSocket(err)
		return false
	case n == 0:
		c.closeSocket(io.EOF)
		return false
	}
	c.g.st.bytesIn.Add(uint64(n))
	if n < want {
		c.readable = false // drained: the next edge says when there is more
	}
	return true
}

// drainLinger reads and drops input until the host closes.
func (c *conn) drainLinger() {
	for c.readable && c.state == connLinger {
		n, err := c.readv(c.rx.buf, nil)
		switch {
		case err == syscall.EAGAIN:
			c.readable = false
		case err != nil || n == 0:
			c.closeSocket(c.reason)
		}
	}
}

// consume parses whole PDU headers and places data from the staging
// buffer. It reports false when the connection stops taking input (it
// failed, closes, or waits for a buffer).
func (c *conn) consume() bool {
	x := &c.rx
	for {
		switch x.phase {
		case rxHeader:
			if c.state != connLive && c.state != connICWait {
				return false
			}
			avail := x.w - x.r
			if avail < nvme.TCPCommonHeaderSize {
				return true
			}
			b := x.buf[x.r:x.w]
			var h nvme.TCPHeader
			_ = h.Unmarshal(b)
			if !c.checkHeader(&h, b) {
				return false
			}
			hl := int(h.HLen)
			if h.Type == nvme.TCPCapsuleCmd || h.Type == nvme.TCPH2CData {
				hl += c.hd
			}
			if avail < hl {
				return true
			}
			b = b[:hl]
			if hl > int(h.HLen) && !nvme.TCPHeaderDigestOK(b, int(h.HLen)) {
				c.g.st.hdgstErrs.Add(1)
				c.terminate(nvme.TCPFault{FES: nvme.TCPFESHeaderDigest, What: "header digest mismatch"}, b)
				return false
			}
			x.r += hl
			if !c.onHeader(&h, b) {
				return false
			}
		case rxData:
			if x.got < x.need {
				if x.dst == nil && c.rxPaused {
					return false
				}
				k := min(x.w-x.r, x.need-x.got)
				if k == 0 {
					return true
				}
				src := x.buf[x.r : x.r+k]
				if x.ddgst {
					x.crc = nvme.TCPDigestUpdate(x.crc, src)
				}
				if x.dst != nil {
					copy(x.dst[x.got:], src)
					c.g.st.copies.Add(1)
					c.g.st.copiedBytes.Add(uint64(k))
				}
				x.got += k
				x.r += k
				if x.got < x.need {
					return true
				}
			}
			if x.ddgst {
				x.phase = rxDigest
				continue
			}
			if !c.dataDone() {
				return false
			}
		case rxDigest:
			if x.w-x.r < nvme.TCPDigestSize {
				return true
			}
			got := binary.LittleEndian.Uint32(x.buf[x.r:])
			x.r += nvme.TCPDigestSize
			if got != x.crc {
				// nvmet drops the connection on a data digest error
				// (nvmet_tcp_check_ddgst → fatal error, no TermReq: no
				// FES names it); so does this binding.
				c.g.st.ddgstErrs.Add(1)
				c.logTerminated(0, 0, fmt.Sprintf("data digest %#08x, want %#08x", got, x.crc))
				c.closeSocket(errDataDigest)
				return false
			}
			if !c.dataDone() {
				return false
			}
		}
	}
}

// checkHeader checks a PDU's common header: the order of PDUs, then
// nvme's Check of its type's rules against the digests negotiated and
// the data limit of its type.
func (c *conn) checkHeader(h *nvme.TCPHeader, b []byte) bool {
	// The TermReq carries the offending header, not what follows it.
	b = b[:min(len(b), max(int(h.HLen), nvme.TCPCommonHeaderSize))]
	bad := func(fes uint16, fei uint32, what string) bool {
		c.terminate(nvme.TCPFault{FES: fes, FEI: fei, What: what}, b)
		return false
	}
	switch {
	case h.Type == nvme.TCPH2CTermReq:
	case c.state == connICWait && h.Type != nvme.TCPICReq:
		return bad(nvme.TCPFESPDUSequence, 0, "a PDU before ICReq")
	case c.state == connLive && h.Type == nvme.TCPICReq:
		return bad(nvme.TCPFESPDUSequence, 0, "a second ICReq")
	}
	l := nvme.TCPLimits{Digests: c.dg}
	switch h.Type {
	case nvme.TCPCapsuleCmd:
		l.MaxData = c.p.maxCapsuleData
	case nvme.TCPH2CData:
		l.MaxData = c.p.cfg.MaxH2CData
	}
	if f := h.Check(true, l); !f.OK() {
		c.terminate(f, b)
		return false
	}
	return true
}

// onHeader handles a PDU whose header (and its digest) was checked.
func (c *conn) onHeader(h *nvme.TCPHeader, b []byte) bool {
	switch h.Type {
	case nvme.TCPICReq:
		return c.onICReq(b)
	case nvme.TCPCapsuleCmd:
		return c.onCapsule(h, b)
	case nvme.TCPH2CData:
		return c.onH2CData(h, b)
	case nvme.TCPH2CTermReq:
		var t nvme.TCPTermReqPDU
		_ = t.Unmarshal(b)
		c.rx.fes, c.rx.fei = t.FES, t.FEI
		c.startData(pduTermReq, nil, nil, int(h.PLen)-nvme.TCPTermReqHeaderSize, false)
		return true
	}
	// Check lets nothing else through from a host.
	c.terminate(nvme.TCPFault{FES: nvme.TCPFESInvalidHeaderField, FEI: nvme.TCPOffType, What: "unexpected PDU type"}, b)
	return false
}

// startData sets the receive side to take n data bytes of the current
// PDU into dst (nil: drop them).
func (c *conn) startData(kind pduKind, r *req, dst []byte, n int, digest bool) {
	x := &c.rx
	x.phase, x.kind, x.req, x.dst, x.got, x.need = rxData, kind, r, dst, 0, n
	x.ddgst = digest
	x.crc = nvme.TCPDigest(nil)
}

// dataDone finishes the current PDU once its data (and digest) are in.
func (c *conn) dataDone() bool {
	x := &c.rx
	r, kind, n := x.req, x.kind, x.need
	x.phase, x.req, x.dst = rxHeader, nil, nil
	switch kind {
	case pduCapsule:
		if r.fail != 0 {
			c.refuse(r, r.fail)
		} else {
			c.execute(r)
		}
	case pduH2C:
		r.got += uint32(n)
		if r.got == r.Len {
			c.execute(r)
		}
	case pduTermReq:
		c.g.st.hostTerms.Add(1)
		c.closeSocket(fmt.Errorf("%w: FES %#x FEI %d", errHostTerm, x.fes, x.fei))
		return false
	}
	return true
}

// onICReq answers the ICReq: digests echoed if allowed, CPDA 0,
// MAXH2CDATA; a PFV, HPDA or digest it cannot serve terminates.
func (c *conn) onICReq(b []byte) bool {
	var ic nvme.TCPICReqPDU
	_ = ic.Unmarshal(b)
	bad := func(fes uint16, fei uint32, what string) bool {
		c.terminate(nvme.TCPFault{FES: fes, FEI: fei, What: what}, b)
		return false
	}
	// Only PFV 0 is defined: another value is an invalid field (as
	// SPDK's target says); HPDA is valid up to 31 but this target only
	// places data right after the header (CPDA 0, as Linux hosts ask):
	// an unsupported parameter.
	if ic.PFV != 0 {
		return bad(nvme.TCPFESInvalidHeaderField, nvme.TCPOffPFV, "ICReq PFV not 0")
	}
	if ic.HPDA != 0 {
		return bad(nvme.TCPFESUnsupportedParam, nvme.TCPOffHPDA, "ICReq HPDA not 0")
	}
	dg := nvme.TCPDigestsOf(ic.DGST)
	if dg.Header && c.p.cfg.NoHeaderDigest || dg.Data && c.p.cfg.NoDataDigest {
		return bad(nvme.TCPFESUnsupportedParam, nvme.TCPOffDGST, "ICReq asks for a digest the port refuses")
	}
	c.dg = dg
	c.hd = dg.HeaderDigestLen()
	if dg.Header || dg.Data {
		c.p.digestConns.Add(1)
	}
	resp := nvme.TCPICRespPDU{DGST: dg.DGST(), MaxH2CData: c.p.cfg.MaxH2CData}
	resp.Marshal(&c.icresp)
	c.tx.push(c.icresp[:], nil)
	c.g.markFlush(c)
	c.state = connLive
	return true
}

// newQueue creates the core's queue at the connection's first capsule
// and sizes its requests. A Connect says the queue's ID and size
// (SQSIZE+1 requests, within the port's limits; the core refuses a size
// outside them, and the queue then keeps the admin sizing); any other
// first command gets admin sizing, and the core answers it Invalid Opcode.
func (c *conn) newQueue(sqe []byte) bool {
	var qid, sqsize uint16
	entries := uint32(AdminQueueEntries)
	if sqe[0] == nvme.OpcodeFabrics && sqe[4] == uint8(nvme.FabricsConnect) {
		qid = binary.LittleEndian.Uint16(sqe[42:])
		sqsize = binary.LittleEndian.Uint16(sqe[44:])
		limit := c.p.limits.MaxQueueEntries
		if qid == 0 {
			limit = AdminQueueEntries
		}
		if n := uint32(sqsize) + 1; sqsize > 0 && n <= limit {
			entries = n
		}
	}
	c.qid = qid
	c.reqs = make([]req, entries)
	c.free = make([]uint16, entries)
	c.firstRun = target.NewFirstRun(entries)
	for i := range c.reqs {
		r := &c.reqs[i]
		r.c = c
		r.slot = uint16(i)
		r.Binding = r // set once: no allocation per command
		c.free[i] = uint16(len(c.reqs) - 1 - i)
	}
	ring := make([]txEntry, int(entries)*txPerReq+txSpare)
	for i := 0; i < c.tx.n; i++ {
		ring[i] = c.tx.e[(c.tx.head+i)%len(c.tx.e)]
	}
	c.tx.e, c.tx.head = ring, 0
	q, err := c.p.t.NewQueue(c, c.p.queueParams(c, qid, sqsize))
	if err != nil {
		c.closeSocket(err)
		return false
	}
	c.q = q
	c.logAccepted()
	return true
}

// onCapsule starts a command: checks SGL1 against what the queue can
// move, then takes its data (in the capsule, or by R2T) or executes it.
func (c *conn) onCapsule(h *nvme.TCPHeader, b []byte) bool {
	sqe := b[nvme.TCPCommonHeaderSize:nvme.TCPCapsuleCmdHeaderSize]
	if c.q == nil && !c.newQueue(sqe) {
		return false
	}
	n := len(c.free)
	if n == 0 {
		// More commands in flight than SQSIZE+1: the host broke the
		// queue's flow control. nvmet drops the connection ("out of
		// commands"); the digest's FES table has no better name than a
		// PDU that may not come now, a PDU sequence error.
		c.terminate(nvme.TCPFault{FES: nvme.TCPFESPDUSequence, What: "more commands than the queue holds"}, b)
		return false
	}
	r := &c.reqs[c.free[n-1]]
	c.free = c.free[:n-1]
	c.g.st.commands.Add(1)
	_ = r.Cmd.Unmarshal(sqe)
	r.Rsp = nvme.Completion{}
	r.Dir = r.Cmd.DataDirection()
	r.Len, r.Data, r.got, r.fail = 0, nil, 0, 0
	r.Group = c.g.tg // every Execute of this binding runs on the group
	r.Seq, r.PrevFuse = c.seq, c.prevFuse
	c.firstRun.Mark(r.Seq, false)
	c.seq++
	c.prevFuse = r.Cmd.Fuse()
	dlen := int(h.DataLen(c.dg))
	if st := c.checkSGL(r, uint32(dlen)); st != 0 {
		c.prevFuse = 0 // refused here: a second after it finds no first
		if dlen > 0 {
			// Read the data and drop it, then answer.
			r.fail = st
			r.to(reqRecvData)
			c.startData(pduCapsule, r, nil, dlen, c.dg.Data)
			return true
		}
		c.refuse(r, st)
		return true
	}
	switch {
	case dlen > 0:
		c.g.st.inCapsule.Add(1)
		if !c.g.attachCapsule(r) {
			c.g.st.dataWaits.Add(1)
			r.to(reqWaitBuf)
			c.g.waitCapsule(r)
			c.rxPaused = true
			c.startData(pduCapsule, r, nil, dlen, c.dg.Data)
			return false
		}
		r.to(reqRecvData)
		c.startData(pduCapsule, r, r.Data, dlen, c.dg.Data)
	case r.Len > 0:
		if !c.g.attach(r) {
			c.g.st.dataWaits.Add(1)
			r.to(reqWaitBuf)
			c.g.wait(r)
			return true
		}
		c.start(r)
	default:
		c.execute(r)
	}
	return true
}

// checkSGL checks SGL1 as nvmet_tcp_map_data does and sets r.Len; it
// returns the status (with DNR) that refuses the command, or 0.
func (c *conn) checkSGL(r *req, dlen uint32) nvme.Status {
	sgl := &r.Cmd.DPTR
	switch sgl.ID {
	case nvme.SGLIDInCapsule:
		if sgl.Length == 0 && dlen == 0 {
			return 0
		}
		if r.Dir != nvme.DirHostToCtrl {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		limit := c.p.limits.InCapsule
		if c.qid == 0 || r.Cmd.IsFabrics() {
			limit = nvme.TCPAdminInCapsule
		}
		if sgl.Length > limit || sgl.Addr != 0 {
			return nvme.StatusSGLInvalidOffset | nvme.StatusDNR
		}
		if sgl.Length != dlen {
			return nvme.StatusSGLInvalidDataLength | nvme.StatusDNR
		}
		r.Len = sgl.Length
	case nvme.SGLIDTransportDataTCP:
		if dlen != 0 {
			// Data in the capsule that SGL1 does not describe.
			return nvme.StatusSGLInvalidDataLength | nvme.StatusDNR
		}
		if sgl.Length == 0 || r.Dir == nvme.DirNone {
			return 0
		}
		if r.Dir == nvme.DirBidirectional {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		if sgl.Length > c.p.limits.MaxTransfer {
			return nvme.StatusSGLInvalidDataLength | nvme.StatusDNR // as target/rdma
		}
		r.Len = sgl.Length
	default:
		return nvme.StatusSGLInvalidType | nvme.StatusDNR
	}
	return 0
}

// gotBuffer moves on a command that waited for its data buffer.
func (c *conn) gotBuffer(r *req) {
	if c.state != connLive {
		c.g.release(r)
		c.reclaim(r)
		return
	}
	if x := &c.rx; x.phase == rxData && x.req == r {
		// In-capsule data: the socket's input resumes into the buffer.
		r.to(reqRecvData)
		x.dst = r.Data
		c.rxPaused = false
		c.g.markReady(c)
		return
	}
	c.start(r)
}

// start moves on a command with a data buffer and data outside the
// capsule: an R2T for host data, Execute for read data.
func (c *conn) start(r *req) {
	if r.Dir == nvme.DirHostToCtrl {
		r.to(reqR2T)
		c.putDataHeader(r, nvme.TCPR2T, 0, 0, r.Len)
		c.tx.push(r.hdr[:nvme.TCPDataHeaderSize+c.hd], nil)
		c.g.markFlush(c)
		c.g.st.r2ts.Add(1)
		return
	}
	c.execute(r)
}

// putDataHeader builds an R2T or C2HData header (and its digest) in r.hdr.
func (c *conn) putDataHeader(r *req, typ, flags uint8, plenData, length uint32) {
	h := nvme.TCPHeader{Type: typ, Flags: flags, HLen: nvme.TCPDataHeaderSize, PLen: uint32(nvme.TCPDataHeaderSize + c.hd)}
	if c.hd > 0 {
		h.Flags |= nvme.TCPFlagHDGST
	}
	if plenData > 0 {
		h.PDO = uint8(h.PLen)
		h.PLen += plenData
	}
	h.Marshal(r.hdr[:])
	d := nvme.TCPDataPDU{CCCID: r.Cmd.CID, Length: length}
	if typ == nvme.TCPR2T {
		d.TTag = r.slot
	}
	d.Marshal(r.hdr[:])
	if c.hd > 0 {
		nvme.PutTCPHeaderDigest(r.hdr[:], nvme.TCPDataHeaderSize)
	}
}

// onH2CData checks an H2CData header against the command it names (as
// nvmet and SPDK do) and sets its data to go into the command's buffer.
func (c *conn) onH2CData(h *nvme.TCPHeader, b []byte) bool {
	var d nvme.TCPDataPDU
	_ = d.Unmarshal(b)
	bad := func(fes uint16, fei uint32, what string) bool {
		c.terminate(nvme.TCPFault{FES: fes, FEI: fei, What: what}, b)
		return false
	}
	dlen := h.DataLen(c.dg)
	if d.Length != dlen {
		return bad(nvme.TCPFESInvalidHeaderField, nvme.TCPOffDataL, "H2CData DATAL is not the PDU's data")
	}
	if d.Length > c.p.cfg.MaxH2CData {
		return bad(nvme.TCPFESDataLimitExceeded, nvme.TCPOffDataL, "H2CData DATAL above MAXH2CDATA")
	}
	if int(d.TTag) >= len(c.reqs) || c.reqs[d.TTag].state != reqR2T {
		return bad(nvme.TCPFESInvalidHeaderField, nvme.TCPOffTTag, "H2CData TTAG names no command awaiting data")
	}
	r := &c.reqs[d.TTag]
	if d.CCCID != r.Cmd.CID {
		return bad(nvme.TCPFESInvalidHeaderField, nvme.TCPOffCCCID, "H2CData CCCID is not the TTAG's command")
	}
	if d.Offset != r.got {
		return bad(nvme.TCPFESDataOutOfRange, nvme.TCPOffDataO, "H2CData DATAO is not the bytes received so far")
	}
	end := uint64(d.Offset) + uint64(d.Length)
	if end > uint64(r.Len) {
		return bad(nvme.TCPFESDataOutOfRange, nvme.TCPOffDataL, "H2CData beyond the R2T")
	}
	if (h.Flags&nvme.TCPFlagLastPDU != 0) != (end == uint64(r.Len)) {
		return bad(nvme.TCPFESInvalidHeaderField, nvme.TCPOffFlags, "H2CData LAST_PDU not on the R2T's last PDU")
	}
	c.g.st.h2c.Add(1)
	c.startData(pduH2C, r, r.Data[d.Offset:end], int(d.Length), c.dg.Data)
	return true
}

// execute hands r to the core; it comes back through Complete.
func (c *conn) execute(r *req) {
	r.to(reqExec)
	c.inCore++
	if r.Cmd.Fuse() == nvme.FlagFuseFirst {
		c.firstRan(r) // its second may take the reserve now (fused.go)
	}
	c.q.Execute(&r.Request)
}

// refuse answers a command the binding refused, without the core.
func (c *conn) refuse(r *req, st nvme.Status) {
	if r.PrevFuse == nvme.FlagFuseFirst && c.q != nil {
		c.q.Refused(&r.Request) // the first before it has lost its second
	}
	c.g.release(r)
	r.Rsp = nvme.Completion{Status: st}
	r.Dir = nvme.DirNone
	c.respond(r)
}

// completed takes a request back from the core (on the group).
func (c *conn) completed(r *req) {
	c.inCore--
	if c.pending && c.q.Connected() {
		c.unpend()
	}
	if c.state != connLive {
		c.g.release(r)
		c.reclaim(r)
		return
	}
	c.respond(r)
}

// respond queues r's data and response. A successful read goes as one
// C2HData PDU (LAST_PDU) from the buffer the core filled, then a
// CapsuleResp — or none, with SUCCESS on the C2HData, when the host
// disabled SQ flow control and DW0 and DW1 are 0 (as nvmet and SPDK).
func (c *conn) respond(r *req) {
	r.to(reqSend)
	r.Rsp.SQID = c.qid
	r.Rsp.CID = r.Cmd.CID
	flowOff := c.q != nil && c.q.SQFlowControlDisabled()
	if flowOff {
		r.Rsp.SQHead = 0xFFFF
	} else {
		c.sqhd = (c.sqhd + 1) % uint32(len(c.reqs))
		r.Rsp.SQHead = uint16(c.sqhd)
	}
	st := &c.g.st
	if r.Rsp.Status == nvme.StatusSuccess && r.Dir == nvme.DirCtrlToHost && r.Len > 0 && r.buf != nil {
		success := flowOff && r.Rsp.DW0 == 0 && r.Rsp.DW1 == 0
		flags := nvme.TCPFlagLastPDU
		if success {
			flags |= nvme.TCPFlagSuccess
		}
		dd := uint32(c.dg.DataDigestLen())
		if dd > 0 {
			flags |= nvme.TCPFlagDDGST
		}
		c.putDataHeader(r, nvme.TCPC2HData, flags, r.Len+dd, r.Len)
		st.c2h.Add(1)
		c.tx.push(r.hdr[:nvme.TCPDataHeaderSize+c.hd], nil)
		if success {
			st.successFlags.Add(1)
		}
		if dd == 0 {
			c.tx.push(r.Data, nil)
			if success {
				c.tx.e[(c.tx.head+c.tx.n-1)%len(c.tx.e)].r = r
			}
		} else {
			binary.LittleEndian.PutUint32(r.ddgst[:], nvme.TCPDigest(r.Data))
			c.tx.push(r.Data, nil)
			c.tx.push(r.ddgst[:], nil)
			if success {
				c.tx.e[(c.tx.head+c.tx.n-1)%len(c.tx.e)].r = r
			}
		}
		if success {
			c.g.markFlush(c)
			return
		}
	} else {
		c.g.release(r) // host data, or nothing to send: the buffer is free now
	}
	h := nvme.TCPHeader{Type: nvme.TCPCapsuleResp, HLen: nvme.TCPCapsuleRespSize, PLen: uint32(nvme.TCPCapsuleRespSize + c.hd)}
	if c.hd > 0 {
		h.Flags = nvme.TCPFlagHDGST
	}
	h.Marshal(r.rsp[:])
	r.Rsp.Marshal((*[nvme.CQESize]byte)(r.rsp[nvme.TCPCommonHeaderSize:nvme.TCPCapsuleRespSize]))
	if c.hd > 0 {
		nvme.PutTCPHeaderDigest(r.rsp[:], nvme.TCPCapsuleRespSize)
	}
	st.resps.Add(1)
	c.tx.push(r.rsp[:nvme.TCPCapsuleRespSize+c.hd], r)
	c.g.markFlush(c)
}

// reclaim frees r's slot without answering (its connection is going).
func (c *conn) reclaim(r *req) {
	if r.state != reqFree {
		r.to(reqFree)
		c.free = append(c.free, r.slot)
	}
	c.maybeGone()
}

// sent frees the slot of a request whose last PDU is written.
func (c *conn) sent(r *req) {
	c.g.release(r)
	r.to(reqFree)
	c.free = append(c.free, r.slot)
}

// flush writes queued output with writev until the ring is empty or the
// socket full (then EPOLLOUT says when to go on).
func (c *conn) flush() {
	t := &c.tx
	g := c.g
	for t.n > 0 {
		k, total := 0, 0
		for i := 0; i < t.n && k < len(g.iov); i++ {
			b := t.e[(t.head+i)%len(t.e)].b
			if len(b) == 0 {
				continue
			}
			g.iov[k].Base = &b[0]
			g.iov[k].SetLen(len(b))
			k++
			total += len(b)
		}
		g.iovN = k
		c.wn, c.werr = 0, nil
		if k > 0 {
			if err := c.rc.Write(c.writeFn); err != nil && c.werr == nil {
				c.werr = err
			}
		}
		clear(g.iov[:k])
		if c.werr == syscall.EAGAIN {
			c.writable = false
			return
		}
		if c.werr != nil {
			c.closeSocket(c.werr)
			return
		}
		g.st.writes.Add(1)
		g.st.bytesOut.Add(uint64(c.wn))
		c.advance(c.wn)
		if c.wn < total {
			c.writable = false
			return
		}
	}
	if c.state == connClosing {
		c.linger()
	}
}

// advance drops n written bytes from the ring, freeing the slots of the
// requests whose last piece went.
func (c *conn) advance(n int) {
	t := &c.tx
	for t.n > 0 {
		e := &t.e[t.head]
		if n < len(e.b) {
			e.b = e.b[n:]
			return
		}
		n -= len(e.b)
		r := e.r
		*e = txEntry{}
		t.head = (t.head + 1) % len(t.e)
		t.n--
		if r != nil {
			c.sent(r)
		}
	}
}

// terminate sends a C2HTermReq (with the offending header, up to 128
// bytes) after what is queued, then closes.
func (c *conn) terminate(f nvme.TCPFault, hdr []byte) {
	c.g.st.terms.Add(1)
	c.logTerminated(f.FES, f.FEI, f.What)
	if len(hdr) > nvme.TCPTermReqMaxData {
		hdr = hdr[:nvme.TCPTermReqMaxData]
	}
	n := nvme.MarshalTermReq(c.term[:], nvme.TCPC2HTermReq, f, hdr)
	c.tx.push(c.term[:n], nil)
	c.closeStart(true, fmt.Errorf("%w: %s", errTerminated, f.What))
}

// closeStart begins closing: the core's queue is closed (the core
// completes what it holds; those come back here and are reclaimed), no
// more input is taken, and — graceful — queued output is written before
// the FIN, else the socket closes now.
func (c *conn) closeStart(graceful bool, reason error) {
	if c.state >= connClosing {
		if !graceful {
			c.closeSocket(reason)
		}
		return
	}
	c.reason = reason
	c.state = connClosing
	c.unpend()
	c.rxPaused = false
	if c.q != nil {
		c.q.Close()
	}
	c.g.unwait(c)
	if !graceful || c.pslot < 0 {
		c.closeSocket(reason)
		return
	}
	c.g.setDeadline(c, time.Now().Add(lingerTimeout))
	if c.tx.n == 0 {
		c.linger()
	} else {
		c.g.markFlush(c)
	}
}

// linger sends the FIN after the last output and waits for the host's
// (or the deadline); a closing port does not wait.
func (c *conn) linger() {
	c.state = connLinger
	if c.p.isClosing() {
		c.closeSocket(c.reason)
		return
	}
	_ = c.nc.CloseWrite()
	c.g.markReady(c)
}

// closeSocket closes the socket now; unsent output is dropped and every
// request not in the core is reclaimed.
func (c *conn) closeSocket(reason error) {
	if c.state == connClosed {
		return
	}
	if c.reason == nil {
		c.reason = reason
	}
	if c.state < connClosing {
		c.state = connClosing
		if c.q != nil {
			c.q.Close()
		}
		c.g.unwait(c)
	}
	c.state = connClosed
	c.unpend()
	c.g.unregister(c)
	_ = c.nc.Close()
	for c.tx.n > 0 {
		e := &c.tx.e[c.tx.head]
		r := e.r
		*e = txEntry{}
		c.tx.head = (c.tx.head + 1) % len(c.tx.e)
		c.tx.n--
		if r != nil {
			c.sent(r)
		}
	}
	for i := range c.reqs {
		r := &c.reqs[i]
		switch r.state {
		case reqRecvData, reqR2T, reqSend:
			c.g.release(r)
			r.to(reqFree)
			c.free = append(c.free, r.slot)
		}
	}
	c.rx.req, c.rx.dst = nil, nil
	c.logClosed()
	c.maybeGone()
}

// unpend takes c out of the port's count of connections not connected
// yet: its queue connected, or it closed.
func (c *conn) unpend() {
	if c.pending {
		c.pending = false
		c.p.releasePending(c)
	}
}

// maybeGone lets go of a closed connection once the core has given back
// every request.
func (c *conn) maybeGone() {
	if c.state != connClosed || c.inCore > 0 || c.gone {
		return
	}
	c.gone = true
	c.g.conns.Add(-1)
	c.p.conns.Remove(c)
}

// readv is one non-blocking readv into a (and b, if not empty).
func (c *conn) readv(a, b []byte) (int, error) {
	c.riovN = 0
	for _, s := range [2][]byte{a, b} {
		if len(s) > 0 {
			c.riov[c.riovN].Base = &s[0]
			c.riov[c.riovN].SetLen(len(s))
			c.riovN++
		}
	}
	if c.riovN == 0 {
		return 0, nil
	}
	c.rn, c.rerr = 0, nil
	if err := c.rc.Read(c.readFn); err != nil {
		return 0, err
	}
	c.riov = [2]syscall.Iovec{}
	return c.rn, c.rerr
}

func (c *conn) readFD(fd uintptr) bool {
	for {
		r, _, e := syscall.Syscall(syscall.SYS_READV, fd, uintptr(unsafe.Pointer(&c.riov[0])), uintptr(c.riovN))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			c.rerr = e
		} else {
			c.rn = int(r)
		}
		return true // never wait in Go's netpoller: the group polls
	}
}

func (c *conn) writevFD(fd uintptr) bool {
	g := c.g
	for {
		r, _, e := syscall.Syscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&g.iov[0])), uintptr(g.iovN))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			c.werr = e
		} else {
			c.wn = int(r)
		}
		return true
	}
}

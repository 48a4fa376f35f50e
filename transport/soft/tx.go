package soft

import (
	"encoding/binary"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft/wire"
)

const (
	// txBufSize holds the headers, CRCs and small payloads of one batch:
	// 256 KiB is 64 FPDUs of 4 KiB plus headers; larger payloads go to
	// writev as references to registered memory, not copies.
	txBufSize = 256 << 10
	// txCopyMax: payloads up to this size are copied into the batch buffer
	// (a memcpy is cheaper than an iovec entry); larger ones are sent from
	// where they are.
	txCopyMax = 512
	// txMaxIov bounds the iovecs of one writev (Linux IOV_MAX is 1024).
	txMaxIov = 512
)

// txPin is n pins of one provider-owned region.
type txPin struct {
	m *mr
	n int32
}

// hold records a pin taken for the batch; m may be nil (nothing pinned).
func (t *txState) hold(m *mr) {
	if m == nil {
		return
	}
	for i := range t.pins {
		if t.pins[i].m == m {
			t.pins[i].n++
			return
		}
	}
	t.pins = append(t.pins, txPin{m: m, n: 1})
}

// release gives back every pin of the batch.
func (t *txState) release() {
	for i := range t.pins {
		t.pins[i].m.unpinN(t.pins[i].n)
		t.pins[i] = txPin{}
	}
	t.pins = t.pins[:0]
}

// txState is owned by the sender goroutine.
type txState struct {
	buf      []byte // batch buffer; never reallocated
	segStart int    // start of the part of buf not yet referenced by iov
	iov      net.Buffers
	iovBack  [][]byte
	comps    []pendingComp
	sendMSN  uint32
	readMSN  uint32
	segs     [maxSge][]byte
	rreq     [wire.ReadRequestLen]byte
	// pins are the provider-owned regions the batch's iovecs reference,
	// with how many pins each holds; released once the batch is written
	// (or failed), so that a region closed meanwhile is unmapped only
	// after the writev.
	pins []txPin
	// Poll-group mode: a batch being written without blocking.
	wpending bool
	wiov     []syscall.Iovec
	wrN      int
	wrErr    error
	writevFn func(fd uintptr) bool // t.writevFD, bound once

	copied atomic.Uint64 // payload bytes copied into the batch buffer
	writes atomic.Uint64 // writev calls
	fpdus  atomic.Uint64
}

func (t *txState) init(q *qp) {
	t.buf = make([]byte, 0, txBufSize)
	t.iovBack = make([][]byte, 0, txMaxIov+8)
	t.iov = t.iovBack[:0]
	t.comps = make([]pendingComp, 0, len(q.sq))
	t.pins = make([]txPin, 0, 8)
	t.sendMSN, t.readMSN = 1, 1
	if q.poll != nil {
		t.wiov = make([]syscall.Iovec, txMaxIov+8)
		t.writevFn = t.writevFD
	}
}

// sender drains the send queue and the inbound read queue into FPDUs.
func (q *qp) sender() {
	defer q.flushSQ()
	defer q.tx.release()
	if q.delay > 0 {
		select {
		case <-time.After(q.delay):
		case <-q.done:
			return
		}
	}
	for {
		select {
		case <-q.kick:
		case <-q.done:
			return
		}
		for {
			progressed := false
			for q.serveRead() {
				progressed = true
			}
			p, r := q.drainSQ(false)
			if r != drainDone {
				return
			}
			if !progressed && !p {
				break
			}
		}
		if !q.flushTx() {
			return
		}
	}
}

// drainResult is how drainSQ stopped.
type drainResult uint8

const (
	drainDone        drainResult = iota // nothing more to emit now
	drainEmitFailed                     // a request could not be emitted: the QP failed
	drainWriteFailed                    // a full batch could not be written (see the caller's write)
)

// full says the batch should be written before more is added to it.
func (t *txState) full() bool {
	return len(t.iov) >= txMaxIov || len(t.buf) > txBufSize-txBufSize/4
}

// drainSQ emits the send queue's requests into the batch, in order, until
// it is empty or its head must wait (stalled), writing the batch whenever
// it is full: with writeBatch on a poll group's thread (poll), else with
// flushTx. progressed says a request was emitted.
func (q *qp) drainSQ(poll bool) (progressed bool, r drainResult) {
	t := &q.tx
	head, tail := q.sqHead.Load(), q.sqBell.Load()
	for head < tail {
		w := &q.sq[head%uint64(len(q.sq))]
		if q.stalled(w) {
			break
		}
		if !q.emit(w) {
			return progressed, drainEmitFailed
		}
		w.ctx = nil
		head++
		q.sqHead.Store(head)
		progressed = true
		if t.full() {
			var ok bool
			if poll {
				ok = q.writeBatch()
			} else {
				ok = q.flushTx()
			}
			if !ok {
				return progressed, drainWriteFailed
			}
		}
	}
	return progressed, drainDone
}

// stalled says the request must wait: a read beyond ORD, or a fenced
// request behind reads in flight.
func (q *qp) stalled(w *sendWR) bool {
	if w.op != transport.OpRead && w.flags&transport.FlagReadFence == 0 {
		return false
	}
	q.orqMu.Lock()
	n := q.orqN
	q.orqMu.Unlock()
	if w.flags&transport.FlagReadFence != 0 && n > 0 {
		return true
	}
	return w.op == transport.OpRead && n >= q.ord
}

// flushTx writes the batch with one writev and completes its requests.
func (q *qp) flushTx() bool {
	t := &q.tx
	if len(t.buf) > t.segStart {
		t.iov = append(t.iov, t.buf[t.segStart:])
	}
	var err error
	if len(t.iov) > 0 {
		q.wmu.Lock()
		_, err = t.iov.WriteTo(q.conn)
		q.wmu.Unlock()
		t.writes.Add(1)
	}
	q.txDone(err)
	if err != nil {
		q.fail(errConnection(err))
		return false
	}
	return true
}

// txDone ends the batch (written, or given up): the buffer and iovecs are
// emptied, its pins go back and its requests complete, successfully once
// their bytes were handed to TCP, with ErrCancelled when the write failed.
func (q *qp) txDone(err error) {
	t := &q.tx
	t.wpending = false
	clear(t.iovBack[:cap(t.iovBack)])
	t.iov = t.iovBack[:0]
	t.buf = t.buf[:0]
	t.segStart = 0
	t.release()
	for i := range t.comps {
		c := &t.comps[i]
		if err != nil {
			q.completeSQ(c.op, c.ctx, 0, transport.ErrCancelled, false)
		} else {
			q.completeSQ(c.op, c.ctx, c.bytes, nil, c.silent)
		}
		c.ctx = nil
	}
	t.comps = t.comps[:0]
}

// reserve returns n bytes at the end of the batch buffer.
func (t *txState) reserve(n int) []byte {
	l := len(t.buf)
	t.buf = t.buf[:l+n]
	return t.buf[l : l+n]
}

// payload adds p to the batch: copied when small, else referenced.
func (t *txState) payload(p []byte) {
	if len(p) == 0 {
		return
	}
	if len(p) <= txCopyMax {
		t.buf = append(t.buf, p...)
		t.copied.Add(uint64(len(p)))
		return
	}
	if len(t.buf) > t.segStart {
		t.iov = append(t.iov, t.buf[t.segStart:])
	}
	t.iov = append(t.iov, p)
	t.segStart = len(t.buf)
}

// fpdu frames one segment: h, the payload gathered from segs starting at
// (seg, off) for n bytes, pad and CRC. It returns the new position.
func (q *qp) fpdu(h *wire.Header, segs [][]byte, seg, off, n int) (int, int) {
	t := &q.tx
	hl := h.Len()
	ulen := hl + n
	hb := t.reserve(wire.MPAHeaderLen + hl)
	binary.BigEndian.PutUint16(hb, uint16(ulen))
	h.Put(hb[wire.MPAHeaderLen:])
	var crc uint32
	if q.crc {
		crc = wire.CRCUpdate(0, hb)
	}
	for n > 0 {
		p := segs[seg][off:]
		if len(p) > n {
			p = p[:n]
		}
		t.payload(p)
		if q.crc {
			crc = wire.CRCUpdate(crc, p)
		}
		n -= len(p)
		off += len(p)
		if off == len(segs[seg]) {
			seg++
			off = 0
		}
	}
	pad := wire.PadLen(ulen)
	tail := t.reserve(pad + wire.CRCLen)
	clear(tail)
	if q.crc {
		crc = wire.CRCUpdate(crc, tail[:pad])
		wire.PutCRC(tail[pad:], crc)
	}
	t.fpdus.Add(1)
	return seg, off
}

// message frames a whole message of length bytes from segs as FPDUs of at
// most maxPay payload bytes; h is updated per segment (MO or TO, Last).
func (q *qp) message(h *wire.Header, segs [][]byte, length uint32, maxPay int) {
	seg, off := 0, 0
	for len(segs) > 0 && seg < len(segs) && len(segs[seg]) == 0 {
		seg++
	}
	var done uint32
	for {
		n := min(int(length-done), maxPay)
		h.Last = done+uint32(n) == length
		if !h.Tagged {
			h.MO = done
		}
		seg, off = q.fpdu(h, segs, seg, off, n)
		done += uint32(n)
		if h.Last {
			return
		}
		if h.Tagged {
			h.TO += uint64(n)
		}
	}
}

// resolveLocal maps w's SGEs to memory; need is the access required.
func (q *qp) resolveLocal(w *sendWR, need transport.Access) ([][]byte, bool) {
	t := &q.tx
	for i := 0; i < int(w.n); i++ {
		s := &w.sges[i]
		b, pm, f := q.pd.pin(s.LKey, s.Addr, s.Length, need)
		if f != faultNone {
			return nil, false
		}
		t.hold(pm)
		t.segs[i] = b
	}
	return t.segs[:w.n], true
}

// sourceSegs is the payload of a send or write: the inline copy, or the
// registered memory its SGEs name.
func (q *qp) sourceSegs(w *sendWR) ([][]byte, bool) {
	if w.flags&transport.FlagInline != 0 {
		q.tx.segs[0] = w.inline
		return q.tx.segs[:1], true
	}
	return q.resolveLocal(w, 0)
}

// emit turns one send-queue request into FPDUs or a local action. It
// returns false when the QP failed.
func (q *qp) emit(w *sendWR) bool {
	t := &q.tx
	silent := w.flags&transport.FlagSilentSuccess != 0
	switch w.op {
	case transport.OpSend, transport.OpWrite:
		segs, ok := q.sourceSegs(w)
		if !ok {
			return q.localFault(w)
		}
		if w.op == transport.OpSend {
			h := wire.Header{Opcode: w.rdmap, Inval: w.rkey, QN: wire.QNSend, MSN: t.sendMSN}
			t.sendMSN++
			q.message(&h, segs, w.length, q.maxSendPay)
		} else {
			h := wire.Header{Tagged: true, Opcode: wire.OpWrite, STag: w.rkey, TO: w.raddr}
			q.message(&h, segs, w.length, q.maxTagPay)
		}
		t.comps = append(t.comps, pendingComp{ctx: w.ctx, op: w.op, bytes: w.length, silent: silent})
	case transport.OpRead:
		// The read response is a tagged write into the sink. It is
		// placed only if it names this read's sink (placeTagged), so the
		// sink needs local write alone, unless StrictReadSink asks for
		// the remote write of the tagged model.
		s := &w.sges[0]
		if _, f := q.pd.resolve(s.LKey, s.Addr, s.Length, q.sinkAccess()); f != faultNone {
			return q.localFault(w)
		}
		q.orqMu.Lock()
		if q.orqClosed {
			q.orqMu.Unlock()
			q.completeSQ(w.op, w.ctx, 0, transport.ErrCancelled, false)
			return true
		}
		i := (q.orqHead + q.orqN) % uint32(len(q.orq))
		q.orq[i] = readWR{ctx: w.ctx, length: w.length, silent: silent, stag: s.LKey, addr: s.Addr}
		q.orqN++
		q.orqMu.Unlock()
		h := wire.Header{Opcode: wire.OpReadRequest, QN: wire.QNReadRequest, MSN: t.readMSN, Last: true}
		t.readMSN++
		rr := wire.ReadRequest{SinkSTag: s.LKey, SinkTO: s.Addr, Size: w.length, SrcSTag: w.rkey, SrcTO: w.raddr}
		rr.Put(t.rreq[:])
		t.segs[0] = t.rreq[:]
		q.fpdu(&h, t.segs[:1], 0, 0, wire.ReadRequestLen)
	case transport.OpFastRegister:
		w.mr.fastRegister(w.key, w.buf, w.access)
		t.comps = append(t.comps, pendingComp{ctx: w.ctx, op: w.op, silent: silent})
	case transport.OpInvalidate:
		w.mr.invalidateAny()
		t.comps = append(t.comps, pendingComp{ctx: w.ctx, op: w.op, silent: silent})
	}
	return true
}

// localFault completes w with a local protection error and fails the QP,
// as a local access error does on RDMA hardware.
func (q *qp) localFault(w *sendWR) bool {
	q.flushTx()
	q.completeSQ(w.op, w.ctx, 0, transport.ErrAccessViolation, false)
	q.fail(transport.ErrAccessViolation)
	return false
}

// serveRead answers one of the peer's read requests; false when none.
func (q *qp) serveRead() bool {
	q.irqMu.Lock()
	if q.irqN == 0 {
		q.irqMu.Unlock()
		return false
	}
	rr := q.irq[q.irqHead]
	q.irqHead = (q.irqHead + 1) % uint32(len(q.irq))
	q.irqN--
	q.irqMu.Unlock()
	t := &q.tx
	src, pm, f := q.pd.pin(rr.SrcSTag, rr.SrcTO, rr.Size, transport.AccessRemoteRead)
	t.hold(pm)
	if f != faultNone {
		var hdr [wire.UntaggedHeaderLen]byte
		h := wire.Header{Opcode: wire.OpReadRequest, QN: wire.QNReadRequest, Last: true}
		h.Put(hdr[:])
		var body [wire.ReadRequestLen]byte
		rr.Put(body[:])
		q.flushTx()
		q.terminate(terminateFor(f), hdr[:], body[:])
		return false
	}
	h := wire.Header{Tagged: true, Opcode: wire.OpReadResponse, STag: rr.SinkSTag, TO: rr.SinkTO}
	t.segs[0] = src
	q.message(&h, t.segs[:1], rr.Size, q.maxTagPay)
	return true
}

// terminateFor maps an access fault to Terminate fields: remote protection
// errors at the RDMAP layer.
func terminateFor(f accessFault) wire.Terminate {
	code := uint8(wire.RDMAPInvalidSTag)
	switch f {
	case faultBounds:
		code = wire.RDMAPBaseBounds
	case faultAccess:
		code = wire.RDMAPAccessRights
	}
	return wire.Terminate{Layer: wire.LayerRDMAP, EType: wire.RDMAPRemoteProtection, Code: code}
}

// terminate sends a Terminate message carrying the offending headers and
// fails the QP. Safe from either goroutine.
func (q *qp) terminate(tm wire.Terminate, ddpHdr, rdmapHdr []byte) {
	if ddpHdr != nil {
		tm.DDPHeader = ddpHdr
		tm.SegLenValid = true
		tm.DDPSegLen = uint16(len(ddpHdr) + len(rdmapHdr))
	}
	tm.RDMAPHeader = rdmapHdr
	var body [128]byte
	payload := tm.Append(body[:0])
	h := wire.Header{Opcode: wire.OpTerminate, QN: wire.QNTerminate, MSN: 1, Last: true}
	var frame [256]byte
	hl := h.Len()
	binary.BigEndian.PutUint16(frame[:], uint16(hl+len(payload)))
	h.Put(frame[wire.MPAHeaderLen:])
	n := wire.MPAHeaderLen + hl
	n += copy(frame[n:], payload)
	pad := wire.PadLen(hl + len(payload))
	n += pad
	if q.crc {
		wire.PutCRC(frame[n:], wire.CRCUpdate(0, frame[:n]))
	}
	n += wire.CRCLen
	q.conn.SetWriteDeadline(time.Now().Add(time.Second))
	q.wmu.Lock()
	if q.poll != nil {
		q.finishPending() // the Terminate follows whole FPDUs
	}
	q.conn.Write(frame[:n])
	q.wmu.Unlock()
	q.fail(terminateError(tm, true))
}

package initiator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/internal/lfstack"
	"github.com/blk-project/blk/nvme"
)

// The NVMe/TCP wire of a queue (shared/docs/nvmeof-wire.md §5): one TCP
// connection per queue, admin queue included, set up as the Linux host
// does (TCP_NODELAY, ICReq with HPDA 0 and MAXR2T 0, the digests asked
// for, ICResp checked within 10 s), then driven by two goroutines:
//
//   - the receiver reads the connection into a fixed buffer of
//     tcpRecvBuffer bytes, each read taking whatever has arrived, so that
//     a burst of responses costs one read, not one each (a read at QD 32
//     with one syscall per 24-byte response was a syscall per I/O); it
//     parses from there a 24-byte header (+4 with header digests) per
//     PDU, checked with nvme.TCPHeader.Check and its digest; C2HData
//     payloads are copied from that buffer into the slot's, or read
//     straight into the slot's when at least half the buffer's size is
//     missing; R2Ts become jobs for the sender; CapsuleResp (or a
//     C2HData with SUCCESS) is the command's response.
//   - the sender drains a lock-free multi-producer stack of jobs (a
//     slot's capsule, pushed by the submitter; an R2T's data, pushed by
//     the receiver) and writes each batch with one writev (net.Buffers
//     over preallocated arrays): capsules with their in-capsule data,
//     H2CData PDUs of at most MAXH2CDATA bytes. Submitting is one
//     compare-and-swap, and a wake-up only when the sender sleeps: no
//     lock and no allocation per I/O.
//
// Copies per I/O in user space: a write is copied once, from the
// caller's buffer into the slot (WriteAsync returns at once); the kernel
// copies it from there (writev). A read is copied by the kernel into the
// receive buffer (read), from there into the slot (unless it is large
// enough to be read straight into the slot), and once from the slot into
// the caller's buffer before the callback; digests are one more pass
// over the data, not a copy. A 4 KiB copy costs less than the read
// syscall per PDU it saves.
//
// The slot's "sent" event (queue.sent) is when the sender is done with
// the slot's memory: after the capsule's write for every command but a
// write with R2T data, after the write of the last byte of data for
// those. busy counts the sender's unfinished jobs of a command, so that a
// response that comes before all data was asked for (an error status)
// completes it once the sender has let go of it.
//
// Fatal, failing the association (ErrConnectionLost, ErrProtocol): a
// header that Check refuses, a header digest mismatch, an unknown or
// stale CID, C2HData out of order or beyond the command, a bad R2T (R2TL
// 0, beyond the command, R2TO below what was asked already, an R2T while
// the previous one's data is not yet taken), C2HTermReq (its FES is
// logged), and the connection ending. A data digest mismatch fails only
// its command, with Data Transfer Error.

const (
	// tcpICRespTimeout is how long the host waits for ICResp: 10 s, as
	// Linux (or ConnectTimeout when shorter).
	tcpICRespTimeout = 10 * time.Second
	// tcpRecvHeader is the header the receiver reads per PDU: every PDU
	// a controller sends after ICResp has HLEN 24 (CapsuleResp, C2HData,
	// R2T, C2HTermReq), then the header digest.
	tcpRecvHeader = nvme.TCPDataHeaderSize
	// tcpMaxIov bounds the buffers of one writev; a batch that needs
	// more is written in several (Linux's UIO_MAXIOV is 1024).
	tcpMaxIov = 512
	// tcpH2CHeader is one H2CData PDU's header and header digest, plus
	// its data digest, in the sender's arena.
	tcpH2CHeader = nvme.TCPDataHeaderSize + 2*nvme.TCPDigestSize
	// tcpArenaPDUs is how many H2CData headers one writev carries at
	// most (each takes three buffers: header, data, data digest).
	tcpArenaPDUs = tcpMaxIov / 3
	// tcpRecvBuffer is the receiver's buffer: 32 KiB, a burst of a
	// thousand responses, or several 4 KiB reads' C2HData PDUs, per read.
	tcpRecvBuffer = 32 << 10
)

// Sender job kinds.
const (
	jobCapsule uint8 = iota + 1
	jobH2C
)

// tcpSlot is a slot's NVMe/TCP state.
type tcpSlot struct {
	// pdu is the CapsuleCmd header: the common header, the SQE (s.sqe
	// is pdu[8:72]) and room for the header digest; plen of it is sent.
	pdu   [nvme.TCPCapsuleCmdHeaderSize + nvme.TCPDigestSize]byte
	plen  int
	ddgst [nvme.TCPDigestSize]byte // the in-capsule data's digest

	// gen is the generation of the command in flight, set by place:
	// the goroutines use it, never s.gen, which release changes.
	gen uint8

	// The sender's job stack: next links it, queued says the slot is
	// on it (a slot is on it at most once), job is what to do. Written
	// by whoever pushes, read by the sender when it takes the stack.
	next   *slot
	queued atomic.Bool
	job    uint8
	// busy counts the sender's jobs of this command not finished yet:
	// 1 for the capsule from place, +1 per R2T.
	busy atomic.Int32

	// The R2T being answered: written by the receiver before pushing
	// the job, read by the sender when it takes the job.
	ttag           uint16
	r2tOff, r2tLen uint32

	// Receiver-owned, reset by place: the end of the data asked for by
	// R2Ts so far, the C2HData bytes received, and a data digest
	// mismatch (the command then fails with Data Transfer Error).
	r2tEnd  uint32
	rcvd    uint32
	xferErr bool
}

// needsR2T says whether the command in flight on s sends its data in
// H2CData PDUs, when the controller asks (a write too large for the
// capsule).
func (s *slot) needsR2T() bool { return s.dir == nvme.DirHostToCtrl && s.inline == 0 && s.n > 0 }

// tcpJob is one job as the sender took it off the stack. What it needs
// of the command is copied here while the command is sure to be current:
// once busy drops, the slot may complete and be reused at once.
type tcpJob struct {
	s    *slot
	kind uint8
	gen  uint8
	r2t  bool // the command's data waits for R2Ts
	last bool // an H2C job whose data ends the command's
	ttag uint16
	off  uint32
	n    uint32
}

// tcpWire is a queue's TCP connection and its two goroutines.
type tcpWire struct {
	q  *queue
	a  *association
	dg nvme.TCPDigests
	hd int // header digest bytes: 0 or 4
	dd int // data digest bytes: 0 or 4

	mu     sync.Mutex // guards conn and closed: setup and close only
	conn   net.Conn
	closed bool

	maxH2C uint32 // ICResp MAXH2CDATA

	// Submission: a Treiber stack drained whole by the sender (Swap, so
	// no ABA), and the sender's sleep flag and wake-up.
	head     lfstack.Stack[slot]
	sleeping atomic.Bool
	wake     chan struct{}

	// Sender-owned.
	jobs   []tcpJob // one batch, in submission order; depth entries
	post   []tcpJob // jobs whose bytes are in iov, finished after the write
	iov    [tcpMaxIov][]byte
	wb     net.Buffers // what WriteTo consumes (a field: no escape per write)
	arena  [tcpArenaPDUs * tcpH2CHeader]byte
	nArena int

	// Receiver-owned: rbuf[rr:rw] is read from the connection and not
	// yet parsed.
	rbuf   []byte
	rr, rw int
	rhdr   [nvme.TCPTermReqHeaderSize + nvme.TCPTermReqMaxData + nvme.TCPDigestSize]byte
	rdg    [nvme.TCPDigestSize]byte
	lim    nvme.TCPLimits

	st tcpCounters
}

// tcpCounters are a TCP queue's counters (atomics: read by tests and
// benchmarks while the goroutines run).
type tcpCounters struct {
	writes    atomic.Uint64 // writev calls
	pdusOut   atomic.Uint64 // PDUs written
	pdusIn    atomic.Uint64 // PDUs read
	r2ts      atomic.Uint64 // R2Ts answered
	inCapsule atomic.Uint64 // writes sent in the capsule
}

// newTCPWire builds the queue's slots over plain memory: each slot's
// capsule header lives in the slot, its data buffer in one allocation of
// depth × bufSize bytes.
func newTCPWire(q *queue, dg nvme.TCPDigests) *tcpWire {
	w := &tcpWire{q: q, a: q.a, dg: dg, hd: dg.HeaderDigestLen(), dd: dg.DataDigestLen(),
		wake: make(chan struct{}, 1), jobs: make([]tcpJob, 0, q.depth), post: make([]tcpJob, 0, q.depth),
		rbuf: make([]byte, tcpRecvBuffer)}
	w.lim = nvme.TCPLimits{Digests: dg, MaxData: uint32(q.bufSize)}
	q.initSlots()
	mem := make([]byte, q.depth*q.bufSize)
	for i := range q.slots {
		s := &q.slots[i]
		s.sqe = (*[nvme.SQESize]byte)(s.tcp.pdu[nvme.TCPCommonHeaderSize:nvme.TCPCapsuleCmdHeaderSize])
		off := i * q.bufSize
		s.data = mem[off : off+q.bufSize : off+q.bufSize]
	}
	q.w = w
	return w
}

// place: in-capsule data (SGL 0x01, offset 0) for a write of at most the
// queue's in-capsule size — 8192 bytes for every fabrics command, whatever
// the queue (NVME_TCP_ADMIN_CCSZ) —, else the transport SGL 0x5A with the
// length (0 without data), as Linux's nvme_tcp_map_data. It also resets
// the slot's TCP state for the new command, before it is published.
func (w *tcpWire) place(s *slot, dir nvme.Direction, n int) int {
	t := &s.tcp
	t.gen = s.gen
	t.r2tEnd, t.rcvd, t.xferErr = 0, 0, false
	t.busy.Store(1)
	limit := w.q.inCapsule
	if s.cmd.IsFabrics() {
		limit = max(limit, nvme.TCPAdminInCapsule)
	}
	if dir == nvme.DirHostToCtrl && n <= limit {
		s.cmd.DPTR = nvme.InCapsuleSGL(0, uint32(n))
		return n
	}
	if dir == nvme.DirNone {
		n = 0
	}
	s.cmd.DPTR = nvme.TransportSGL(uint32(n))
	return 0
}

// send finishes the CapsuleCmd PDU in the submitter's goroutine (header,
// digests) and pushes the slot to the sender.
func (w *tcpWire) send(s *slot) error {
	w.capsule(s)
	w.push(s)
	return nil
}

// sendPair queues both capsules in one push: the sender writes them in
// that order with nothing of the queue between them.
func (w *tcpWire) sendPair(s1, s2 *slot) error {
	w.capsule(s1)
	w.capsule(s2)
	s1.tcp.queued.Store(true)
	s2.tcp.queued.Store(true)
	w.head.PushPair(s1, &s1.tcp.next, s2, &s2.tcp.next)
	w.kick()
	return nil
}

// capsule encodes slot s's CapsuleCmd PDU header (and its data digest).
func (w *tcpWire) capsule(s *slot) {
	t := &s.tcp
	hlen := nvme.TCPCapsuleCmdHeaderSize
	h := nvme.TCPHeader{Type: nvme.TCPCapsuleCmd, HLen: uint8(hlen), PLen: uint32(hlen + w.hd)}
	if w.hd != 0 {
		h.Flags |= nvme.TCPFlagHDGST
	}
	if s.inline > 0 {
		h.PDO = uint8(hlen + w.hd)
		h.PLen += uint32(s.inline + w.dd)
		if w.dd != 0 {
			h.Flags |= nvme.TCPFlagDDGST
			binary.LittleEndian.PutUint32(t.ddgst[:], nvme.TCPDigest(s.data[:s.inline]))
		}
	}
	h.Marshal(t.pdu[:])
	t.plen = hlen
	if w.hd != 0 {
		t.plen = nvme.PutTCPHeaderDigest(t.pdu[:], hlen)
	}
	t.job = jobCapsule
}

// push puts s on the sender's stack and wakes the sender if it sleeps.
func (w *tcpWire) push(s *slot) {
	s.tcp.queued.Store(true)
	w.head.Push(s, &s.tcp.next)
	w.kick()
}

// kick wakes the sender if it sleeps.
func (w *tcpWire) kick() {
	if w.sleeping.Load() && w.sleeping.CompareAndSwap(true, false) {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func (w *tcpWire) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		if w.conn != nil {
			w.conn.Close()
		}
	}
}

func (w *tcpWire) release() {}

// connectTCP opens queue q's connection and initialises it (§5.2), then
// starts its receiver and sender.
func (a *association) connectTCP(ctx context.Context, q *queue, w *tcpWire) error {
	c := a.c
	d := net.Dialer{Timeout: c.cfg.ConnectTimeout}
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return fmt.Errorf("initiator: queue %d: TCP connect to %s: %w", q.qid, c.addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true) // Go's default; said here because the protocol depends on it
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		conn.Close()
		return a.lostErr()
	}
	w.conn = conn
	w.mu.Unlock()
	if err := w.initConnection(ctx, c.cfg.ConnectTimeout); err != nil {
		return fmt.Errorf("initiator: queue %d at %s: %w", q.qid, c.addr, err)
	}
	a.wg.Add(2)
	go w.receiver()
	go w.sender()
	return nil
}

// initConnection sends ICReq and checks ICResp as the Linux host does
// (nvme_tcp_init_connection): exactly 128 bytes within 10 s, type ICResp,
// PLEN 128, PFV 0, DGST the digests asked for (echoed, not negotiated),
// CPDA 0, MAXH2CDATA a multiple of 4 of at least 4096.
func (w *tcpWire) initConnection(ctx context.Context, timeout time.Duration) error {
	var req [nvme.TCPICSize]byte
	(&nvme.TCPICReqPDU{PFV: 0, HPDA: 0, DGST: w.dg.DGST(), MaxR2T: 0}).Marshal(&req)
	deadline := time.Now().Add(min(timeout, tcpICRespTimeout))
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	w.conn.SetDeadline(deadline)
	if _, err := w.conn.Write(req[:]); err != nil {
		return fmt.Errorf("send ICReq: %w", err)
	}
	var resp [nvme.TCPICSize]byte
	if _, err := io.ReadFull(w.conn, resp[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("%w: no ICResp within %v", ErrTimeout, min(timeout, tcpICRespTimeout))
		}
		return fmt.Errorf("read ICResp: %w", err)
	}
	w.conn.SetDeadline(time.Time{})
	var h nvme.TCPHeader
	h.Unmarshal(resp[:])
	if h.Type != nvme.TCPICResp {
		return fmt.Errorf("%w: PDU type %#x where ICResp was expected", ErrProtocol, h.Type)
	}
	if f := h.Check(false, nvme.TCPLimits{}); !f.OK() {
		return fmt.Errorf("%w: ICResp: %v", ErrProtocol, f)
	}
	var r nvme.TCPICRespPDU
	r.Unmarshal(resp[:])
	switch {
	case r.PFV != 0:
		return fmt.Errorf("%w: ICResp PFV %d, want 0", ErrProtocol, r.PFV)
	case r.DGST != w.dg.DGST():
		return fmt.Errorf("%w: ICResp digests %#x, asked for %#x", ErrProtocol, r.DGST, w.dg.DGST())
	case r.CPDA != 0:
		return fmt.Errorf("%w: ICResp CPDA %d not supported (must be 0)", ErrProtocol, r.CPDA)
	case r.MaxH2CData < nvme.TCPMinMaxH2CData || r.MaxH2CData%4 != 0:
		return fmt.Errorf("%w: ICResp MAXH2CDATA %d (must be a multiple of 4, at least %d)", ErrProtocol, r.MaxH2CData, nvme.TCPMinMaxH2CData)
	}
	w.maxH2C = r.MaxH2CData
	return nil
}

// Sender.

// sender writes the jobs pushed to the stack until the association ends.
func (w *tcpWire) sender() {
	defer w.a.wg.Done()
	for {
		head := w.head.TakeAll()
		if head == nil {
			// Announce the sleep, then look once more: a push either
			// lands before this Swap or sees sleeping and wakes us.
			w.sleeping.Store(true)
			if head = w.head.TakeAll(); head == nil {
				select {
				case <-w.wake:
				case <-w.a.done:
					return
				}
				continue
			}
			w.sleeping.Store(false)
		}
		if w.q.dead.Load() {
			return
		}
		w.take(head)
		if err := w.writeJobs(); err != nil {
			w.a.fail(fmt.Errorf("queue %d: write: %w", w.q.qid, err))
			return
		}
	}
}

// take copies the stack's jobs into w.jobs, oldest first, then lets the
// slots be pushed again.
func (w *tcpWire) take(head *slot) {
	w.jobs = w.jobs[:0]
	for s := head; s != nil; {
		t := &s.tcp
		next := t.next
		if len(w.jobs) == cap(w.jobs) {
			// More jobs than slots: a slot on the stack twice, which
			// queued rules out.
			panic(fmt.Sprintf("initiator: queue %d: sender stack holds more than %d jobs", w.q.qid, cap(w.jobs)))
		}
		w.jobs = append(w.jobs, tcpJob{s: s, kind: t.job, gen: t.gen, r2t: s.needsR2T(),
			last: int(t.r2tOff+t.r2tLen) == s.n, ttag: t.ttag, off: t.r2tOff, n: t.r2tLen})
		t.queued.Store(false)
		s = next
	}
	for i, j := 0, len(w.jobs)-1; i < j; i, j = i+1, j-1 {
		w.jobs[i], w.jobs[j] = w.jobs[j], w.jobs[i]
	}
}

// writeJobs writes the batch: as few writevs as the buffers allow.
func (w *tcpWire) writeJobs() error {
	k := 0
	for i := range w.jobs {
		j := &w.jobs[i]
		s := j.s
		switch j.kind {
		case jobCapsule:
			if k+3 > tcpMaxIov {
				var err error
				if k, err = w.flush(k); err != nil {
					return err
				}
			}
			w.iov[k] = s.tcp.pdu[:s.tcp.plen]
			k++
			if s.inline > 0 {
				w.iov[k] = s.data[:s.inline]
				k++
				if w.dd != 0 {
					w.iov[k] = s.tcp.ddgst[:]
					k++
				}
				w.st.inCapsule.Add(1)
			}
			w.st.pdusOut.Add(1)
		case jobH2C:
			st := s.state.Load()
			if st&slotStateMask != slotInflight || st>>stateGenShift != uint32(j.gen) || st&flagResp != 0 {
				break // failed, or answered already (an error before all data): send nothing
			}
			var err error
			if k, err = w.h2c(j, k); err != nil {
				return err
			}
		}
		w.post = append(w.post, *j)
	}
	_, err := w.flush(k)
	return err
}

// h2c adds the H2CData PDUs answering one R2T: DATAL at most MAXH2CDATA,
// DATAO absolute, TTAG echoed, LAST_PDU on the last.
func (w *tcpWire) h2c(j *tcpJob, k int) (int, error) {
	s := j.s
	end := j.off + j.n
	for off := j.off; off < end; {
		if k+3 > tcpMaxIov || w.nArena+tcpH2CHeader > len(w.arena) {
			var err error
			if k, err = w.flush(k); err != nil {
				return k, err
			}
		}
		n := min(end-off, w.maxH2C)
		hb := w.arena[w.nArena : w.nArena+tcpH2CHeader]
		w.nArena += tcpH2CHeader
		h := nvme.TCPHeader{Type: nvme.TCPH2CData, HLen: nvme.TCPDataHeaderSize,
			PDO: uint8(nvme.TCPDataHeaderSize + w.hd), PLen: uint32(nvme.TCPDataHeaderSize+w.hd+w.dd) + n}
		if w.hd != 0 {
			h.Flags |= nvme.TCPFlagHDGST
		}
		if w.dd != 0 {
			h.Flags |= nvme.TCPFlagDDGST
		}
		if off+n == end {
			h.Flags |= nvme.TCPFlagLastPDU
		}
		h.Marshal(hb)
		(&nvme.TCPDataPDU{CCCID: makeCID(s.tag, j.gen), TTag: j.ttag, Offset: off, Length: n}).Marshal(hb)
		hl := nvme.TCPDataHeaderSize
		if w.hd != 0 {
			hl = nvme.PutTCPHeaderDigest(hb, hl)
		}
		data := s.data[off : off+n]
		w.iov[k] = hb[:hl]
		w.iov[k+1] = data
		k += 2
		if w.dd != 0 {
			dg := hb[hl : hl+nvme.TCPDigestSize]
			binary.LittleEndian.PutUint32(dg, nvme.TCPDigest(data))
			w.iov[k] = dg
			k++
		}
		w.st.pdusOut.Add(1)
		off += n
	}
	return k, nil
}

// flush writes iov[:k] with one writev, then finishes the jobs whose
// bytes it carried.
func (w *tcpWire) flush(k int) (int, error) {
	if k > 0 {
		w.wb = w.iov[:k]
		_, err := w.wb.WriteTo(w.conn)
		clear(w.iov[:k]) // drop references to slots' memory
		w.st.writes.Add(1)
		if err != nil {
			return 0, err
		}
	}
	w.nArena = 0
	for i := range w.post {
		w.finished(&w.post[i])
	}
	w.post = w.post[:0]
	return 0, nil
}

// finished is the end of the sender's work on a job: the slot is sent
// once no byte of it remains to be written — after its capsule unless
// data waits for an R2T, after the last byte of data — or when the
// response came first.
func (w *tcpWire) finished(j *tcpJob) {
	s := j.s
	s.tcp.busy.Add(-1) // from here on only atomics of s: it may be reused
	switch {
	case j.kind == jobCapsule && !j.r2t,
		j.kind == jobH2C && j.last:
		w.q.sent(s, j.gen)
	default:
		if s.state.Load()&flagResp != 0 {
			w.q.sent(s, j.gen) // answered before all its data was asked for
		}
	}
}

// Receiver.

// receiver reads PDUs until the connection ends or breaks the protocol;
// either fails the association.
func (w *tcpWire) receiver() {
	defer w.a.wg.Done()
	err := w.receive()
	if w.q.dead.Load() {
		return
	}
	w.a.fail(fmt.Errorf("queue %d: %w", w.q.qid, err))
}

func (w *tcpWire) protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: NVMe/TCP: "+format, append([]any{ErrProtocol}, args...)...)
}

func (w *tcpWire) receive() error {
	hl := tcpRecvHeader + w.hd
	for {
		b := w.rhdr[:hl]
		if n, err := w.readFull(b); err != nil {
			if n >= nvme.TCPTermReqHeaderSize && b[0] == nvme.TCPC2HTermReq {
				return w.termReq(b[:n]) // a TermReq shorter than hl, then the close
			}
			return fmt.Errorf("connection ended: %w", err)
		}
		w.st.pdusIn.Add(1)
		var h nvme.TCPHeader
		h.Unmarshal(b)
		if f := h.Check(false, w.lim); !f.OK() {
			return w.protoErr("%v (type %#x, FES %#x, FEI %d)", f, h.Type, f.FES, f.FEI)
		}
		if h.Type == nvme.TCPC2HTermReq {
			return w.termReq(b)
		}
		if w.hd != 0 && !nvme.TCPHeaderDigestOK(b, tcpRecvHeader) {
			return w.protoErr("header digest error in a PDU of type %#x", h.Type)
		}
		var err error
		switch h.Type {
		case nvme.TCPCapsuleResp:
			var cqe nvme.Completion
			cqe.Unmarshal(b[nvme.TCPCommonHeaderSize:])
			err = w.onResponse(&cqe)
		case nvme.TCPC2HData:
			err = w.onC2HData(&h, b)
		case nvme.TCPR2T:
			err = w.onR2T(b)
		default:
			err = w.protoErr("unexpected PDU type %#x", h.Type)
		}
		if err != nil {
			return err
		}
	}
}

// readFull fills p from the receive buffer, reading the connection as
// needed: into the buffer, as much as has arrived, or straight into p
// when the buffer is empty and at least half its size is missing. As
// io.ReadFull: the bytes read, and io.EOF if none before the end,
// io.ErrUnexpectedEOF if some.
func (w *tcpWire) readFull(p []byte) (int, error) {
	n := copy(p, w.rbuf[w.rr:w.rw])
	w.rr += n
	for n < len(p) {
		var m int
		var err error
		if len(p)-n >= len(w.rbuf)/2 {
			m, err = w.conn.Read(p[n:])
			n += m
		} else {
			m, err = w.conn.Read(w.rbuf)
			w.rr, w.rw = 0, m
			k := copy(p[n:], w.rbuf[:m])
			w.rr, n = k, n+k
		}
		if err != nil && n < len(p) {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
	}
	return n, nil
}

// inFlight returns the slot cid names if a command is in flight on it
// with that generation and not yet answered.
func (w *tcpWire) inFlight(cid uint16, what string) (*slot, error) {
	tag, gen := splitCID(cid)
	if int(tag) >= w.q.depth {
		return nil, w.protoErr("%s for CID %#x, tag beyond depth %d", what, cid, w.q.depth)
	}
	s := &w.q.slots[tag]
	st := s.state.Load()
	if st&slotStateMask != slotInflight || st&flagResp != 0 || st>>stateGenShift != uint32(gen) {
		if w.q.dead.Load() {
			return nil, errQueueDead
		}
		return nil, w.protoErr("%s for CID %#x that is not in flight (slot state %#x)", what, cid, st)
	}
	return s, nil
}

var errQueueDead = errors.New("queue dead")

// onResponse completes the command a CapsuleResp (or a C2HData with
// SUCCESS) answers.
func (w *tcpWire) onResponse(cqe *nvme.Completion) error {
	s, err := w.inFlight(cqe.CID, "response")
	if err != nil {
		return err
	}
	if s.tcp.xferErr {
		// The Linux host fails a command whose data digest failed
		// with Data Transfer Error, whatever the controller said.
		cqe.Status = nvme.StatusDataTransferError
	}
	// Read before the response is in: from then on the sender may
	// complete the slot and a callback reuse it.
	r2t := s.needsR2T()
	s, st := w.q.response(cqe)
	switch {
	case s == nil:
		if w.q.dead.Load() {
			return errQueueDead
		}
		return w.protoErr("response for CID %#x refused", cqe.CID)
	case st&flagSent != 0:
		w.q.finish(s, st)
	case r2t && s.tcp.busy.Load() == 0:
		// An answer before all the data was asked for (an error), with
		// the sender done with the slot: nothing more will be sent.
		w.q.sent(s, uint8(st>>stateGenShift))
	}
	return nil
}

// onC2HData reads one C2HData PDU's payload into the slot's buffer.
func (w *tcpWire) onC2HData(h *nvme.TCPHeader, b []byte) error {
	var d nvme.TCPDataPDU
	d.Unmarshal(b)
	s, err := w.inFlight(d.CCCID, "C2HData")
	if err != nil {
		return err
	}
	dl := h.DataLen(w.dg)
	t := &s.tcp
	switch {
	case s.dir != nvme.DirCtrlToHost:
		return w.protoErr("C2HData for CID %#x, not a read", d.CCCID)
	case d.Length != dl:
		return w.protoErr("C2HData DATAL %d but PLEN carries %d bytes", d.Length, dl)
	case d.Offset != t.rcvd:
		return w.protoErr("C2HData DATAO %d, expected %d (data in order)", d.Offset, t.rcvd)
	case uint64(d.Offset)+uint64(dl) > uint64(s.n):
		return w.protoErr("C2HData [%d, +%d) beyond the command's %d bytes", d.Offset, dl, s.n)
	}
	data := s.data[d.Offset : d.Offset+dl]
	if _, err := w.readFull(data); err != nil {
		return fmt.Errorf("connection ended in C2HData: %w", err)
	}
	if w.dd != 0 {
		if _, err := w.readFull(w.rdg[:]); err != nil {
			return fmt.Errorf("connection ended in C2HData: %w", err)
		}
		if binary.LittleEndian.Uint32(w.rdg[:]) != nvme.TCPDigest(data) {
			if !t.xferErr {
				w.a.c.st.dataDigestErrors.Add(1)
				w.a.c.logf("queue %d: data digest error in C2HData of CID %#x at %d", w.q.qid, d.CCCID, d.Offset)
			}
			t.xferErr = true
		}
	}
	t.rcvd += dl
	if h.Flags&nvme.TCPFlagSuccess != 0 {
		if int(t.rcvd) != s.n {
			return w.protoErr("C2HData SUCCESS after %d of %d bytes", t.rcvd, s.n)
		}
		cqe := nvme.Completion{CID: d.CCCID, SQID: w.q.qid}
		return w.onResponse(&cqe)
	}
	return nil
}

// onR2T checks an R2T as Linux does (nvme_tcp_handle_r2t) and hands the
// transfer to the sender.
func (w *tcpWire) onR2T(b []byte) error {
	var d nvme.TCPDataPDU
	d.Unmarshal(b)
	s, err := w.inFlight(d.CCCID, "R2T")
	if err != nil {
		return err
	}
	t := &s.tcp
	switch {
	case !s.needsR2T():
		return w.protoErr("R2T for CID %#x, which has no data waiting for one", d.CCCID)
	case d.Length == 0:
		return w.protoErr("R2T for CID %#x with R2TL 0", d.CCCID)
	case uint64(d.Offset)+uint64(d.Length) > uint64(s.n):
		return w.protoErr("R2T for CID %#x asks [%d, +%d) beyond its %d bytes", d.CCCID, d.Offset, d.Length, s.n)
	case d.Offset < t.r2tEnd:
		return w.protoErr("R2T for CID %#x at offset %d, below the %d bytes asked already", d.CCCID, d.Offset, t.r2tEnd)
	case t.queued.Load():
		return w.protoErr("R2T for CID %#x while its previous R2T is unanswered (MAXR2T 0)", d.CCCID)
	}
	t.ttag, t.r2tOff, t.r2tLen = d.TTag, d.Offset, d.Length
	t.r2tEnd = d.Offset + d.Length
	t.job = jobH2C
	t.busy.Add(1)
	w.st.r2ts.Add(1)
	w.push(s)
	return nil
}

// termReq reports a C2HTermReq (b holds its fixed part; the copy of our
// offending header that may follow is not read): the association fails.
func (w *tcpWire) termReq(b []byte) error {
	var t nvme.TCPTermReqPDU
	t.Unmarshal(b)
	w.a.c.logf("queue %d: controller terminated the connection (C2HTermReq FES %#x FEI %#x)", w.q.qid, t.FES, t.FEI)
	return fmt.Errorf("%w: NVMe/TCP: controller sent C2HTermReq (FES %#x, FEI %#x)", ErrProtocol, t.FES, t.FEI)
}

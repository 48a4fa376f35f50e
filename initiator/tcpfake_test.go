package initiator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/blk-project/blk/nvme"
)

// tcpFake is a minimal NVMe/TCP target for the tests over real 127.0.0.1
// sockets: the fake RDMA target's controller state and command handling
// (identify, log pages, namespaces, knobs) behind the TCP binding of
// nvmet-tcp — ICReq/ICResp, CapsuleCmd with in-capsule data, R2T and
// H2CData for larger writes, C2HData then CapsuleResp for reads (or
// SUCCESS), digests checked and sent. One goroutine per connection reads
// PDUs in order; a write waiting for its data is kept by transfer tag,
// so capsules and H2CData may interleave. It checks what the host sends
// (Check, digests, H2CData offsets) and fails the test on a violation.
// Its steady state allocates nothing. Fault knobs count down: each
// injects its fault into that many more I/O commands.
type tcpFake struct {
	*fakeTarget
	ln   net.Listener
	addr string

	// Set before start.
	maxH2C   uint32 // ICResp MAXH2CDATA
	r2tChunk uint32 // R2TL of each R2T (0: all data in one)
	c2hChunk uint32 // DATAL of each C2HData (0: all in one)
	success  bool   // reads end with C2HData SUCCESS, no CapsuleResp
	// icResp, if set, alters the ICResp (a nil return sends none).
	icResp func(r *nvme.TCPICRespPDU, b *[nvme.TCPICSize]byte) []byte

	hdgstErr, ddgstErr, badR2T, unknownCID, termReq, closeMidIO atomic.Int64
	r2tWrites, h2cPDUs, c2hPDUs, tcpInCapsule                   atomic.Int64
	icReqs                                                      []nvme.TCPICReqPDU

	tconns map[*tcpFakeConn]struct{}
	done   chan struct{}
	twg    sync.WaitGroup
}

func newTCPFake(t testing.TB, subNQN string) *tcpFake {
	f := &tcpFake{fakeTarget: newFakeTarget(t, subNQN), maxH2C: 32 << 10,
		tconns: map[*tcpFakeConn]struct{}{}, done: make(chan struct{})}
	t.Cleanup(func() { f.a.Close() }) // the RDMA fake's adapter: unused here
	return f
}

func (f *tcpFake) start() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	f.ln, f.addr = ln, ln.Addr().String()
	f.twg.Add(1)
	go func() {
		defer f.twg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c := &tcpFakeConn{f: f, conn: conn}
			f.mu.Lock()
			f.tconns[c] = struct{}{}
			f.mu.Unlock()
			f.twg.Add(1)
			go c.run()
		}
	}()
	f.t.Cleanup(f.stopTCP)
}

func (f *tcpFake) stopTCP() {
	select {
	case <-f.done:
		return
	default:
	}
	close(f.done)
	f.ln.Close()
	f.dropAllTCP()
	f.twg.Wait()
}

// dropAllTCP closes every connection (a target crash or network cut).
func (f *tcpFake) dropAllTCP() {
	f.mu.Lock()
	var cs []*tcpFakeConn
	for c := range f.tconns {
		cs = append(cs, c)
	}
	f.mu.Unlock()
	for _, c := range cs {
		c.conn.Close()
	}
}

// tcpXfer is a write waiting for its H2CData.
type tcpXfer struct {
	active bool
	cmd    nvme.Command
	buf    []byte
	n, got int
}

type tcpFakeConn struct {
	f      *tcpFake
	conn   net.Conn
	dg     nvme.TCPDigests
	hd, dd int
	qid    uint16
	depth  int
	ctrl   *fakeCtrl
	sqhd   uint16

	hdr     [nvme.TCPICSize + nvme.TCPDigestSize]byte
	dgst    [nvme.TCPDigestSize]byte
	capsule []byte // in-capsule data
	scratch []byte // read data, admin data
	xfers   []tcpXfer

	wmu sync.Mutex // responses: the serving goroutine and AERs
	out [nvme.TCPTermReqHeaderSize + nvme.TCPTermReqMaxData]byte
	odg [nvme.TCPDigestSize]byte
	iov [3][]byte
	wb  net.Buffers
}

var errFakeClosed = errors.New("fake: connection closed on purpose")

func (c *tcpFakeConn) run() {
	f := c.f
	defer f.twg.Done()
	defer func() {
		c.conn.Close()
		f.mu.Lock()
		delete(f.tconns, c)
		f.mu.Unlock()
	}()
	if !c.initConn() {
		return
	}
	c.capsule = make([]byte, nvme.TCPAdminInCapsule)
	c.scratch = make([]byte, 4096<<f.mdts)
	for {
		if err := c.serveOne(); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, errFakeClosed) && !errors.Is(err, io.ErrUnexpectedEOF) {
				select {
				case <-f.done:
				default:
					f.t.Logf("fake tcp target: %v", err)
				}
			}
			return
		}
	}
}

func (c *tcpFakeConn) initConn() bool {
	f := c.f
	if _, err := io.ReadFull(c.conn, c.hdr[:nvme.TCPICSize]); err != nil {
		return false
	}
	var h nvme.TCPHeader
	h.Unmarshal(c.hdr[:])
	if h.Type != nvme.TCPICReq || !h.Check(true, nvme.TCPLimits{}).OK() {
		f.t.Errorf("fake tcp target: first PDU %+v is not a valid ICReq", h)
		return false
	}
	var req nvme.TCPICReqPDU
	req.Unmarshal(c.hdr[:])
	f.mu.Lock()
	f.icReqs = append(f.icReqs, req)
	f.mu.Unlock()
	c.dg = nvme.TCPDigestsOf(req.DGST)
	c.hd, c.dd = c.dg.HeaderDigestLen(), c.dg.DataDigestLen()
	resp := nvme.TCPICRespPDU{DGST: req.DGST, MaxH2CData: f.maxH2C}
	var b [nvme.TCPICSize]byte
	resp.Marshal(&b)
	out := b[:]
	if f.icResp != nil {
		if out = f.icResp(&resp, &b); out == nil {
			<-f.done // say nothing, keep the connection
			return false
		}
	}
	_, err := c.conn.Write(out)
	return err == nil
}

// readHeader reads one PDU's header (and header digest) into c.hdr and
// checks it as a Linux target does.
func (c *tcpFakeConn) readHeader() (nvme.TCPHeader, error) {
	var h nvme.TCPHeader
	if _, err := io.ReadFull(c.conn, c.hdr[:nvme.TCPCommonHeaderSize]); err != nil {
		return h, err
	}
	h.Unmarshal(c.hdr[:])
	if f := h.Check(true, nvme.TCPLimits{Digests: c.dg}); !f.OK() {
		return h, fmt.Errorf("host PDU refused: %v (%+v)", f, h)
	}
	if h.Type != nvme.TCPCapsuleCmd && h.Type != nvme.TCPH2CData {
		return h, fmt.Errorf("host sent PDU type %#x", h.Type)
	}
	hl := int(h.HLen) + c.hd
	if _, err := io.ReadFull(c.conn, c.hdr[nvme.TCPCommonHeaderSize:hl]); err != nil {
		return h, err
	}
	if c.hd != 0 && !nvme.TCPHeaderDigestOK(c.hdr[:], int(h.HLen)) {
		return h, fmt.Errorf("host header digest wrong")
	}
	return h, nil
}

// readData reads a PDU's data into b and checks its digest.
func (c *tcpFakeConn) readData(b []byte) error {
	if _, err := io.ReadFull(c.conn, b); err != nil {
		return err
	}
	if c.dd != 0 {
		if _, err := io.ReadFull(c.conn, c.dgst[:]); err != nil {
			return err
		}
		if binary.LittleEndian.Uint32(c.dgst[:]) != nvme.TCPDigest(b) {
			return fmt.Errorf("host data digest wrong")
		}
	}
	return nil
}

func (c *tcpFakeConn) serveOne() error {
	h, err := c.readHeader()
	if err != nil {
		return err
	}
	if h.Type == nvme.TCPH2CData {
		return c.h2cData(&h)
	}
	var cmd nvme.Command
	cmd.Unmarshal(c.hdr[nvme.TCPCommonHeaderSize:])
	n := int(h.DataLen(c.dg))
	if n > 0 {
		if n > len(c.capsule) {
			return fmt.Errorf("in-capsule data of %d bytes", n)
		}
		if err := c.readData(c.capsule[:n]); err != nil {
			return err
		}
		if cmd.DPTR.ID != nvme.SGLIDInCapsule || cmd.DPTR.Addr != 0 || int(cmd.DPTR.Length) != n {
			c.f.t.Errorf("fake tcp target: in-capsule data with SGL %+v", cmd.DPTR)
		}
	} else if cmd.DPTR.ID != nvme.SGLIDTransportDataTCP {
		c.f.t.Errorf("fake tcp target: command %#x without in-capsule data has SGL %+v", cmd.Opcode, cmd.DPTR)
	}
	return c.command(&cmd, c.capsule[:n])
}

func (c *tcpFakeConn) h2cData(h *nvme.TCPHeader) error {
	var d nvme.TCPDataPDU
	d.Unmarshal(c.hdr[:])
	n := int(h.DataLen(c.dg))
	if int(d.TTag) >= len(c.xfers) || !c.xfers[d.TTag].active {
		return fmt.Errorf("H2CData with TTAG %d unknown", d.TTag)
	}
	x := &c.xfers[d.TTag]
	switch {
	case d.CCCID != x.cmd.CID:
		return fmt.Errorf("H2CData CCCID %#x, TTAG %d is CID %#x", d.CCCID, d.TTag, x.cmd.CID)
	case int(d.Offset) != x.got || int(d.Length) != n || x.got+n > x.n:
		return fmt.Errorf("H2CData DATAO %d DATAL %d (PLEN says %d), got %d of %d", d.Offset, d.Length, n, x.got, x.n)
	case uint32(n) > c.f.maxH2C:
		return fmt.Errorf("H2CData of %d bytes above MAXH2CDATA %d", n, c.f.maxH2C)
	}
	if err := c.readData(x.buf[x.got : x.got+n]); err != nil {
		return err
	}
	x.got += n
	c.f.h2cPDUs.Add(1)
	chunk := c.r2tLen(x.n)
	if x.got%chunk != 0 && x.got != x.n {
		if h.Flags&nvme.TCPFlagLastPDU != 0 {
			return fmt.Errorf("H2CData LAST_PDU before the R2T's end")
		}
		return nil
	}
	if h.Flags&nvme.TCPFlagLastPDU == 0 {
		return fmt.Errorf("H2CData without LAST_PDU at the R2T's end")
	}
	if x.got < x.n {
		return c.sendR2T(&x.cmd, d.TTag, x.got, min(chunk, x.n-x.got))
	}
	x.active = false
	return c.write(&x.cmd, x.buf[:x.n])
}

func (c *tcpFakeConn) r2tLen(n int) int {
	if c.f.r2tChunk == 0 {
		return n
	}
	return int(c.f.r2tChunk)
}

// send writes one PDU: header (+digest), data (+digest, inverted when
// badDigest).
func (c *tcpFakeConn) send(hdr []byte, data []byte, badDigest bool) error {
	c.iov[0], c.iov[1], c.iov[2] = hdr, data, nil
	k := 1
	if len(data) > 0 {
		k = 2
		if c.dd != 0 {
			d := nvme.TCPDigest(data)
			if badDigest {
				d = ^d
			}
			binary.LittleEndian.PutUint32(c.odg[:], d)
			c.iov[2] = c.odg[:]
			k = 3
		}
	}
	c.wb = c.iov[:k]
	_, err := c.wb.WriteTo(c.conn)
	return err
}

// pduHeader fills c.out with a 24-byte header of type typ carrying n
// data bytes, and returns it with its digest.
func (c *tcpFakeConn) pduHeader(typ, flags uint8, n int) []byte {
	h := nvme.TCPHeader{Type: typ, Flags: flags, HLen: 24, PLen: uint32(24 + c.hd)}
	if c.hd != 0 {
		h.Flags |= nvme.TCPFlagHDGST
	}
	if n > 0 {
		h.PDO = uint8(24 + c.hd)
		h.PLen += uint32(n + c.dd)
		if c.dd != 0 {
			h.Flags |= nvme.TCPFlagDDGST
		}
	}
	h.Marshal(c.out[:])
	return c.out[:24]
}

func (c *tcpFakeConn) sealHeader(b []byte, corrupt bool) []byte {
	if c.hd == 0 {
		return b
	}
	n := nvme.PutTCPHeaderDigest(c.out[:], 24)
	if corrupt {
		c.out[n-1] ^= 0xFF
	}
	return c.out[:n]
}

func (c *tcpFakeConn) respond(cmd *nvme.Command, dw0, dw1 uint32, st nvme.Status) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	cid := cmd.CID
	if c.qid != 0 && c.f.unknownCID.Add(-1) >= 0 {
		cid = cid&^cidTagMask | 0x800 // a tag beyond any depth
	}
	b := c.pduHeader(nvme.TCPCapsuleResp, 0, 0)
	cqe := nvme.Completion{DW0: dw0, DW1: dw1, SQHead: c.sqhd, SQID: c.qid, CID: cid, Status: st}
	c.sqhd = uint16((int(c.sqhd) + 1) % max(c.depth, 1))
	cqe.Marshal((*[nvme.CQESize]byte)(c.out[8:24]))
	return c.send(c.sealHeader(b, c.qid != 0 && c.f.hdgstErr.Add(-1) >= 0), nil, false)
}

// c2h sends data in C2HData PDUs, then the response (or SUCCESS).
func (c *tcpFakeConn) c2h(cmd *nvme.Command, data []byte, success bool) error {
	if cmd.DPTR.ID != nvme.SGLIDTransportDataTCP || int(cmd.DPTR.Length) < len(data) {
		return c.respond(cmd, 0, 0, nvme.StatusSGLInvalidDataLength.WithDNR())
	}
	chunk := len(data)
	if c.f.c2hChunk != 0 {
		chunk = int(c.f.c2hChunk)
	}
	corrupt := c.qid != 0 && c.dd != 0 && c.f.ddgstErr.Add(-1) >= 0
	for off := 0; off < len(data); off += chunk {
		n := min(chunk, len(data)-off)
		last := off+n == len(data)
		var flags uint8
		if last {
			flags = nvme.TCPFlagLastPDU
			if success {
				flags |= nvme.TCPFlagSuccess
			}
		}
		c.wmu.Lock()
		b := c.pduHeader(nvme.TCPC2HData, flags, n)
		(&nvme.TCPDataPDU{CCCID: cmd.CID, Offset: uint32(off), Length: uint32(n)}).Marshal(c.out[:])
		b = c.sealHeader(b, false)
		err := c.send(b, data[off:off+n], corrupt && off == 0)
		c.wmu.Unlock()
		if err != nil {
			return err
		}
		c.f.c2hPDUs.Add(1)
	}
	if success {
		c.wmu.Lock()
		c.sqhd = uint16((int(c.sqhd) + 1) % max(c.depth, 1))
		c.wmu.Unlock()
		return nil
	}
	return c.respond(cmd, 0, 0, 0)
}

func (c *tcpFakeConn) sendR2T(cmd *nvme.Command, ttag uint16, off, n int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.f.badR2T.Add(-1) >= 0 {
		n = int(cmd.DPTR.Length) + 512 // beyond the command
	}
	b := c.pduHeader(nvme.TCPR2T, 0, 0)
	(&nvme.TCPDataPDU{CCCID: cmd.CID, TTag: ttag, Offset: uint32(off), Length: uint32(n)}).Marshal(c.out[:])
	return c.send(c.sealHeader(b, false), nil, false)
}

func (c *tcpFakeConn) command(cmd *nvme.Command, icd []byte) error {
	f := c.f
	if f.mute.Load() {
		return nil
	}
	if cmd.IsFabrics() && cmd.FCType() == nvme.FabricsConnect {
		return c.connect(cmd, icd)
	}
	if c.ctrl == nil {
		return c.respond(cmd, 0, 0, nvme.StatusCommandSequenceError.WithDNR())
	}
	if c.qid == 0 {
		return c.adminCmd(cmd, icd)
	}
	return c.ioCmd(cmd, icd)
}

func (c *tcpFakeConn) connect(cmd *nvme.Command, icd []byte) error {
	f := c.f
	var cc nvme.ConnectCommand
	cc.Decode(cmd)
	if len(icd) != nvme.ConnectDataSize {
		f.t.Errorf("fake tcp target: Connect with %d bytes in the capsule", len(icd))
		return c.respond(cmd, 0, 0, nvme.StatusSGLInvalidDataLength.WithDNR())
	}
	var d nvme.ConnectData
	d.Unmarshal(icd)
	f.mu.Lock()
	if cc.QID == 0 {
		f.admin = append(f.admin, "Connect")
	} else {
		f.admin = append(f.admin, fmt.Sprintf("Connect qid %d", cc.QID))
	}
	f.mu.Unlock()
	if f.refuseDNR.Load() {
		return c.respond(cmd, 0, 0, nvme.StatusConnectInvalidHost.WithDNR())
	}
	c.qid, c.depth = cc.QID, int(cc.SQSize)+1
	c.xfers = make([]tcpXfer, c.depth)
	for i := range c.xfers {
		c.xfers[i].buf = make([]byte, 4096<<f.mdts)
	}
	if !d.SubNQN.Equal(f.subNQN) || d.Validate() != nil {
		return c.respond(cmd, nvme.ConnectInvalidParamDW0(256, true), 0, nvme.StatusConnectInvalidParameters.WithDNR())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if cc.QID == 0 {
		ctrl := &fakeCtrl{id: f.nextID}
		f.nextID++
		f.ctrls[ctrl.id] = ctrl
		c.ctrl = ctrl
		return c.respond(cmd, nvme.ConnectResponseDW0(ctrl.id, 0), 0, 0)
	}
	ctrl := f.ctrls[d.CNTLID]
	if ctrl == nil || int(cc.QID) > f.maxQueues {
		return c.respond(cmd, nvme.ConnectInvalidParamDW0(16, true), 0, nvme.StatusConnectInvalidParameters.WithDNR())
	}
	c.ctrl = ctrl
	return c.respond(cmd, 0, 0, 0)
}

func (c *tcpFakeConn) adminCmd(cmd *nvme.Command, icd []byte) error {
	f := c.f
	ctrl := c.ctrl
	if cmd.IsFabrics() {
		var p nvme.PropertyCommand
		if err := p.Decode(cmd); err != nil {
			return c.respond(cmd, 0, 0, nvme.StatusInvalidOpcode.WithDNR())
		}
		f.mu.Lock()
		if p.Set {
			f.admin = append(f.admin, fmt.Sprintf("PropSet %#x=%#x", p.Offset, p.Value))
			old, cc := ctrl.cc, nvme.CC(p.Value)
			ctrl.cc = cc
			switch {
			case !cc.EN():
				ctrl.csts = 0
			case !old.EN():
				ctrl.csts = nvme.CSTSReady
			}
			if cc.SHN() == nvme.ShutdownNormal {
				ctrl.csts = ctrl.csts.WithSHST(nvme.ShutdownStatusComplete)
				f.shutdowns.Add(1)
			}
			f.mu.Unlock()
			return c.respond(cmd, 0, 0, 0)
		}
		f.admin = append(f.admin, fmt.Sprintf("PropGet %#x", p.Offset))
		var v uint64
		switch p.Offset {
		case nvme.PropCAP:
			v = uint64(f.capValue())
		case nvme.PropVS:
			v = uint64(nvme.MakeVersion(1, 4, 0))
		case nvme.PropCC:
			v = uint64(ctrl.cc)
		case nvme.PropCSTS:
			v = uint64(ctrl.csts)
		}
		f.mu.Unlock()
		return c.respond(cmd, uint32(v), uint32(v>>32), 0)
	}
	op := nvme.AdminOpcode(cmd.Opcode)
	if op == nvme.AdminKeepAlive {
		f.kaCount.Add(1)
		if f.muteKA.Load() {
			return nil
		}
		return c.respond(cmd, 0, 0, 0)
	}
	f.record(fmt.Sprintf("%v %#x", op, cmd.CDW10&0xFF))
	switch op {
	case nvme.AdminIdentify:
		n, st := f.identify(cmd, c.scratch[:identifySize], ctrl.id)
		if st != 0 {
			return c.respond(cmd, 0, 0, st)
		}
		return c.c2h(cmd, c.scratch[:n], false)
	case nvme.AdminSetFeatures:
		switch uint8(cmd.CDW10) {
		case nvme.FeatureNumQueues:
			n := min(int(uint16(cmd.CDW11))+1, f.maxQueues)
			return c.respond(cmd, uint32(n-1)|uint32(n-1)<<16, 0, 0)
		case nvme.FeatureAsyncEventConfig:
			return c.respond(cmd, 0, 0, 0)
		}
		return c.respond(cmd, 0, 0, nvme.StatusInvalidField.WithDNR())
	case nvme.AdminAsyncEvent:
		return nil // never completed here
	case nvme.AdminGetLogPage:
		n := int(cmd.CDW10>>16|(cmd.CDW11&0xFFFF)<<16)*4 + 4
		off := uint64(cmd.CDW12) | uint64(cmd.CDW13)<<32
		page := f.logPage(uint8(cmd.CDW10))
		if page == nil || n > len(c.scratch) {
			return c.respond(cmd, 0, 0, nvme.StatusInvalidField.WithDNR())
		}
		clear(c.scratch[:n])
		if off < uint64(len(page)) {
			copy(c.scratch[:n], page[off:])
		}
		return c.c2h(cmd, c.scratch[:n], false)
	}
	return c.respond(cmd, 0, 0, nvme.StatusInvalidOpcode.WithDNR())
}

func (c *tcpFakeConn) ioCmd(cmd *nvme.Command, icd []byte) error {
	f := c.f
	f.ioCount.Add(1)
	if f.holdIO.Load() {
		return nil
	}
	if f.closeMidIO.Add(-1) >= 0 {
		return errFakeClosed
	}
	if f.termReq.Add(-1) >= 0 {
		c.wmu.Lock()
		n := nvme.MarshalTermReq(c.out[:], nvme.TCPC2HTermReq, nvme.TCPFault{FES: nvme.TCPFESPDUSequence}, c.hdr[:24])
		c.conn.Write(c.out[:n])
		c.wmu.Unlock()
		return errFakeClosed
	}
	f.mu.Lock()
	disk := f.ns[cmd.NSID]
	f.mu.Unlock()
	if disk == nil {
		return c.respond(cmd, 0, 0, nvme.StatusInvalidNamespace.WithDNR())
	}
	slba := uint64(cmd.CDW10) | uint64(cmd.CDW11)<<32
	nlb := uint64(cmd.CDW12&0xFFFF) + 1
	blocks := uint64(len(disk) / fakeBlock)
	inRange := slba < blocks && nlb <= blocks-slba
	switch nvme.IOOpcode(cmd.Opcode) {
	case nvme.IORead:
		if !inRange {
			return c.respond(cmd, 0, 0, nvme.StatusLBAOutOfRange.WithDNR())
		}
		n := int(nlb) * fakeBlock
		f.mu.Lock()
		copy(c.scratch, disk[slba*fakeBlock:slba*fakeBlock+uint64(n)])
		f.mu.Unlock()
		return c.c2h(cmd, c.scratch[:n], f.success)
	case nvme.IOWrite, nvme.IODatasetManagement:
		n := int(nlb) * fakeBlock
		if cmd.Opcode == uint8(nvme.IODatasetManagement) {
			n = (int(cmd.CDW10&0xFF) + 1) * dsmRangeSize
		}
		if len(icd) > 0 {
			f.tcpInCapsule.Add(1)
			return c.write(cmd, icd)
		}
		if int(cmd.DPTR.Length) != n {
			return c.respond(cmd, 0, 0, nvme.StatusSGLInvalidDataLength.WithDNR())
		}
		if !inRange && cmd.Opcode == uint8(nvme.IOWrite) {
			// Refused before any data: no R2T.
			return c.respond(cmd, 0, 0, nvme.StatusLBAOutOfRange.WithDNR())
		}
		tt := -1
		for i := range c.xfers {
			if !c.xfers[i].active {
				tt = i
				break
			}
		}
		if tt < 0 {
			return fmt.Errorf("more writes waiting for data than the queue's depth")
		}
		x := &c.xfers[tt]
		x.active, x.cmd, x.n, x.got = true, *cmd, n, 0
		f.r2tWrites.Add(1)
		return c.sendR2T(cmd, uint16(tt), 0, min(c.r2tLen(n), n))
	case nvme.IOFlush:
		return c.respond(cmd, 0, 0, 0)
	case nvme.IOWriteZeroes:
		if !inRange {
			return c.respond(cmd, 0, 0, nvme.StatusLBAOutOfRange.WithDNR())
		}
		f.mu.Lock()
		clear(disk[slba*fakeBlock : (slba+nlb)*fakeBlock])
		f.mu.Unlock()
		return c.respond(cmd, 0, 0, 0)
	}
	return c.respond(cmd, 0, 0, nvme.StatusInvalidOpcode.WithDNR())
}

// write applies a Write or Dataset Management whose data is all in.
func (c *tcpFakeConn) write(cmd *nvme.Command, data []byte) error {
	f := c.f
	f.mu.Lock()
	disk := f.ns[cmd.NSID]
	blocks := uint64(len(disk) / fakeBlock)
	if cmd.Opcode == uint8(nvme.IODatasetManagement) {
		for i := 0; i+dsmRangeSize <= len(data); i += dsmRangeSize {
			r := data[i:]
			cnt := uint64(binary.LittleEndian.Uint32(r[4:]))
			lba := binary.LittleEndian.Uint64(r[8:])
			if lba < blocks && cnt <= blocks-lba {
				clear(disk[lba*fakeBlock : (lba+cnt)*fakeBlock])
			}
		}
		f.mu.Unlock()
		return c.respond(cmd, 0, 0, 0)
	}
	slba := uint64(cmd.CDW10) | uint64(cmd.CDW11)<<32
	nlb := uint64(cmd.CDW12&0xFFFF) + 1
	if slba >= blocks || nlb > blocks-slba || len(data) != int(nlb)*fakeBlock {
		f.mu.Unlock()
		return c.respond(cmd, 0, 0, nvme.StatusLBAOutOfRange.WithDNR())
	}
	copy(disk[slba*fakeBlock:], data)
	f.mu.Unlock()
	return c.respond(cmd, 0, 0, 0)
}

// tcpTestConfig is testConfig for NVMe/TCP: no adapter.
func tcpTestConfig(t testing.TB) Config {
	cfg := testConfig(t)
	cfg.Adapter = nil
	cfg.Transport = TransportTCP
	return cfg
}

// connectTCPFake connects to the fake over TCP.
func connectTCPFake(t testing.TB, f *tcpFake, cfg Config) *Controller {
	t.Helper()
	c, err := Connect(ctxT(t), cfg, f.addr, f.subNQN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

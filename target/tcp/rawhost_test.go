package tcp_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
)

// rawHost is a deliberately bare NVMe/TCP host written straight on a TCP
// socket, PDU by PDU and byte by byte, for tests of the binding that must
// not depend on an initiator: ICReq, capsules with in-capsule or R2T
// data, H2CData, C2HData with or without SUCCESS, digests, and any
// malformed PDU a test wants to send.
type rawHost struct {
	t      testing.TB
	nc     net.Conn
	dg     nvme.TCPDigests
	hd, dd int
	cid    uint16
	maxH2C uint32
	// flowOff: the Connect disabled SQ flow control, so a read may end
	// with SUCCESS on its C2HData and no CapsuleResp.
	flowOff bool
}

const rawTimeout = 10 * time.Second

func dialRaw(t testing.TB, addr string) *rawHost {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, rawTimeout)
	if err != nil {
		t.Fatal(err)
	}
	h := &rawHost{t: t, nc: nc}
	t.Cleanup(func() { nc.Close() })
	return h
}

// icreq sends an ICReq and reads the ICResp.
func (h *rawHost) icreq(ic nvme.TCPICReqPDU) (nvme.TCPICRespPDU, error) {
	var b [nvme.TCPICSize]byte
	ic.Marshal(&b)
	if err := h.write(b[:]); err != nil {
		return nvme.TCPICRespPDU{}, err
	}
	hdr, pdu, err := h.readPDU()
	if err != nil {
		return nvme.TCPICRespPDU{}, err
	}
	if hdr.Type != nvme.TCPICResp {
		return nvme.TCPICRespPDU{}, h.unexpected(hdr, pdu)
	}
	var r nvme.TCPICRespPDU
	if err := r.Unmarshal(pdu); err != nil {
		return r, err
	}
	h.dg = nvme.TCPDigestsOf(r.DGST)
	h.hd, h.dd = h.dg.HeaderDigestLen(), h.dg.DataDigestLen()
	h.maxH2C = r.MaxH2CData
	return r, nil
}

// mustIC does the ICReq asking for digests dg and checks the ICResp.
func (h *rawHost) mustIC(dg nvme.TCPDigests) {
	h.t.Helper()
	r, err := h.icreq(nvme.TCPICReqPDU{DGST: dg.DGST()})
	if err != nil {
		h.t.Fatal(err)
	}
	if r.PFV != 0 || r.CPDA != 0 || r.DGST != dg.DGST() || r.MaxH2CData < nvme.TCPMinMaxH2CData || r.MaxH2CData%4 != 0 {
		h.t.Fatalf("ICResp %+v for DGST %#x", r, dg.DGST())
	}
}

func (h *rawHost) write(b ...[]byte) error {
	h.nc.SetWriteDeadline(time.Now().Add(rawTimeout))
	bufs := net.Buffers(b)
	_, err := bufs.WriteTo(h.nc)
	return err
}

// errTerm is a C2HTermReq the host received.
type errTerm struct {
	FES uint16
	FEI uint32
	Hdr []byte
}

func (e *errTerm) Error() string {
	return fmt.Sprintf("C2HTermReq FES %#x FEI %d", e.FES, e.FEI)
}

// readPDU reads one whole PDU, checks its digests, and returns its header
// and bytes (digests stripped: header, then data). A C2HTermReq comes
// back as an *errTerm.
func (h *rawHost) readPDU() (nvme.TCPHeader, []byte, error) {
	h.nc.SetReadDeadline(time.Now().Add(rawTimeout))
	var ch [nvme.TCPCommonHeaderSize]byte
	if _, err := io.ReadFull(h.nc, ch[:]); err != nil {
		return nvme.TCPHeader{}, nil, err
	}
	var hdr nvme.TCPHeader
	_ = hdr.Unmarshal(ch[:])
	if hdr.PLen < nvme.TCPCommonHeaderSize || hdr.PLen > 16<<20 {
		return hdr, nil, fmt.Errorf("PDU type %#x with PLEN %d", hdr.Type, hdr.PLen)
	}
	b := make([]byte, hdr.PLen)
	copy(b, ch[:])
	if _, err := io.ReadFull(h.nc, b[nvme.TCPCommonHeaderSize:]); err != nil {
		return hdr, nil, err
	}
	if hdr.Type == nvme.TCPC2HTermReq {
		var t nvme.TCPTermReqPDU
		_ = t.Unmarshal(b)
		return hdr, b, &errTerm{FES: t.FES, FEI: t.FEI, Hdr: b[nvme.TCPTermReqHeaderSize:]}
	}
	if f := hdr.Check(false, nvme.TCPLimits{Digests: h.dg}); !f.OK() {
		return hdr, b, fmt.Errorf("target sent a bad PDU header: %v", f)
	}
	hl := int(hdr.HLen)
	out := b[:hl:hl]
	if hdr.Flags&nvme.TCPFlagHDGST != 0 {
		if !nvme.TCPHeaderDigestOK(b, hl) {
			return hdr, b, errors.New("target sent a bad header digest")
		}
		hl += nvme.TCPDigestSize
	}
	if n := hdr.DataLen(h.dg); n > 0 {
		data := b[hl : hl+int(n)]
		if hdr.Flags&nvme.TCPFlagDDGST != 0 {
			if binary.LittleEndian.Uint32(b[hl+int(n):]) != nvme.TCPDigest(data) {
				return hdr, b, errors.New("target sent a bad data digest")
			}
		}
		out = append(out, data...)
	}
	return hdr, out, nil
}

func (h *rawHost) unexpected(hdr nvme.TCPHeader, b []byte) error {
	return fmt.Errorf("unexpected PDU type %#x flags %#x PLEN %d", hdr.Type, hdr.Flags, hdr.PLen)
}

// capsulePDU builds a CapsuleCmd PDU for cmd with in-capsule data.
func (h *rawHost) capsulePDU(cmd nvme.Command, data []byte) []byte {
	hl := nvme.TCPCapsuleCmdHeaderSize
	hdr := nvme.TCPHeader{Type: nvme.TCPCapsuleCmd, HLen: uint8(hl), PLen: uint32(hl + h.hd)}
	if h.hd > 0 {
		hdr.Flags |= nvme.TCPFlagHDGST
	}
	if len(data) > 0 {
		hdr.PDO = uint8(hl + h.hd)
		hdr.PLen += uint32(len(data) + h.dd)
		if h.dd > 0 {
			hdr.Flags |= nvme.TCPFlagDDGST
		}
	}
	b := make([]byte, hdr.PLen)
	hdr.Marshal(b)
	if err := cmd.Marshal((*[nvme.SQESize]byte)(b[nvme.TCPCommonHeaderSize:hl])); err != nil {
		h.t.Fatal(err)
	}
	if h.hd > 0 {
		nvme.PutTCPHeaderDigest(b, hl)
	}
	if len(data) > 0 {
		copy(b[hl+h.hd:], data)
		if h.dd > 0 {
			binary.LittleEndian.PutUint32(b[hl+h.hd+len(data):], nvme.TCPDigest(data))
		}
	}
	return b
}

// h2cPDU builds an H2CData PDU.
func (h *rawHost) h2cPDU(cid, ttag uint16, off uint32, data []byte, last bool) []byte {
	hl := nvme.TCPDataHeaderSize
	hdr := nvme.TCPHeader{Type: nvme.TCPH2CData, HLen: uint8(hl), PDO: uint8(hl + h.hd), PLen: uint32(hl + h.hd + len(data) + h.dd)}
	if h.hd > 0 {
		hdr.Flags |= nvme.TCPFlagHDGST
	}
	if h.dd > 0 {
		hdr.Flags |= nvme.TCPFlagDDGST
	}
	if last {
		hdr.Flags |= nvme.TCPFlagLastPDU
	}
	b := make([]byte, hdr.PLen)
	hdr.Marshal(b)
	d := nvme.TCPDataPDU{CCCID: cid, TTag: ttag, Offset: off, Length: uint32(len(data))}
	d.Marshal(b)
	if h.hd > 0 {
		nvme.PutTCPHeaderDigest(b, hl)
	}
	copy(b[hl+h.hd:], data)
	if h.dd > 0 {
		binary.LittleEndian.PutUint32(b[hl+h.hd+len(data):], nvme.TCPDigest(data))
	}
	return b
}

// result is what a command got back.
type result struct {
	rsp     nvme.Completion
	success bool // answered by SUCCESS on the last C2HData, no CapsuleResp
	r2ts    int
	c2h     int
}

// exchange sends cmd (a fresh CID) with inline data (SGL 0x01), or with
// wdata sent in answer to R2Ts (SGL 0x5A), or reading into rbuf, and
// waits for the command's end.
func (h *rawHost) exchange(cmd nvme.Command, inline, wdata, rbuf []byte) (result, error) {
	h.cid++
	cmd.CID = h.cid
	if cmd.Flags == 0 {
		cmd.Flags = 0x40
	}
	switch {
	case len(inline) > 0:
		cmd.DPTR = nvme.InCapsuleSGL(0, uint32(len(inline)))
	case len(wdata) > 0:
		cmd.DPTR = nvme.TransportSGL(uint32(len(wdata)))
	case len(rbuf) > 0:
		cmd.DPTR = nvme.TransportSGL(uint32(len(rbuf)))
	case cmd.DPTR.ID == 0 && cmd.DPTR.Length == 0:
		cmd.DPTR = nvme.TransportSGL(0)
	}
	if err := h.write(h.capsulePDU(cmd, inline)); err != nil {
		return result{}, err
	}
	return h.await(cmd.CID, wdata, rbuf)
}

// await reads PDUs for command cid until its end: R2Ts are answered
// from wdata (in PDUs of MAXH2CDATA), C2HData is placed in rbuf.
func (h *rawHost) await(cid uint16, wdata, rbuf []byte) (result, error) {
	var res result
	read := uint32(0)
	for {
		hdr, b, err := h.readPDU()
		if err != nil {
			return res, err
		}
		switch hdr.Type {
		case nvme.TCPR2T:
			var d nvme.TCPDataPDU
			_ = d.Unmarshal(b)
			if d.CCCID != cid {
				return res, fmt.Errorf("R2T for CID %#x, want %#x", d.CCCID, cid)
			}
			if d.Length == 0 || uint64(d.Offset)+uint64(d.Length) > uint64(len(wdata)) {
				return res, fmt.Errorf("R2T offset %d length %d for %d bytes", d.Offset, d.Length, len(wdata))
			}
			res.r2ts++
			end := d.Offset + d.Length
			for off := d.Offset; off < end; {
				n := min(end-off, h.maxH2C)
				if err := h.write(h.h2cPDU(cid, d.TTag, off, wdata[off:off+n], off+n == end)); err != nil {
					return res, err
				}
				off += n
			}
		case nvme.TCPC2HData:
			var d nvme.TCPDataPDU
			_ = d.Unmarshal(b)
			if d.CCCID != cid {
				return res, fmt.Errorf("C2HData for CID %#x, want %#x", d.CCCID, cid)
			}
			if d.Offset != read || uint64(d.Offset)+uint64(d.Length) > uint64(len(rbuf)) {
				return res, fmt.Errorf("C2HData offset %d length %d, %d of %d read", d.Offset, d.Length, read, len(rbuf))
			}
			copy(rbuf[d.Offset:], b[nvme.TCPDataHeaderSize:])
			read += d.Length
			res.c2h++
			if hdr.Flags&nvme.TCPFlagSuccess != 0 {
				if !h.flowOff {
					return res, errors.New("SUCCESS on a queue with SQ flow control")
				}
				if read != uint32(len(rbuf)) {
					return res, fmt.Errorf("SUCCESS after %d of %d bytes", read, len(rbuf))
				}
				res.success = true
				res.rsp.CID = cid
				return res, nil
			}
		case nvme.TCPCapsuleResp:
			if err := res.rsp.Unmarshal(b[nvme.TCPCommonHeaderSize:]); err != nil {
				return res, err
			}
			if res.rsp.CID != cid {
				return res, fmt.Errorf("response for CID %#x, want %#x", res.rsp.CID, cid)
			}
			return res, nil
		default:
			return res, h.unexpected(hdr, b)
		}
	}
}

// mustExchange is exchange that fails the test on a transport error.
func (h *rawHost) mustExchange(cmd nvme.Command, inline, wdata, rbuf []byte) result {
	h.t.Helper()
	res, err := h.exchange(cmd, inline, wdata, rbuf)
	if err != nil {
		h.t.Fatalf("%s: %v", describe(cmd), err)
	}
	return res
}

func describe(c nvme.Command) string {
	if c.IsFabrics() {
		return fmt.Sprintf("fabrics %v", c.FCType())
	}
	return fmt.Sprintf("opcode %#x", c.Opcode)
}

// connect sends the fabrics Connect with its 1024 bytes in the capsule,
// as a Linux host does on every queue.
func (h *rawHost) connect(qid, sqsize uint16, cattr uint8, cntlid uint16) nvme.Completion {
	h.t.Helper()
	return h.connectTo(qid, sqsize, cattr, cntlid, testSubNQN, testHostNQN)
}

// connectTo sends a Connect for host to sub and returns its response.
func (h *rawHost) connectTo(qid, sqsize uint16, cattr uint8, cntlid uint16, sub, host string) nvme.Completion {
	h.t.Helper()
	var d nvme.ConnectData
	d.HostID = [16]byte{1, 2, 3, 4}
	d.CNTLID = cntlid
	d.SubNQN, _ = nvme.MakeNQNField(sub)
	d.HostNQN, _ = nvme.MakeNQNField(host)
	data := make([]byte, nvme.ConnectDataSize)
	d.Marshal((*[nvme.ConnectDataSize]byte)(data))
	cc := nvme.ConnectCommand{QID: qid, SQSize: sqsize, CAttr: cattr, KATO: 5000}
	if qid > 0 {
		cc.KATO = 0
	}
	var cmd nvme.Command
	cc.Encode(&cmd)
	res := h.mustExchange(cmd, data, nil, nil)
	if res.rsp.Status == 0 {
		h.flowOff = cattr&nvme.ConnectAttrDisableSQFlow != 0
	}
	return res.rsp
}

// expectTerm reads until a C2HTermReq and then the end of the stream,
// and returns the TermReq.
func (h *rawHost) expectTerm() *errTerm {
	h.t.Helper()
	for {
		_, _, err := h.readPDU()
		var et *errTerm
		if errors.As(err, &et) {
			h.nc.SetReadDeadline(time.Now().Add(rawTimeout))
			if n, err := h.nc.Read(make([]byte, 1)); err == nil || n > 0 {
				h.t.Fatalf("data after the C2HTermReq")
			}
			h.nc.Close() // as a host does after a TermReq
			return et
		}
		if err != nil {
			h.t.Fatalf("want a C2HTermReq, got %v", err)
		}
	}
}

// expectClose reads until the target closes, without a TermReq.
func (h *rawHost) expectClose() {
	h.t.Helper()
	for {
		_, _, err := h.readPDU()
		var et *errTerm
		if errors.As(err, &et) {
			h.t.Fatalf("want a close without TermReq, got %v", et)
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				h.t.Fatal("the target did not close the connection")
			}
			h.nc.Close()
			return
		}
	}
}

func propSet(off uint32, v uint64) nvme.Command {
	var c nvme.Command
	(&nvme.PropertyCommand{Set: true, Offset: off, Value: v}).Encode(&c)
	return c
}

func propGet(off uint32, size8 bool) nvme.Command {
	var c nvme.Command
	(&nvme.PropertyCommand{Offset: off, Size8: size8}).Encode(&c)
	return c
}

func identify(cns uint8, nsid uint32) nvme.Command {
	var c nvme.Command
	(&nvme.IdentifyCommand{CNS: cns, NSID: nsid}).Encode(&c)
	return c
}

func rw(op nvme.IOOpcode, nsid uint32, lba uint64, blocks uint32) nvme.Command {
	c := nvme.Command{Opcode: uint8(op), NSID: nsid}
	c.SetRW(lba, blocks, 0)
	return c
}

package nvme

import (
	"encoding/binary"
	"testing"
)

func TestTCPDigestKnownAnswer(t *testing.T) {
	// CRC-32C check value (RFC 3720 B.4 and every CRC catalogue).
	if got := TCPDigest([]byte("123456789")); got != 0xE3069283 {
		t.Fatalf("TCPDigest(123456789) = %#x, want 0xe3069283", got)
	}
	if got := TCPDigestUpdate(TCPDigest([]byte("1234")), []byte("56789")); got != 0xE3069283 {
		t.Fatalf("TCPDigestUpdate split = %#x", got)
	}
	// RFC 3720 B.4: 32 bytes of zeros.
	if got := TCPDigest(make([]byte, 32)); got != 0x8A9136AA {
		t.Fatalf("TCPDigest(32 zeros) = %#x, want 0x8a9136aa", got)
	}
}

func TestTCPHeaderCheck(t *testing.T) {
	none := TCPLimits{}
	both := TCPLimits{Digests: TCPDigests{Header: true, Data: true}}
	lim := TCPLimits{MaxData: 8192}
	cases := []struct {
		name     string
		h        TCPHeader
		fromHost bool
		l        TCPLimits
		fes      uint16
		fei      uint32
		dataLen  uint32
	}{
		{"icreq", TCPHeader{Type: TCPICReq, HLen: 128, PLen: 128}, true, none, 0, 0, 0},
		{"icreq to host", TCPHeader{Type: TCPICReq, HLen: 128, PLen: 128}, false, none, 1, TCPOffType, 0},
		{"icreq plen", TCPHeader{Type: TCPICReq, HLen: 128, PLen: 132}, true, none, 1, TCPOffPLen, 0},
		{"icreq hlen", TCPHeader{Type: TCPICReq, HLen: 72, PLen: 128}, true, none, 1, TCPOffHLen, 0},
		{"icreq flags", TCPHeader{Type: TCPICReq, Flags: 1, HLen: 128, PLen: 128}, true, none, 1, TCPOffFlags, 0},
		{"icresp", TCPHeader{Type: TCPICResp, HLen: 128, PLen: 128}, false, none, 0, 0, 0},
		{"cmd no data", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PLen: 72}, true, none, 0, 0, 0},
		{"cmd 1024 inline", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PDO: 72, PLen: 72 + 1024}, true, none, 0, 0, 1024},
		{"cmd digests inline", TCPHeader{Type: TCPCapsuleCmd, Flags: 3, HLen: 72, PDO: 76, PLen: 76 + 4096 + 4}, true, both, 0, 0, 4096},
		{"cmd digests no data", TCPHeader{Type: TCPCapsuleCmd, Flags: 1, HLen: 72, PLen: 76}, true, both, 0, 0, 0},
		{"cmd ddgst without data", TCPHeader{Type: TCPCapsuleCmd, Flags: 3, HLen: 72, PLen: 76}, true, both, 1, TCPOffFlags, 0},
		{"cmd hdgst missing", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PLen: 72}, true, both, 1, TCPOffFlags, 0},
		{"cmd hdgst unasked", TCPHeader{Type: TCPCapsuleCmd, Flags: 1, HLen: 72, PLen: 76}, true, none, 1, TCPOffFlags, 0},
		{"cmd ddgst missing", TCPHeader{Type: TCPCapsuleCmd, Flags: 1, HLen: 72, PDO: 76, PLen: 76 + 512}, true, both, 1, TCPOffFlags, 0},
		{"cmd pdo wrong", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PDO: 80, PLen: 72 + 512}, true, none, 1, TCPOffPDO, 0},
		{"cmd pdo without data", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PDO: 72, PLen: 72}, true, none, 1, TCPOffPDO, 0},
		{"cmd short plen", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PLen: 40}, true, none, 1, TCPOffPLen, 0},
		{"cmd hlen", TCPHeader{Type: TCPCapsuleCmd, HLen: 24, PLen: 24}, true, none, 1, TCPOffHLen, 0},
		{"cmd too much data", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PDO: 72, PLen: 72 + 8196}, true, lim, TCPFESDataLimitExceeded, TCPOffPLen, 0},
		{"cmd at the limit", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PDO: 72, PLen: 72 + 8192}, true, lim, 0, 0, 8192},
		{"cmd only a data digest", TCPHeader{Type: TCPCapsuleCmd, Flags: 3, HLen: 72, PDO: 76, PLen: 80}, true, both, 1, TCPOffPLen, 0},
		{"cmd to host", TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PLen: 72}, false, none, 1, TCPOffType, 0},
		{"h2cdata", TCPHeader{Type: TCPH2CData, Flags: TCPFlagLastPDU, HLen: 24, PDO: 24, PLen: 24 + 4096}, true, none, 0, 0, 4096},
		{"h2cdata empty", TCPHeader{Type: TCPH2CData, HLen: 24, PLen: 24}, true, none, 1, TCPOffPLen, 0},
		{"h2cdata success", TCPHeader{Type: TCPH2CData, Flags: TCPFlagSuccess | TCPFlagLastPDU, HLen: 24, PDO: 24, PLen: 28}, true, none, 1, TCPOffFlags, 0},
		{"c2hdata success", TCPHeader{Type: TCPC2HData, Flags: TCPFlagSuccess | TCPFlagLastPDU, HLen: 24, PDO: 24, PLen: 28}, false, none, 0, 0, 4},
		{"c2hdata success not last", TCPHeader{Type: TCPC2HData, Flags: TCPFlagSuccess, HLen: 24, PDO: 24, PLen: 28}, false, none, 1, TCPOffFlags, 0},
		{"c2hdata from host", TCPHeader{Type: TCPC2HData, HLen: 24, PDO: 24, PLen: 28}, true, none, 1, TCPOffType, 0},
		{"resp", TCPHeader{Type: TCPCapsuleResp, HLen: 24, PLen: 24}, false, none, 0, 0, 0},
		{"resp digested", TCPHeader{Type: TCPCapsuleResp, Flags: 1, HLen: 24, PLen: 28}, false, both, 0, 0, 0},
		{"resp with data", TCPHeader{Type: TCPCapsuleResp, HLen: 24, PDO: 24, PLen: 28}, false, none, 1, TCPOffPLen, 0},
		{"r2t", TCPHeader{Type: TCPR2T, HLen: 24, PLen: 24}, false, none, 0, 0, 0},
		{"r2t ddgst", TCPHeader{Type: TCPR2T, Flags: 2, HLen: 24, PLen: 24}, false, none, 1, TCPOffFlags, 0},
		{"termreq", TCPHeader{Type: TCPH2CTermReq, HLen: 24, PDO: 24, PLen: 24 + 72}, true, both, 0, 0, 0},
		{"termreq too long", TCPHeader{Type: TCPC2HTermReq, HLen: 24, PLen: 153}, false, none, 1, TCPOffPLen, 0},
		{"unknown type", TCPHeader{Type: 8, HLen: 24, PLen: 24}, true, none, 1, TCPOffType, 0},
	}
	for _, c := range cases {
		h := c.h
		f := h.Check(c.fromHost, c.l)
		if f.FES != c.fes || (c.fes != 0 && f.FEI != c.fei) {
			t.Errorf("%s: Check = %+v, want FES %d FEI %d", c.name, f, c.fes, c.fei)
			continue
		}
		if f.OK() && h.Type != TCPH2CTermReq && h.Type != TCPC2HTermReq {
			if got := h.DataLen(c.l.Digests); got != c.dataLen {
				t.Errorf("%s: DataLen = %d, want %d", c.name, got, c.dataLen)
			}
		}
	}
}

func TestTCPPDURoundTrip(t *testing.T) {
	var b [TCPICSize]byte
	req := TCPICReqPDU{HPDA: 0, DGST: 3, MaxR2T: 7}
	req.Marshal(&b)
	var h TCPHeader
	if err := h.Unmarshal(b[:]); err != nil || h != (TCPHeader{Type: TCPICReq, HLen: 128, PLen: 128}) {
		t.Fatalf("ICReq header %+v %v", h, err)
	}
	var req2 TCPICReqPDU
	if err := req2.Unmarshal(b[:]); err != nil || req2 != req {
		t.Fatalf("ICReq round trip %+v", req2)
	}
	resp := TCPICRespPDU{CPDA: 0, DGST: 1, MaxH2CData: 131072}
	resp.Marshal(&b)
	var resp2 TCPICRespPDU
	if err := resp2.Unmarshal(b[:]); err != nil || resp2 != resp || b[0] != TCPICResp {
		t.Fatalf("ICResp round trip %+v", resp2)
	}
	var d [TCPDataHeaderSize + 4]byte
	for i := range d {
		d[i] = 0xEE
	}
	dp := TCPDataPDU{CCCID: 0x1234, TTag: 9, Offset: 4096, Length: 8192}
	dp.Marshal(d[:])
	var dp2 TCPDataPDU
	if err := dp2.Unmarshal(d[:]); err != nil || dp2 != dp || d[20] != 0 || d[24] != 0xEE {
		t.Fatalf("data PDU round trip %+v %x", dp2, d)
	}
	var tr [TCPTermReqHeaderSize + TCPTermReqMaxData]byte
	bad := make([]byte, 200)
	n := MarshalTermReq(tr[:], TCPC2HTermReq, TCPFault{FES: TCPFESInvalidHeaderField, FEI: 2}, bad)
	if n != 152 || binary.LittleEndian.Uint32(tr[4:8]) != 152 {
		t.Fatalf("TermReq length %d", n)
	}
	var t2 TCPTermReqPDU
	if err := t2.Unmarshal(tr[:]); err != nil || t2.FES != 1 || t2.FEI != 2 {
		t.Fatalf("TermReq %+v", t2)
	}
	var th TCPHeader
	_ = th.Unmarshal(tr[:])
	if f := th.Check(false, TCPLimits{}); !f.OK() {
		t.Fatalf("our own TermReq refused: %v", f)
	}
	var hb [TCPCapsuleRespSize + TCPDigestSize]byte
	(&TCPHeader{Type: TCPCapsuleResp, Flags: TCPFlagHDGST, HLen: 24, PLen: 28}).Marshal(hb[:])
	if PutTCPHeaderDigest(hb[:], 24) != 28 || !TCPHeaderDigestOK(hb[:], 24) {
		t.Fatal("header digest does not check")
	}
	hb[9] ^= 1
	if TCPHeaderDigestOK(hb[:], 24) {
		t.Fatal("header digest checks after a flipped bit")
	}
}

func TestTCPHeaderCheckAllocs(t *testing.T) {
	h := TCPHeader{Type: TCPCapsuleCmd, HLen: 72, PDO: 80, PLen: 72 + 512}
	if n := testing.AllocsPerRun(100, func() { _ = h.Check(true, TCPLimits{}) }); n != 0 {
		t.Fatalf("Check allocates %v times", n)
	}
}

// FuzzTCPHeader: whatever 8 bytes arrive, Check does not panic, and an
// accepted header describes a PDU whose parts add up to PLEN.
func FuzzTCPHeader(f *testing.F) {
	f.Add([]byte{4, 0, 72, 0, 72, 0, 0, 0}, true, false, false, uint32(0))
	f.Add([]byte{4, 3, 72, 76, 0x50, 0x10, 0, 0}, true, true, true, uint32(8192))
	f.Add([]byte{7, 0x0c, 24, 24, 0, 0x10, 0, 0}, false, false, true, uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, fromHost, hd, dd bool, maxData uint32) {
		var h TCPHeader
		if h.Unmarshal(b) != nil {
			return
		}
		l := TCPLimits{Digests: TCPDigests{Header: hd, Data: dd}, MaxData: maxData}
		flt := h.Check(fromHost, l)
		if !flt.OK() {
			if flt.What == "" || flt.FES > TCPFESUnsupportedParam {
				t.Fatalf("fault %+v", flt)
			}
			return
		}
		switch h.Type {
		case TCPICReq, TCPICResp, TCPH2CTermReq, TCPC2HTermReq:
			return
		}
		n := h.DataLen(l.Digests)
		total := uint32(h.HLen) + uint32(l.Digests.HeaderDigestLen()) + n
		if n > 0 {
			total += uint32(l.Digests.DataDigestLen())
		}
		if total != h.PLen {
			t.Fatalf("%+v: parts add to %d", h, total)
		}
		if maxData > 0 && n > maxData {
			t.Fatalf("%+v: data %d beyond %d", h, n, maxData)
		}
	})
}

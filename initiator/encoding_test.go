package initiator

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/blk-project/blk/nvme"
)

func hexBytes(t *testing.T, s string) []byte {
	t.Helper()
	s = strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func marshal(t *testing.T, c *nvme.Command) []byte {
	t.Helper()
	var b [nvme.SQESize]byte
	if err := c.Marshal(&b); err != nil {
		t.Fatal(err)
	}
	return b[:]
}

// The RDMA CM private data of the admin queue is the one the Linux
// nvme-rdma host sent over siw (vm-notes.md golden capture): recfmt 0,
// qid 0, hrqsize 32, hsqsize 31, rest 0.
func TestCMRequestCapture(t *testing.T) {
	capture := hexBytes(t, `00 00 00 00 20 00 1f 00 00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00`)
	got := cmRequest(0, adminDepth, 7) // the admin queue never carries a CNTLID
	if !bytes.Equal(got[:], capture) {
		t.Errorf("admin CM request\n got % x\nwant % x", got, capture)
	}
	io := cmRequest(3, 128, 0x21)
	want := hexBytes(t, `00 00 03 00 80 00 7f 00 21 00`)
	if !bytes.Equal(io[:10], want) || !bytes.Equal(io[10:], make([]byte, 22)) {
		t.Errorf("I/O CM request % x", io)
	}
}

// The admin Connect SQE of a discovery connect, against the capture of
// the Linux host's first FPDU (vm-notes.md): 7f 40, CID 0, FCTYPE 1, SGL
// keyed with length 0x400, SQSIZE 31, KATO 0. The one intended
// difference is the SGL identifier: Linux registers the 1024 bytes for
// that command only and sends 0x4F (invalidate); this host's buffers are
// registered once with a static key, so it sends 0x40 and the target
// answers with a plain Send (§6.2). Address and key are the test's.
func TestConnectSQECapture(t *testing.T) {
	capture := hexBytes(t, `
		7f 40 00 00 | 01 00 00 00 00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00
		00 50 34 12 00 7f 00 00 | 00 04 00 | 4d 3c 2b 1a | 4f
		00 00 | 00 00 | 1f 00 | 00 | 00 | 00 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00`)
	var c nvme.Command
	connectCmd(&c, 0, adminDepth, 0)
	c.CID = makeCID(0, 0) // the first command on slot 0
	c.DPTR = nvme.KeyedSGL(0x7f0012345000, nvme.ConnectDataSize, 0x1a2b3c4d, false)
	got := marshal(t, &c)
	want := bytes.Clone(capture)
	want[39] = nvme.SGLIDKeyed
	if !bytes.Equal(got, want) {
		t.Errorf("connect SQE\n got % x\nwant % x", got, want)
	}

	// An I/O Connect with KATO 0 and in-capsule data; an admin one with
	// the default KATO.
	connectCmd(&c, 2, 128, 0)
	c.DPTR = nvme.InCapsuleSGL(0, nvme.ConnectDataSize)
	b := marshal(t, &c)
	if b[39] != nvme.SGLIDInCapsule || binary.LittleEndian.Uint32(b[32:]) != 1024 ||
		binary.LittleEndian.Uint16(b[42:]) != 2 || binary.LittleEndian.Uint16(b[44:]) != 127 || binary.LittleEndian.Uint32(b[48:]) != 0 {
		t.Errorf("I/O connect % x", b)
	}
	connectCmd(&c, 0, adminDepth, 5000)
	if b := marshal(t, &c); binary.LittleEndian.Uint32(b[48:]) != 5000 {
		t.Errorf("KATO bytes % x", b[48:52])
	}
}

// The end-to-end version: the bytes the fake target received from
// Discover match the capture but for the SGL's address, key and
// identifier.
func TestConnectSQEOnTheWire(t *testing.T) {
	f := newFakeTarget(t, nvme.DiscoveryNQN)
	f.start()
	if _, err := Discover(ctxT(t), testConfig(t), f.addr); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := f.sqes[0]
	cm := f.cmReqs[0]
	f.mu.Unlock()
	head := hexBytes(t, `7f 40 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00`)
	tail := hexBytes(t, `00 00 00 00 1f 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00`)
	if !bytes.Equal(got[:24], head) || !bytes.Equal(got[32:35], []byte{0, 4, 0}) || got[39] != 0x40 || !bytes.Equal(got[40:], tail) {
		t.Errorf("connect SQE on the wire % x", got)
	}
	if !bytes.Equal(cm[:8], hexBytes(t, `00 00 00 00 20 00 1f 00`)) {
		t.Errorf("CM request % x", cm)
	}
}

func TestCommandEncoding(t *testing.T) {
	var c nvme.Command
	le := binary.LittleEndian

	rwCmd(&c, nvme.IOWrite, 3, 0x1_2345_6789, 8, true)
	b := marshal(t, &c)
	if b[0] != 0x01 || b[1] != 0x40 || le.Uint32(b[4:]) != 3 || le.Uint64(b[40:]) != 0x1_2345_6789 ||
		le.Uint32(b[48:]) != 7|1<<30 {
		t.Errorf("write: % x", b)
	}
	rwCmd(&c, nvme.IORead, 1, 5, 1, false)
	if b := marshal(t, &c); b[0] != 0x02 || le.Uint32(b[48:]) != 0 {
		t.Errorf("read: % x", b)
	}
	flushCmd(&c, 9)
	if b := marshal(t, &c); b[0] != 0 || le.Uint32(b[4:]) != 9 {
		t.Errorf("flush: % x", b)
	}
	writeZeroesCmd(&c, 1, 100, 65536, true)
	if b := marshal(t, &c); b[0] != 0x08 || le.Uint64(b[40:]) != 100 || le.Uint32(b[48:]) != 0xFFFF|1<<25 {
		t.Errorf("write zeroes: % x", b)
	}
	dsmCmd(&c, 1, 3)
	if b := marshal(t, &c); b[0] != 0x09 || le.Uint32(b[40:]) != 2 || le.Uint32(b[44:]) != 4 {
		t.Errorf("dsm: % x", b)
	}
	r := make([]byte, 16)
	putDSMRange(r, 0x1122334455, 77)
	if !bytes.Equal(r, hexBytes(t, `00 00 00 00 4d 00 00 00 55 44 33 22 11 00 00 00`)) {
		t.Errorf("dsm range % x", r)
	}

	identifyCmd(&c, nvme.CNSNSDescriptorList, 4, 0)
	if b := marshal(t, &c); b[0] != 0x06 || le.Uint32(b[4:]) != 4 || le.Uint32(b[40:]) != 3 {
		t.Errorf("identify: % x", b)
	}
	setFeaturesCmd(&c, nvme.FeatureNumQueues, numQueuesValue(4))
	if b := marshal(t, &c); b[0] != 0x09 || le.Uint32(b[40:]) != 7 || le.Uint32(b[44:]) != 0x00030003 {
		t.Errorf("set features: % x", b)
	}
	if grantedQueues(0x00010003) != 2 || grantedQueues(0) != 1 {
		t.Error("grantedQueues")
	}
	// Get Log Page: NUMD 0's based in dwords, split NUMDL/NUMDU; LPO.
	getLogPageCmd(&c, nvme.LogDiscovery, 0, 1024, 20, true)
	if b := marshal(t, &c); le.Uint32(b[40:]) != 0x70|1<<15|4<<16 || le.Uint32(b[44:]) != 0 || le.Uint64(b[48:]) != 1024 {
		t.Errorf("get log page: % x", b[40:56])
	}
	getLogPageCmd(&c, 0x70, 0, 1<<32, 1<<20, false)
	if b := marshal(t, &c); le.Uint32(b[40:]) != 0x70|0xFFFF<<16 || le.Uint32(b[44:]) != 3 || le.Uint32(b[52:]) != 1 {
		t.Errorf("large get log page: % x", b[40:56])
	}

	propertyGetCmd(&c, nvme.PropCAP, true)
	if b := marshal(t, &c); b[0] != 0x7f || b[1] != 0x40 || b[4] != 0x04 || b[40] != 1 || le.Uint32(b[44:]) != 0 {
		t.Errorf("property get: % x", b)
	}
	propertySetCmd(&c, nvme.PropCC, 0x00460001)
	if b := marshal(t, &c); b[4] != 0 || b[40] != 0 || le.Uint32(b[44:]) != 0x14 || le.Uint64(b[48:]) != 0x00460001 {
		t.Errorf("property set: % x", b)
	}
	keepAliveCmd(&c)
	if b := marshal(t, &c); b[0] != 0x18 || b[1] != 0x40 {
		t.Errorf("keep alive: % x", b)
	}

	// The CC values of the enable handshake (§2.2).
	cc := nvme.MakeCC(nvme.CCFields{IOSQES: 6, IOCQES: 4})
	if cc != 0x00460000 || cc|nvme.CCEnable != 0x00460001 || cc|nvme.CCEnable|nvme.CC(nvme.ShutdownNormal)<<14 != 0x00464001 {
		t.Errorf("CC %#x", uint32(cc))
	}
}

func TestConnectDataBytes(t *testing.T) {
	var b [nvme.ConnectDataSize]byte
	id := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if err := connectData(&b, id, 0xFFFF, "nqn.2024-01.io.blk:sub", "nqn.2024-01.io.blk:host"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[:16], id[:]) || b[16] != 0xFF || b[17] != 0xFF ||
		!bytes.HasPrefix(b[256:], []byte("nqn.2024-01.io.blk:sub\x00")) || !bytes.HasPrefix(b[512:], []byte("nqn.2024-01.io.blk:host\x00")) {
		t.Errorf("connect data % x", b[:32])
	}
	if err := connectData(&b, id, 1, strings.Repeat("x", 300), "nqn.2024-01.io.blk:host"); err == nil {
		t.Error("an NQN that does not fit was accepted")
	}
}

func TestCommandNames(t *testing.T) {
	var c nvme.Command
	for _, tc := range []struct {
		fill func()
		qid  uint16
		want string
	}{
		{func() { connectCmd(&c, 0, 32, 0) }, 0, "Connect"},
		{func() { propertyGetCmd(&c, 0, false) }, 0, "Property Get"},
		{func() { identifyCmd(&c, 1, 0, 0) }, 0, "Identify"},
		{func() { keepAliveCmd(&c) }, 0, "Keep Alive"},
		{func() { rwCmd(&c, nvme.IORead, 1, 0, 1, false) }, 1, "Read"},
		{func() { flushCmd(&c, 1) }, 1, "Flush"},
		{func() { dsmCmd(&c, 1, 1) }, 1, "Dataset Management"},
	} {
		tc.fill()
		if got := commandName(&c, tc.qid); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
}

func TestStatusErrorMessage(t *testing.T) {
	cqe := nvme.Completion{Status: nvme.StatusLBAOutOfRange.WithDNR()}
	err := statusError("Read", 3, &cqe)
	if got := err.Error(); got != "initiator: Read on queue 3 failed: LBA Out of Range +DNR (SCT 0 SC 0x80)" {
		t.Errorf("message %q", got)
	}
	cqe = nvme.Completion{Status: nvme.StatusConnectInvalidParameters.WithDNR(), DW0: nvme.ConnectInvalidParamDW0(256, true)}
	err = statusError("Connect", 0, &cqe)
	if !strings.Contains(err.Error(), "invalid parameter at data offset 256") || !isConnectDNR(err) {
		t.Errorf("connect: %v", err)
	}
	if isConnectDNR(statusError("Read", 1, &cqe)) {
		t.Error("a Read is not a Connect")
	}
}

package nvme

import (
	"strings"
	"testing"
)

const testHostNQN = "nqn.2014-08.org.nvmexpress:uuid:0f8fbd42-3b86-4a4c-8f6b-1d2c1e0a9b77"

func TestConnectDataLayout(t *testing.T) {
	sub, err := MakeNQNField("nqn.2026-01.io.blk:vol1")
	if err != nil {
		t.Fatal(err)
	}
	host, err := MakeNQNField(testHostNQN)
	if err != nil {
		t.Fatal(err)
	}
	d := ConnectData{
		HostID:  [16]byte{0x0f, 0x8f, 0xbd, 0x42, 0x3b, 0x86, 0x4a, 0x4c, 0x8f, 0x6b, 0x1d, 0x2c, 0x1e, 0x0a, 0x9b, 0x77},
		CNTLID:  CNTLIDDynamic,
		SubNQN:  sub,
		HostNQN: host,
	}
	var b [ConnectDataSize]byte
	for i := range b {
		b[i] = 0xEE // Marshal must clear reserved bytes
	}
	d.Marshal(&b)

	// nvme.h struct nvmf_connect_data: hostid 0, cntlid 16, resv4[238],
	// subsysnqn 256, hostnqn 512, resv5 768..1023.
	equalBytes(t, "hostid", b[0:16], d.HostID[:])
	equalBytes(t, "cntlid", b[16:18], []byte{0xff, 0xff})
	equalBytes(t, "resv4", b[18:256], make([]byte, 238))
	if got := string(b[256 : 256+len("nqn.2026-01.io.blk:vol1")]); got != "nqn.2026-01.io.blk:vol1" || b[256+len(got)] != 0 {
		t.Errorf("subnqn at 256: %q", got)
	}
	if got := string(b[512 : 512+len(testHostNQN)]); got != testHostNQN || b[512+len(got)] != 0 {
		t.Errorf("hostnqn at 512: %q", got)
	}
	equalBytes(t, "resv5", b[768:], make([]byte, 256))

	var back ConnectData
	if err := back.Unmarshal(b[:]); err != nil || back != d {
		t.Fatalf("round trip %v", err)
	}
	if err := back.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if !back.SubNQN.Equal("nqn.2026-01.io.blk:vol1") || back.HostNQN.String() != testHostNQN {
		t.Fatal("NQN accessors")
	}
	if err := back.Unmarshal(b[:ConnectDataSize-1]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
}

func TestConnectDataValidate(t *testing.T) {
	var d ConnectData
	d.SubNQN, _ = MakeNQNField(DiscoveryNQN)
	d.HostNQN, _ = MakeNQNField(testHostNQN)
	if err := d.Validate(); err != nil {
		t.Fatalf("valid: %v", err)
	}
	for i := range d.HostNQN {
		d.HostNQN[i] = 'a'
	}
	if err := d.Validate(); err != ErrFieldNotTerminated {
		t.Fatalf("unterminated: %v", err)
	}
	d.HostNQN, _ = MakeNQNField("not-an-nqn")
	if err := d.Validate(); err != ErrNQN {
		t.Fatalf("bad hostnqn: %v", err)
	}
	if _, err := MakeNQNField(strings.Repeat("x", 256)); err != ErrFieldTooLong {
		t.Fatalf("MakeNQNField too long: %v", err)
	}
	if _, err := MakeNQNField(strings.Repeat("x", 255)); err != nil {
		t.Fatalf("MakeNQNField 255: %v", err)
	}
}

func TestConnectResponse(t *testing.T) {
	dw0 := ConnectResponseDW0(0x0001, 0)
	if dw0 != 1 || ConnectResponseCNTLID(dw0) != 1 {
		t.Fatalf("dw0 = %#x", dw0)
	}
	dw0 = ConnectResponseDW0(0xFFEF, ConnectAuthReqATR)
	if dw0 != 0x0002FFEF || ConnectResponseCNTLID(dw0) != CNTLIDMax {
		t.Fatalf("dw0 with ATR = %#x", dw0)
	}
	// Invalid CNTLID in the data: IPO 16, IATTR 1 (what nvmet returns).
	dw0 = ConnectInvalidParamDW0(16, true)
	if dw0 != 0x00010010 {
		t.Fatalf("invalid param dw0 = %#x", dw0)
	}
	if ipo, inData := ConnectInvalidParam(dw0); ipo != 16 || !inData {
		t.Fatalf("split = %d %v", ipo, inData)
	}
	// SQSIZE in the SQE: IPO 44, IATTR 0.
	if ipo, inData := ConnectInvalidParam(ConnectInvalidParamDW0(44, false)); ipo != 44 || inData {
		t.Fatalf("split = %d %v", ipo, inData)
	}
}

// Layout per nvme.h struct nvmf_property_get_command / _set_command:
// fctype 4, attrib 40, offset 44, value 48.
func TestPropertyCommands(t *testing.T) {
	cases := []struct {
		name string
		p    PropertyCommand
		want string
	}{
		{"get CAP", PropertyCommand{CID: 7, Flags: FlagSGLMetaBuf, Size8: true, Offset: PropCAP}, `
			7f 40 07 00 | 04 00 00 00 00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
			01 00 00 00 | 00 00 00 00 | 00 00 00 00 00 00 00 00 | 00 00 00 00 00 00 00 00`},
		{"get CSTS", PropertyCommand{CID: 9, Flags: FlagSGLMetaBuf, Offset: PropCSTS}, `
			7f 40 09 00 | 04 00 00 00 00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
			00 00 00 00 | 1c 00 00 00 | 00 00 00 00 00 00 00 00 | 00 00 00 00 00 00 00 00`},
		{"set CC", PropertyCommand{CID: 8, Flags: FlagSGLMetaBuf, Set: true, Offset: PropCC, Value: 0x00460001}, `
			7f 40 08 00 | 00 00 00 00 00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
			00 00 00 00 | 14 00 00 00 | 01 00 46 00 00 00 00 00 | 00 00 00 00 00 00 00 00`},
		{"set NSSR", PropertyCommand{Set: true, Offset: PropNSSR, Value: uint64(NSSRReset)}, `
			7f 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
			00 00 00 00 | 20 00 00 00 | 65 4d 56 4e 00 00 00 00 | 00 00 00 00 00 00 00 00`},
		{"set 8-byte", PropertyCommand{Set: true, Size8: true, Offset: 0x40, Value: 0x0102030405060708}, `
			7f 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00
			00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
			01 00 00 00 | 40 00 00 00 | 08 07 06 05 04 03 02 01 | 00 00 00 00 00 00 00 00`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c Command
			tc.p.Encode(&c)
			var b [SQESize]byte
			if err := c.Marshal(&b); err != nil {
				t.Fatal(err)
			}
			equalBytes(t, "SQE", b[:], hexBytes(t, tc.want))
			var back Command
			if err := back.Unmarshal(b[:]); err != nil {
				t.Fatal(err)
			}
			var p PropertyCommand
			if err := p.Decode(&back); err != nil || p != tc.p {
				t.Fatalf("decode %v: %+v want %+v", err, p, tc.p)
			}
		})
	}
	var p PropertyCommand
	c := Command{Opcode: OpcodeFabrics, NSID: uint32(FabricsConnect)}
	if err := p.Decode(&c); err != ErrNotFabrics {
		t.Fatalf("connect as property: %v", err)
	}
	c = Command{Opcode: uint8(AdminIdentify)}
	if err := p.Decode(&c); err != ErrNotFabrics {
		t.Fatalf("identify as property: %v", err)
	}
}

func TestRegisterOffsets(t *testing.T) {
	// nvme.h NVME_REG_*.
	if PropCAP != 0x00 || PropVS != 0x08 || PropCC != 0x14 || PropCSTS != 0x1c || PropNSSR != 0x20 || PropCRTO != 0x68 {
		t.Fatal("property offsets")
	}
}

func TestCAP(t *testing.T) {
	// The Linux target's CAP over TCP (wire digest §2.2).
	c := CAP(0x0000_0820_0F00_03FF)
	if c.MQES() != 1023 || c.TO() != 15 || c.CQR() || c.AMS() != 0 || c.DSTRD() != 0 ||
		c.NSSRS() || c.MPSMIN() != 0 || c.MPSMAX() != 0 || c.CRWMS() || c.CRIMS() {
		t.Fatalf("decode %#x", uint64(c))
	}
	if c.CSS() != CAPCSSNVM|CAPCSSIOCS {
		t.Fatalf("CSS = %#x", c.CSS())
	}
	f := CAPFields{MQES: 1023, TO: 15, CSS: CAPCSSNVM | CAPCSSIOCS}
	if got := MakeCAP(f); got != c {
		t.Fatalf("MakeCAP = %#x", uint64(got))
	}
	all := MakeCAP(CAPFields{
		MQES: 0xFFFF, CQR: true, AMS: 3, TO: 0xFF, DSTRD: 0xF, NSSRS: true, CSS: 0xFF,
		MPSMIN: 0xF, MPSMAX: 0xF, CRWMS: true, CRIMS: true,
	})
	if all != 0x18FF_1FFF_FF07_FFFF {
		t.Fatalf("all fields = %#x", uint64(all))
	}
	if !all.CQR() || all.AMS() != 3 || all.DSTRD() != 0xF || !all.NSSRS() || all.CSS() != 0xFF ||
		all.MPSMIN() != 0xF || all.MPSMAX() != 0xF || !all.CRWMS() || !all.CRIMS() {
		t.Fatal("all fields decode")
	}
}

func TestCC(t *testing.T) {
	// Values the Linux host writes (wire digest §2.2).
	cases := []struct {
		cc CC
		f  CCFields
	}{
		{0x00460000, CCFields{IOSQES: 6, IOCQES: 4}},
		{0x00460060, CCFields{CSS: CCCSSCSI, IOSQES: 6, IOCQES: 4}},
		{0x00460001, CCFields{EN: true, IOSQES: 6, IOCQES: 4}},
		{0x00460061, CCFields{EN: true, CSS: CCCSSCSI, IOSQES: 6, IOCQES: 4}},
		{0x00464001, CCFields{EN: true, SHN: ShutdownNormal, IOSQES: 6, IOCQES: 4}},
		{0x01FFFFF1, CCFields{EN: true, CSS: 7, MPS: 0xF, AMS: 7, SHN: 3, IOSQES: 0xF, IOCQES: 0xF, CRIME: true}},
	}
	for _, tc := range cases {
		if got := MakeCC(tc.f); got != tc.cc {
			t.Errorf("MakeCC(%+v) = %#x, want %#x", tc.f, uint32(got), uint32(tc.cc))
		}
		c := tc.cc
		got := CCFields{EN: c.EN(), CSS: c.CSS(), MPS: c.MPS(), AMS: c.AMS(), SHN: c.SHN(),
			IOSQES: c.IOSQES(), IOCQES: c.IOCQES(), CRIME: c.CRIME()}
		if got != tc.f {
			t.Errorf("decode %#x = %+v, want %+v", uint32(c), got, tc.f)
		}
	}
}

func TestCSTS(t *testing.T) {
	if MakeCSTS(true, false, ShutdownStatusNormal) != 0x1 {
		t.Fatal("RDY")
	}
	// The Linux target's answer after a normal shutdown: SHST complete.
	s := MakeCSTS(false, false, ShutdownStatusComplete)
	if s != 0x08 || s.SHST() != ShutdownStatusComplete || s.RDY() {
		t.Fatalf("shutdown complete = %#x", uint32(s))
	}
	s = MakeCSTS(true, true, ShutdownStatusOccurring)
	if s != 0x7 || !s.CFS() || !s.RDY() || s.SHST() != ShutdownStatusOccurring {
		t.Fatalf("= %#x", uint32(s))
	}
	s = s.WithSHST(ShutdownStatusComplete)
	if s != 0xB || s.NSSRO() {
		t.Fatalf("WithSHST = %#x", uint32(s))
	}
	if !(CSTSNSSRO | CSTSReady).NSSRO() {
		t.Fatal("NSSRO")
	}
}

func TestVersion(t *testing.T) {
	v := MakeVersion(1, 4, 0)
	if v != 0x00010400 || v.Major() != 1 || v.Minor() != 4 || v.Tertiary() != 0 {
		t.Fatalf("1.4.0 = %#x", uint32(v))
	}
	if MakeVersion(2, 0, 0) != 0x00020000 || MakeVersion(1, 3, 7).Tertiary() != 7 {
		t.Fatal("2.0.0")
	}
}

func TestPropertySize(t *testing.T) {
	for attrib, want := range map[uint32]int{0: 4, 1: 8, 2: 0, 7: 0, 0xF8: 4, 0xF9: 8} {
		c := Command{Opcode: OpcodeFabrics, NSID: uint32(FabricsPropertyGet), CDW10: attrib}
		got, ok := PropertySize(&c)
		if got != want || ok != (want != 0) {
			t.Errorf("attrib %#x: %d %v, want %d", attrib, got, ok, want)
		}
	}
}

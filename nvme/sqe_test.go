package nvme

import (
	"testing"
)

// A command with a distinct value in every field, and its bytes laid out
// per the SQE table (nvme.h struct nvme_common_command; wire digest §1.1).
func TestCommandLayout(t *testing.T) {
	c := Command{
		Opcode: 0x02,
		Flags:  0x40 | 0x01,
		CID:    0x1234,
		NSID:   0x05060708,
		CDW2:   0x0A0B0C0D,
		CDW3:   0x0E0F1011,
		MPTR:   0x1213141516171819,
		DPTR:   SGL{Addr: 0x2122232425262728, Length: 0x29, Key: 0x2A2B2C2D, ID: SGLIDKeyedInvalidate},
		CDW10:  0x31323334,
		CDW11:  0x35363738,
		CDW12:  0x393A3B3C,
		CDW13:  0x3D3E3F40,
		CDW14:  0x41424344,
		CDW15:  0x45464748,
	}
	want := hexBytes(t, `
		02 | 41 | 34 12 | 08 07 06 05
		0d 0c 0b 0a | 11 10 0f 0e
		19 18 17 16 15 14 13 12
		28 27 26 25 24 23 22 21 | 29 00 00 | 2d 2c 2b 2a | 4f
		34 33 32 31 | 38 37 36 35 | 3c 3b 3a 39 | 40 3f 3e 3d | 44 43 42 41 | 48 47 46 45`)
	var b [SQESize]byte
	if err := c.Marshal(&b); err != nil {
		t.Fatal(err)
	}
	equalBytes(t, "SQE", b[:], want)

	var got Command
	if err := got.Unmarshal(want); err != nil {
		t.Fatal(err)
	}
	if got != c {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, c)
	}
	if got.Fuse() != 1 || got.PSDT() != PSDTSGLMetaBuf {
		t.Errorf("Fuse %d PSDT %d", got.Fuse(), got.PSDT())
	}
	if got.DataDirection() != DirCtrlToHost {
		t.Errorf("read direction = %d", got.DataDirection())
	}
}

func TestCommandShort(t *testing.T) {
	var c Command
	if err := c.Unmarshal(make([]byte, SQESize-1)); err != ErrShortBuffer {
		t.Fatalf("err = %v", err)
	}
}

// The admin Connect the Linux nvme-rdma host sent over siw (vm-notes.md,
// golden capture): 7f 40 00 00 01 00 ..., keyed SGL of 0x400 bytes with
// identifier 0x4f, SQSIZE 31, KATO 0. The capture did not record the
// address and key, so the test picks its own.
func TestConnectCaptureSQE(t *testing.T) {
	capture := hexBytes(t, `
		7f 40 00 00 | 01 00 00 00 00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00
		00 50 34 12 00 7f 00 00 | 00 04 00 | 4d 3c 2b 1a | 4f
		00 00 | 00 00 | 1f 00 | 00 | 00 | 00 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00`)

	var c Command
	if err := c.Unmarshal(capture); err != nil {
		t.Fatal(err)
	}
	if !c.IsFabrics() || c.FCType() != FabricsConnect || c.Flags != FlagSGLMetaBuf || c.CID != 0 {
		t.Fatalf("header: %+v", c)
	}
	if c.DataDirection() != DirHostToCtrl {
		t.Errorf("Connect direction = %d, want host to controller", c.DataDirection())
	}
	want := SGL{Addr: 0x7f0012345000, Length: 0x400, Key: 0x1a2b3c4d, ID: 0x4f}
	if c.DPTR != want || !c.DPTR.Keyed() || c.DPTR.Subtype() != SGLSubtypeInvalidate {
		t.Fatalf("DPTR = %+v, want %+v", c.DPTR, want)
	}
	var cc ConnectCommand
	if err := cc.Decode(&c); err != nil {
		t.Fatal(err)
	}
	if cc.RecFmt != 0 || cc.QID != 0 || cc.SQSize != 31 || cc.CAttr != 0 || cc.KATO != 0 {
		t.Fatalf("connect fields: %+v", cc)
	}

	// Encoding the same fields gives the capture back byte for byte.
	var enc Command
	cc.Encode(&enc)
	var b [SQESize]byte
	if err := enc.Marshal(&b); err != nil {
		t.Fatal(err)
	}
	equalBytes(t, "connect SQE", b[:], capture)
}

func TestConnectCommandFields(t *testing.T) {
	cc := ConnectCommand{
		CID: 0x0102, Flags: FlagSGLMetaBuf, DPTR: InCapsuleSGL(0, ConnectDataSize),
		RecFmt: 0, QID: 3, SQSize: 127, CAttr: ConnectAttrDisableSQFlow, KATO: 5000,
	}
	var c Command
	cc.Encode(&c)
	var b [SQESize]byte
	if err := c.Marshal(&b); err != nil {
		t.Fatal(err)
	}
	want := hexBytes(t, `
		7f 40 02 01 | 01 00 00 00 00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00 | 00 04 00 00 | 00 00 00 | 01
		00 00 | 03 00 | 7f 00 | 04 | 00 | 88 13 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00`)
	equalBytes(t, "connect SQE", b[:], want)
	var back ConnectCommand
	if err := back.Decode(&c); err != nil || back != cc {
		t.Fatalf("decode: %v %+v", err, back)
	}
	c.NSID = uint32(FabricsPropertyGet)
	if err := back.Decode(&c); err != ErrNotFabrics {
		t.Fatalf("decode of property get as connect: %v", err)
	}
}

func TestSGLLayouts(t *testing.T) {
	cases := []struct {
		name string
		sgl  SGL
		want string
	}{
		{"keyed", KeyedSGL(0x1122334455667788, 0xABCDEF, 0xDEADBEEF, false),
			"88 77 66 55 44 33 22 11 | ef cd ab | ef be ad de | 40"},
		{"keyed invalidate", KeyedSGL(0x1000, 0x400, 0x01020304, true),
			"00 10 00 00 00 00 00 00 | 00 04 00 | 04 03 02 01 | 4f"},
		{"rdma no data", KeyedSGL(0, 0, 0, false),
			"00 00 00 00 00 00 00 00 | 00 00 00 | 00 00 00 00 | 40"},
		{"in-capsule", InCapsuleSGL(0, 4096),
			"00 00 00 00 00 00 00 00 | 00 10 00 00 | 00 00 00 | 01"},
		{"tcp transport", TransportSGL(8192),
			"00 00 00 00 00 00 00 00 | 00 20 00 00 | 00 00 00 | 5a"},
		{"last segment", SGL{Addr: 0x2000, Length: 32, ID: SGLIDLastSegment},
			"00 20 00 00 00 00 00 00 | 20 00 00 00 | 00 00 00 | 30"},
		{"segment", SGL{Addr: 0x3000, Length: 64, ID: SGLIDSegment},
			"00 30 00 00 00 00 00 00 | 40 00 00 00 | 00 00 00 | 20"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b [SGLSize]byte
			if err := tc.sgl.Marshal(&b); err != nil {
				t.Fatal(err)
			}
			equalBytes(t, "SGL", b[:], hexBytes(t, tc.want))
			var got SGL
			if err := got.Unmarshal(b[:]); err != nil || got != tc.sgl {
				t.Fatalf("round trip %v: %+v want %+v", err, got, tc.sgl)
			}
		})
	}
}

func TestSGLErrors(t *testing.T) {
	var b [SGLSize]byte
	if err := KeyedSGL(0, MaxKeyedSGLLength+1, 0, true).Marshal(&b); err != ErrSGLLength {
		t.Fatalf("oversized keyed length: %v", err)
	}
	if err := KeyedSGL(0, MaxKeyedSGLLength, 0, true).Marshal(&b); err != nil {
		t.Fatalf("max keyed length: %v", err)
	}
	c := Command{DPTR: KeyedSGL(0, 1<<24, 0, false)}
	var sqe [SQESize]byte
	if err := c.Marshal(&sqe); err != ErrSGLLength {
		t.Fatalf("command with oversized keyed SGL: %v", err)
	}
	var s SGL
	if err := s.Unmarshal(b[:15]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
	// Reserved bytes 12-14 of a non-keyed descriptor are ignored on read.
	raw := hexBytes(t, "00 00 00 00 00 00 00 00 | 00 02 00 00 | aa bb cc | 01")
	if err := s.Unmarshal(raw); err != nil || s != InCapsuleSGL(0, 512) {
		t.Fatalf("reserved bytes: %+v", s)
	}
}

func TestOpcodeValues(t *testing.T) {
	// Values from include/linux/nvme.h (nvme_admin_opcode, nvme_opcode,
	// nvmf_capsule_command).
	admin := map[AdminOpcode]uint8{
		AdminGetLogPage: 0x02, AdminIdentify: 0x06, AdminAbort: 0x08, AdminSetFeatures: 0x09,
		AdminGetFeatures: 0x0a, AdminAsyncEvent: 0x0c, AdminKeepAlive: 0x18,
	}
	for op, v := range admin {
		if uint8(op) != v {
			t.Errorf("%v = %#x, want %#x", op, uint8(op), v)
		}
	}
	io := map[IOOpcode]uint8{
		IOFlush: 0, IOWrite: 1, IORead: 2, IOCompare: 5, IOWriteZeroes: 8, IODatasetManagement: 9,
	}
	for op, v := range io {
		if uint8(op) != v {
			t.Errorf("%v = %#x, want %#x", op, uint8(op), v)
		}
	}
	if FabricsPropertySet != 0 || FabricsConnect != 1 || FabricsPropertyGet != 4 ||
		FabricsAuthSend != 5 || FabricsAuthRecv != 6 || OpcodeFabrics != 0x7f {
		t.Error("fabrics values")
	}
	names := map[string]string{
		AdminIdentify.String():          "Identify",
		AdminKeepAlive.String():         "Keep Alive",
		AdminOpcode(0x7f).String():      "Fabrics",
		AdminOpcode(0xee).String():      "admin opcode 0xee",
		IOWriteZeroes.String():          "Write Zeroes",
		IOOpcode(0x7f).String():         "Fabrics",
		FabricsConnect.String():         "Connect",
		FabricsPropertyGet.String():     "Property Get",
		FabricsType(0x33).String():      "fctype 0x33",
		IODatasetManagement.String():    "Dataset Management",
		AdminAsyncEvent.String():        "Asynchronous Event Request",
		AdminGetLogPage.String():        "Get Log Page",
		RDMACMInvalidHSQSize.String():   "invalid host SQ size",
		RDMACMRejectStatus(99).String(): "reject status 0x63",
	}
	for got, want := range names {
		if got != want {
			t.Errorf("name %q, want %q", got, want)
		}
	}
}

package nvme

import (
	"encoding/binary"
	"testing"
)

// Offsets pinned against struct nvme_id_ctrl in include/linux/nvme.h
// (gregkh/linux 75141d5).
func TestIdentifyControllerLayout(t *testing.T) {
	id := IdentifyController{
		VID: 0x1b36, SSVID: 0x1af4, RAB: 6, IEEE: [3]byte{1, 2, 3},
		CMIC: CMICMultiPort | CMICMultiCtrl, MDTS: 8, CNTLID: 0x1234,
		VER: MakeVersion(1, 4, 0), RTD3R: 0x11, RTD3E: 0x22, OAES: AENNSAttr,
		CTRATT: CtrAttHostID128, CNTRLTYPE: CtrlTypeIO, CRDT: [3]uint16{1, 2, 3},
		OACS: 0x0102, ACL: 3, AERL: 3, FRMW: 3, LPA: 7, ELPE: 63, NPSS: 0,
		AVSCC: 1, APSTA: 0, WCTEMP: 0x157, CCTEMP: 0x175,
		KAS: 10, ANATT: 10, ANACAP: 0x45, ANAGRPMAX: 0x01020304, NANAGRPID: 0x05060708, SQES: 0x66, CQES: 0x44, MAXCMD: 128, NN: 1024,
		ONCS: ONCSCompare | ONCSDSM | ONCSWriteZeroes, FUSES: 1, FNA: 2, VWC: VWCPresent,
		AWUN: 5, AWUPF: 6, NVSCC: 1, NWPC: 1, ACWU: 7,
		SGLS: SGLSSupported | SGLSKeyed | SGLSOffset, MNAN: 1024,
		IOCCSZ: 260, IORCSZ: 1, ICDOFF: 0, CTRATTR: 0, MSDBD: 1, DCTYPE: 1,
		PSD0: PowerState{MaxPower: 0x9c4, EntryLat: 0x10, ExitLat: 0x4, RRT: 1, RRL: 2, RWT: 3, RWL: 4},
	}
	if err := SetASCII(id.SN[:], "SN1"); err != nil {
		t.Fatal(err)
	}
	if err := SetASCII(id.MN[:], "blk"); err != nil {
		t.Fatal(err)
	}
	if err := SetASCII(id.FR[:], "1.0"); err != nil {
		t.Fatal(err)
	}
	id.SubNQN, _ = MakeNQNField("nqn.2026-01.io.blk:s")
	var b [IdentifySize]byte
	for i := range b {
		b[i] = 0xEE
	}
	id.Marshal(&b)
	le := binary.LittleEndian
	checks := []struct {
		name string
		off  int
		size int
		want uint64
	}{
		{"vid", 0, 2, 0x1b36}, {"ssvid", 2, 2, 0x1af4}, {"rab", 72, 1, 6},
		{"ieee", 73, 1, 1}, {"cmic", 76, 1, 3}, {"mdts", 77, 1, 8},
		{"cntlid", 78, 2, 0x1234}, {"ver", 80, 4, 0x10400}, {"rtd3r", 84, 4, 0x11},
		{"rtd3e", 88, 4, 0x22}, {"oaes", 92, 4, 0x100}, {"ctratt", 96, 4, 1},
		{"cntrltype", 111, 1, 1}, {"crdt1", 128, 2, 1}, {"crdt3", 132, 2, 3},
		{"oacs", 256, 2, 0x0102}, {"acl", 258, 1, 3}, {"aerl", 259, 1, 3},
		{"frmw", 260, 1, 3}, {"lpa", 261, 1, 7}, {"elpe", 262, 1, 63},
		{"avscc", 264, 1, 1}, {"wctemp", 266, 2, 0x157}, {"cctemp", 268, 2, 0x175},
		{"kas", 320, 2, 10}, {"anatt", 342, 1, 10}, {"anacap", 343, 1, 0x45},
		{"anagrpmax", 344, 4, 0x01020304}, {"nanagrpid", 348, 4, 0x05060708}, {"sqes", 512, 1, 0x66}, {"cqes", 513, 1, 0x44},
		{"maxcmd", 514, 2, 128}, {"nn", 516, 4, 1024}, {"oncs", 520, 2, 0x0d},
		{"fuses", 522, 2, 1}, {"fna", 524, 1, 2}, {"vwc", 525, 1, 1},
		{"awun", 526, 2, 5}, {"awupf", 528, 2, 6}, {"nvscc", 530, 1, 1}, {"nwpc", 531, 1, 1},
		{"acwu", 532, 2, 7}, {"sgls", 536, 4, 0x100005}, {"mnan", 540, 4, 1024},
		{"ioccsz", 1792, 4, 260}, {"iorcsz", 1796, 4, 1}, {"icdoff", 1800, 2, 0},
		{"msdbd", 1803, 1, 1}, {"dctype", 1806, 1, 1},
		{"psd0.mp", 2048, 2, 0x9c4}, {"psd0.enlat", 2052, 4, 0x10}, {"psd0.exlat", 2056, 4, 4},
		{"psd0.rrt", 2060, 1, 1}, {"psd0.rwl", 2063, 1, 4},
	}
	for _, c := range checks {
		var got uint64
		switch c.size {
		case 1:
			got = uint64(b[c.off])
		case 2:
			got = uint64(le.Uint16(b[c.off:]))
		case 4:
			got = uint64(le.Uint32(b[c.off:]))
		}
		if got != c.want {
			t.Errorf("%s at %d: %#x, want %#x", c.name, c.off, got, c.want)
		}
	}
	if string(b[4:24]) != "SN1                 " || string(b[24:28]) != "blk " || string(b[64:72]) != "1.0     " {
		t.Errorf("ascii fields %q %q %q", b[4:24], b[24:64], b[64:72])
	}
	if string(b[768:788]) != "nqn.2026-01.io.blk:s" || b[788] != 0 {
		t.Errorf("subnqn %q", b[768:790])
	}
	// Every byte not named is zero.
	if b[100] != 0 || b[110] != 0 || b[300] != 0 || b[1805] != 0 || b[4095] != 0 {
		t.Errorf("reserved bytes not zero")
	}
	var back IdentifyController
	if err := back.Unmarshal(b[:]); err != nil || back != id {
		t.Fatalf("round trip: %v\n%+v\n%+v", err, back, id)
	}
	if err := back.Unmarshal(b[:100]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
	if TrimASCII(back.SN[:]) != "SN1" || TrimASCII(back.MN[:]) != "blk" {
		t.Fatalf("trim")
	}
}

func TestSetASCII(t *testing.T) {
	var f [8]byte
	if err := SetASCII(f[:], "123456789"); err != ErrFieldTooLong {
		t.Fatalf("long: %v", err)
	}
	if err := SetASCII(f[:], "a\x00"); err != ErrNotASCII {
		t.Fatalf("nul: %v", err)
	}
	if err := SetASCII(f[:], "12345678"); err != nil || string(f[:]) != "12345678" {
		t.Fatalf("exact: %v %q", err, f)
	}
}

// Offsets pinned against struct nvme_id_ns.
func TestIdentifyNamespaceLayout(t *testing.T) {
	ns := IdentifyNamespace{
		NSZE: 0x0102030405060708, NCAP: 2, NUSE: 3, NSFEAT: NSFeatThin, NLBAF: 1, FLBAS: 1,
		MC: 4, DPC: 5, DPS: 6, NMIC: NMICShared, RESCAP: 7, FPI: 8, DLFEAT: DLFeatZeroes | DLFeatWZDEAC,
		NAWUN: 9, NAWUPF: 10, NACWU: 11, NABSN: 12, NABO: 13, NABSPF: 14, NOIOB: 15,
		NPWG: 16, NPWA: 17, NPDG: 18, NPDA: 19, NOWS: 20, ANAGRPID: 21, NSATTR: NSAttrRO,
		NVMSETID: 22, ENDGID: 23,
		NGUID: [16]byte{0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xaf},
		EUI64: [8]byte{0xe0, 1, 2, 3, 4, 5, 6, 0xe7},
	}
	ns.NVMCAP[0] = 0x55
	ns.LBAF[0] = LBAFormat{LBADS: 9}
	ns.LBAF[1] = LBAFormat{MS: 8, LBADS: 12, RP: 2}
	var b [IdentifySize]byte
	for i := range b {
		b[i] = 0xEE
	}
	ns.Marshal(&b)
	equalBytes(t, "nsze..nuse", b[0:24], hexBytes(t,
		"08 07 06 05 04 03 02 01 | 02 00 00 00 00 00 00 00 | 03 00 00 00 00 00 00 00"))
	equalBytes(t, "nsfeat..dlfeat", b[24:34], hexBytes(t, "01 01 01 04 05 06 01 07 08 09"))
	equalBytes(t, "nawun..noiob", b[34:48], hexBytes(t, "09 00 0a 00 0b 00 0c 00 0d 00 0e 00 0f 00"))
	if b[48] != 0x55 {
		t.Errorf("nvmcap at 48: %#x", b[48])
	}
	equalBytes(t, "npwg..nows", b[64:74], hexBytes(t, "10 00 11 00 12 00 13 00 14 00"))
	equalBytes(t, "anagrpid", b[92:96], hexBytes(t, "15 00 00 00"))
	equalBytes(t, "nsattr..endgid", b[99:104], hexBytes(t, "01 16 00 17 00"))
	if b[104] != 0xa0 || b[119] != 0xaf || b[120] != 0xe0 || b[127] != 0xe7 {
		t.Errorf("nguid/eui64 %x", b[104:128])
	}
	equalBytes(t, "lbaf0-1", b[128:136], hexBytes(t, "00 00 09 00 | 08 00 0c 02"))
	equalBytes(t, "lbaf2", b[136:140], make([]byte, 4))
	if b[74] != 0 || b[98] != 0 || b[4095] != 0 {
		t.Errorf("reserved not zero")
	}
	var back IdentifyNamespace
	if err := back.Unmarshal(b[:]); err != nil || back != ns {
		t.Fatalf("round trip %v", err)
	}
	if back.FormatIndex() != 1 || back.BlockSize() != 4096 {
		t.Fatalf("format %d size %d", back.FormatIndex(), back.BlockSize())
	}
	if err := back.Unmarshal(b[:4095]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
}

func TestIdentifyCommand(t *testing.T) {
	ic := IdentifyCommand{NSID: 7, CNS: CNSNSDescriptorList, CNTID: 0x1234, CNSSID: 0x55, CSI: CSIZNS, UUID: 3}
	var c Command
	ic.Encode(&c)
	var sqe [SQESize]byte
	_ = c.Marshal(&sqe)
	// struct nvme_identify: nsid 4, cns 40, ctrlid 42, cnssid 44, csi 47.
	if sqe[0] != 0x06 || sqe[4] != 7 || sqe[40] != 3 || binary.LittleEndian.Uint16(sqe[42:]) != 0x1234 ||
		binary.LittleEndian.Uint16(sqe[44:]) != 0x55 || sqe[47] != 2 || sqe[56] != 3 {
		t.Fatalf("layout % x", sqe)
	}
	var back IdentifyCommand
	back.Decode(&c)
	if back != ic {
		t.Fatalf("round trip %+v", back)
	}
}

func TestNSDescriptors(t *testing.T) {
	var b [IdentifySize]byte
	nguid := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	n, err := PutNSDescriptor(b[:], NIDTNGUID, nguid)
	if err != nil || n != 20 {
		t.Fatalf("nguid: %d %v", n, err)
	}
	m, err := PutNSDescriptor(b[n:], NIDTCSI, []byte{CSINVM})
	if err != nil || m != 5 {
		t.Fatalf("csi: %d %v", m, err)
	}
	equalBytes(t, "list", b[:26], hexBytes(t,
		"02 10 00 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f 10 | 04 01 00 00 00 | 00"))
	var got []uint8
	if err := WalkNSDescriptors(b[:], func(nidt uint8, id []byte) { got = append(got, nidt, uint8(len(id))) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0] != 2 || got[1] != 16 || got[2] != 4 || got[3] != 1 {
		t.Fatalf("walk %v", got)
	}
	if _, err := PutNSDescriptor(b[:], NIDTEUI64, nguid); err != ErrNIDLength {
		t.Fatalf("bad len: %v", err)
	}
	if _, err := PutNSDescriptor(b[:10], NIDTNGUID, nguid); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
	bad := []byte{NIDTCSI, 2, 0, 0, 0, 0}
	if err := WalkNSDescriptors(bad, func(uint8, []byte) {}); err != ErrNIDLength {
		t.Fatalf("bad nidl: %v", err)
	}
	over := []byte{NIDTNGUID, 16, 0, 0, 1}
	if err := WalkNSDescriptors(over, func(uint8, []byte) {}); err != ErrNIDLength {
		t.Fatalf("overrun: %v", err)
	}
}

// Offsets pinned against struct nvme_id_ctrl_nvm in include/linux/nvme.h.
func TestIdentifyControllerNVMLayout(t *testing.T) {
	id := IdentifyControllerNVM{VSL: 1, WZSL: 13, WUSL: 3, DMRL: 4, DMRSL: 0x05060708, DMSL: 0x0102030405060708}
	var b [IdentifySize]byte
	for i := range b {
		b[i] = 0xEE
	}
	id.Marshal(&b)
	want := []byte{1, 13, 3, 4, 0x08, 0x07, 0x06, 0x05, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01}
	for i, w := range want {
		if b[i] != w {
			t.Errorf("byte %d = %#x, want %#x", i, b[i], w)
		}
	}
	for i := len(want); i < IdentifySize; i++ {
		if b[i] != 0 {
			t.Fatalf("reserved byte %d = %#x", i, b[i])
		}
	}
	var got IdentifyControllerNVM
	if err := got.Unmarshal(b[:]); err != nil || got != id {
		t.Errorf("round trip: %+v, %v; want %+v", got, err, id)
	}
	if err := got.Unmarshal(b[:15]); err != ErrShortBuffer {
		t.Errorf("15 bytes: %v", err)
	}
}

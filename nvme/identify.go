package nvme

import "encoding/binary"

// IdentifySize is the size of every Identify data structure.
const IdentifySize = 4096

// Special namespace identifiers.
const (
	// NSIDAll (0xFFFFFFFF) names every namespace (Flush, Get Log Page) or
	// none (Identify Namespace, where it is invalid on fabrics).
	NSIDAll uint32 = 0xFFFFFFFF
	// NSIDMax is the largest NSID a namespace can have.
	NSIDMax uint32 = 0xFFFFFFFE
)

// IdentifyCommand holds the fields of an Identify command (opcode 0x06).
//
//	bytes 4-7   NSID
//	CDW10       CNS 7:0, CNTID 31:16
//	CDW11       CNSSID 15:0, CSI 31:24
//	CDW14       UUID index 6:0
type IdentifyCommand struct {
	NSID   uint32
	CNS    uint8
	CNTID  uint16
	CNSSID uint16
	CSI    uint8
	UUID   uint8
}

// Decode reads the Identify fields from c (whatever its opcode).
func (ic *IdentifyCommand) Decode(c *Command) {
	ic.NSID = c.NSID
	ic.CNS = uint8(c.CDW10)
	ic.CNTID = uint16(c.CDW10 >> 16)
	ic.CNSSID = uint16(c.CDW11)
	ic.CSI = uint8(c.CDW11 >> 24)
	ic.UUID = uint8(c.CDW14) & 0x7F
}

// Encode writes the Identify fields into c, leaving the other fields
// (CID, flags, DPTR) as they are.
func (ic *IdentifyCommand) Encode(c *Command) {
	c.Opcode = uint8(AdminIdentify)
	c.NSID = ic.NSID
	c.CDW10 = uint32(ic.CNS) | uint32(ic.CNTID)<<16
	c.CDW11 = uint32(ic.CNSSID) | uint32(ic.CSI)<<24
	c.CDW14 = uint32(ic.UUID & 0x7F)
}

// Controller types (Identify Controller CNTRLTYPE, byte 111).
const (
	CtrlTypeIO        uint8 = 1
	CtrlTypeDiscovery uint8 = 2
	CtrlTypeAdmin     uint8 = 3
)

// CMIC bits (byte 76).
const (
	CMICMultiPort uint8 = 1 << 0
	CMICMultiCtrl uint8 = 1 << 1
	CMICANA       uint8 = 1 << 3
)

// OAES bits (byte 92) and the matching Asynchronous Event Configuration
// feature bits (Set Features 0x0B CDW11).
const (
	AENSMARTMask     uint32 = 0xFF    // SMART / health critical warnings
	AENNSAttr        uint32 = 1 << 8  // namespace attribute changed
	AENFWActivation  uint32 = 1 << 9  // firmware activation starting
	AENTelemetry     uint32 = 1 << 10 // telemetry log changed
	AENANAChange     uint32 = 1 << 11 // ANA change
	AENDiscoveryLogs uint32 = 1 << 31 // discovery log page changed
)

// ANACAP bits (byte 343): the ANA states a controller may report, and how
// its ANA group IDs behave.
const (
	ANACAPOptimized      uint8 = 1 << 0
	ANACAPNonOptimized   uint8 = 1 << 1
	ANACAPInaccessible   uint8 = 1 << 2
	ANACAPPersistentLoss uint8 = 1 << 3
	ANACAPChange         uint8 = 1 << 4
	// ANACAPGroupIDFixed: a namespace's ANAGRPID does not change while it
	// is attached to a controller.
	ANACAPGroupIDFixed uint8 = 1 << 6
	// ANACAPGroupIDMgmt: Namespace Management may set a non-zero ANAGRPID.
	ANACAPGroupIDMgmt uint8 = 1 << 7
)

// CTRATT bits (byte 96).
const (
	CtrAttHostID128 uint32 = 1 << 0  // 128-bit host identifier
	CtrAttTBKAS     uint32 = 1 << 6  // traffic based keep alive
	CtrAttELBAS     uint32 = 1 << 15 // extended LBA formats
)

// LPA bits (byte 261).
const (
	LPASMARTPerNS      uint8 = 1 << 0 // SMART log per namespace
	LPACommandsEffects uint8 = 1 << 1 // Commands Supported and Effects log
	LPAExtendedData    uint8 = 1 << 2 // LPO, NUMDU: extended Get Log Page
)

// ONCS bits (bytes 520-521).
const (
	ONCSCompare      uint16 = 1 << 0
	ONCSWriteUncor   uint16 = 1 << 1
	ONCSDSM          uint16 = 1 << 2
	ONCSWriteZeroes  uint16 = 1 << 3
	ONCSSaveSelect   uint16 = 1 << 4
	ONCSReservations uint16 = 1 << 5
	ONCSTimestamp    uint16 = 1 << 6
	ONCSVerify       uint16 = 1 << 7
)

// VWC bits (byte 525).
const (
	VWCPresent uint8 = 1 << 0
	// VWCFlushAll (bits 2:1 = 11b): a Flush with NSID FFFFFFFFh is
	// supported (10b: not supported; 00b: not indicated).
	VWCFlushAll uint8 = 3 << 1
)

// SGLS bits (bytes 536-539).
const (
	SGLSSupported     uint32 = 1 << 0  // SGLs supported, byte aligned (bits 1:0 = 01)
	SGLSDwordAligned  uint32 = 2 << 0  // bits 1:0 = 10
	SGLSKeyed         uint32 = 1 << 2  // keyed SGL data block descriptor
	SGLSMetaSegment   uint32 = 1 << 19 // MPTR may point at an SGL segment
	SGLSOffset        uint32 = 1 << 20 // address as offset: in-capsule data
	SGLSTransportData uint32 = 1 << 21 // transport SGL data block
)

// Identify Namespace bits.
const (
	NSFeatThin    uint8 = 1 << 0 // NSFEAT: thin provisioning
	NMICShared    uint8 = 1 << 0 // NMIC: may be attached to two or more controllers
	NSAttrRO      uint8 = 1 << 0 // NSATTR: write protected
	DLFeatZeroes  uint8 = 0x01   // DLFEAT bits 2:0: deallocated blocks read as zeroes
	DLFeatWZDEAC  uint8 = 1 << 3 // DLFEAT: Write Zeroes supports DEAC
	DLFeatGuardCR uint8 = 1 << 4 // DLFEAT: guard of deallocated blocks is the CRC
)

// PowerState is one 32-byte power state descriptor (PSD0 at byte 2048).
//
//	bytes 0-1 MP (centiwatts), 3 flags, 4-7 ENLAT (µs), 8-11 EXLAT (µs),
//	12 RRT, 13 RRL, 14 RWT, 15 RWL
type PowerState struct {
	MaxPower uint16
	Flags    uint8
	EntryLat uint32
	ExitLat  uint32
	RRT      uint8
	RRL      uint8
	RWT      uint8
	RWL      uint8
}

// IdentifyController is the Identify Controller data structure (CNS 0x01)
// with every field a fabrics controller or host uses. Unlisted bytes are
// written as zero and ignored when read. Offsets are those of struct
// nvme_id_ctrl in include/linux/nvme.h.
type IdentifyController struct {
	VID       uint16     // 0
	SSVID     uint16     // 2
	SN        [20]byte   // 4, ASCII space padded (SetASCII)
	MN        [40]byte   // 24
	FR        [8]byte    // 64
	RAB       uint8      // 72
	IEEE      [3]byte    // 73
	CMIC      uint8      // 76
	MDTS      uint8      // 77: 2^MDTS × 4 KiB, 0 = no limit
	CNTLID    uint16     // 78
	VER       Version    // 80
	RTD3R     uint32     // 84
	RTD3E     uint32     // 88
	OAES      uint32     // 92
	CTRATT    uint32     // 96
	CNTRLTYPE uint8      // 111
	FGUID     [16]byte   // 112
	CRDT      [3]uint16  // 128, 130, 132 (100 ms units)
	OACS      uint16     // 256
	ACL       uint8      // 258, 0's based
	AERL      uint8      // 259, 0's based
	FRMW      uint8      // 260
	LPA       uint8      // 261
	ELPE      uint8      // 262, 0's based
	NPSS      uint8      // 263, 0's based
	AVSCC     uint8      // 264
	APSTA     uint8      // 265
	WCTEMP    uint16     // 266, kelvin
	CCTEMP    uint16     // 268, kelvin
	KAS       uint16     // 320, 100 ms units
	ANATT     uint8      // 342, seconds
	ANACAP    uint8      // 343
	ANAGRPMAX uint32     // 344
	NANAGRPID uint32     // 348
	SQES      uint8      // 512
	CQES      uint8      // 513
	MAXCMD    uint16     // 514
	NN        uint32     // 516
	ONCS      uint16     // 520
	FUSES     uint16     // 522
	FNA       uint8      // 524
	VWC       uint8      // 525
	AWUN      uint16     // 526
	AWUPF     uint16     // 528
	NVSCC     uint8      // 530
	NWPC      uint8      // 531
	ACWU      uint16     // 532
	SGLS      uint32     // 536
	MNAN      uint32     // 540
	SubNQN    NQNField   // 768
	IOCCSZ    uint32     // 1792, 16-byte units
	IORCSZ    uint32     // 1796, 16-byte units
	ICDOFF    uint16     // 1800, 16-byte units
	CTRATTR   uint8      // 1802
	MSDBD     uint8      // 1803
	DCTYPE    uint8      // 1806
	PSD0      PowerState // 2048
}

// Marshal writes the structure into b (every byte of b).
func (id *IdentifyController) Marshal(b *[IdentifySize]byte) {
	*b = [IdentifySize]byte{}
	le := binary.LittleEndian
	le.PutUint16(b[0:], id.VID)
	le.PutUint16(b[2:], id.SSVID)
	copy(b[4:24], id.SN[:])
	copy(b[24:64], id.MN[:])
	copy(b[64:72], id.FR[:])
	b[72] = id.RAB
	copy(b[73:76], id.IEEE[:])
	b[76] = id.CMIC
	b[77] = id.MDTS
	le.PutUint16(b[78:], id.CNTLID)
	le.PutUint32(b[80:], uint32(id.VER))
	le.PutUint32(b[84:], id.RTD3R)
	le.PutUint32(b[88:], id.RTD3E)
	le.PutUint32(b[92:], id.OAES)
	le.PutUint32(b[96:], id.CTRATT)
	b[111] = id.CNTRLTYPE
	copy(b[112:128], id.FGUID[:])
	le.PutUint16(b[128:], id.CRDT[0])
	le.PutUint16(b[130:], id.CRDT[1])
	le.PutUint16(b[132:], id.CRDT[2])
	le.PutUint16(b[256:], id.OACS)
	b[258] = id.ACL
	b[259] = id.AERL
	b[260] = id.FRMW
	b[261] = id.LPA
	b[262] = id.ELPE
	b[263] = id.NPSS
	b[264] = id.AVSCC
	b[265] = id.APSTA
	le.PutUint16(b[266:], id.WCTEMP)
	le.PutUint16(b[268:], id.CCTEMP)
	le.PutUint16(b[320:], id.KAS)
	b[342] = id.ANATT
	b[343] = id.ANACAP
	le.PutUint32(b[344:], id.ANAGRPMAX)
	le.PutUint32(b[348:], id.NANAGRPID)
	b[512] = id.SQES
	b[513] = id.CQES
	le.PutUint16(b[514:], id.MAXCMD)
	le.PutUint32(b[516:], id.NN)
	le.PutUint16(b[520:], id.ONCS)
	le.PutUint16(b[522:], id.FUSES)
	b[524] = id.FNA
	b[525] = id.VWC
	le.PutUint16(b[526:], id.AWUN)
	le.PutUint16(b[528:], id.AWUPF)
	b[530] = id.NVSCC
	b[531] = id.NWPC
	le.PutUint16(b[532:], id.ACWU)
	le.PutUint32(b[536:], id.SGLS)
	le.PutUint32(b[540:], id.MNAN)
	copy(b[768:1024], id.SubNQN[:])
	le.PutUint32(b[1792:], id.IOCCSZ)
	le.PutUint32(b[1796:], id.IORCSZ)
	le.PutUint16(b[1800:], id.ICDOFF)
	b[1802] = id.CTRATTR
	b[1803] = id.MSDBD
	b[1806] = id.DCTYPE
	id.PSD0.put(b[2048:2080])
}

// Unmarshal reads the structure from the first 4096 bytes of b.
func (id *IdentifyController) Unmarshal(b []byte) error {
	if len(b) < IdentifySize {
		return ErrShortBuffer
	}
	le := binary.LittleEndian
	id.VID = le.Uint16(b[0:])
	id.SSVID = le.Uint16(b[2:])
	copy(id.SN[:], b[4:24])
	copy(id.MN[:], b[24:64])
	copy(id.FR[:], b[64:72])
	id.RAB = b[72]
	copy(id.IEEE[:], b[73:76])
	id.CMIC = b[76]
	id.MDTS = b[77]
	id.CNTLID = le.Uint16(b[78:])
	id.VER = Version(le.Uint32(b[80:]))
	id.RTD3R = le.Uint32(b[84:])
	id.RTD3E = le.Uint32(b[88:])
	id.OAES = le.Uint32(b[92:])
	id.CTRATT = le.Uint32(b[96:])
	id.CNTRLTYPE = b[111]
	copy(id.FGUID[:], b[112:128])
	id.CRDT = [3]uint16{le.Uint16(b[128:]), le.Uint16(b[130:]), le.Uint16(b[132:])}
	id.OACS = le.Uint16(b[256:])
	id.ACL = b[258]
	id.AERL = b[259]
	id.FRMW = b[260]
	id.LPA = b[261]
	id.ELPE = b[262]
	id.NPSS = b[263]
	id.AVSCC = b[264]
	id.APSTA = b[265]
	id.WCTEMP = le.Uint16(b[266:])
	id.CCTEMP = le.Uint16(b[268:])
	id.KAS = le.Uint16(b[320:])
	id.ANATT = b[342]
	id.ANACAP = b[343]
	id.ANAGRPMAX = le.Uint32(b[344:])
	id.NANAGRPID = le.Uint32(b[348:])
	id.SQES = b[512]
	id.CQES = b[513]
	id.MAXCMD = le.Uint16(b[514:])
	id.NN = le.Uint32(b[516:])
	id.ONCS = le.Uint16(b[520:])
	id.FUSES = le.Uint16(b[522:])
	id.FNA = b[524]
	id.VWC = b[525]
	id.AWUN = le.Uint16(b[526:])
	id.AWUPF = le.Uint16(b[528:])
	id.NVSCC = b[530]
	id.NWPC = b[531]
	id.ACWU = le.Uint16(b[532:])
	id.SGLS = le.Uint32(b[536:])
	id.MNAN = le.Uint32(b[540:])
	copy(id.SubNQN[:], b[768:1024])
	id.IOCCSZ = le.Uint32(b[1792:])
	id.IORCSZ = le.Uint32(b[1796:])
	id.ICDOFF = le.Uint16(b[1800:])
	id.CTRATTR = b[1802]
	id.MSDBD = b[1803]
	id.DCTYPE = b[1806]
	id.PSD0.get(b[2048:2080])
	return nil
}

func (p *PowerState) put(b []byte) {
	_ = b[31]
	binary.LittleEndian.PutUint16(b[0:], p.MaxPower)
	b[3] = p.Flags
	binary.LittleEndian.PutUint32(b[4:], p.EntryLat)
	binary.LittleEndian.PutUint32(b[8:], p.ExitLat)
	b[12], b[13], b[14], b[15] = p.RRT, p.RRL, p.RWT, p.RWL
}

func (p *PowerState) get(b []byte) {
	_ = b[31]
	p.MaxPower = binary.LittleEndian.Uint16(b[0:])
	p.Flags = b[3]
	p.EntryLat = binary.LittleEndian.Uint32(b[4:])
	p.ExitLat = binary.LittleEndian.Uint32(b[8:])
	p.RRT, p.RRL, p.RWT, p.RWL = b[12], b[13], b[14], b[15]
}

// SetASCII copies s into dst and pads the rest with spaces, as the
// Identify Controller SN, MN and FR fields require. It fails with
// ErrFieldTooLong if s does not fit, and with ErrNotASCII if s holds a
// byte outside printable ASCII (0x20-0x7E).
func SetASCII(dst []byte, s string) error {
	if len(s) > len(dst) {
		return ErrFieldTooLong
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7E {
			return ErrNotASCII
		}
	}
	n := copy(dst, s)
	for i := n; i < len(dst); i++ {
		dst[i] = ' '
	}
	return nil
}

// TrimASCII returns the contents of a space (or NUL) padded ASCII field.
func TrimASCII(b []byte) string {
	n := len(b)
	for n > 0 && (b[n-1] == ' ' || b[n-1] == 0) {
		n--
	}
	return string(b[:n])
}

// LBAFormat is one LBA format descriptor of Identify Namespace.
//
//	bits 15:0 MS (metadata bytes per LBA), 23:16 LBADS (log2 of the LBA
//	data size), 25:24 RP (relative performance)
type LBAFormat struct {
	MS    uint16
	LBADS uint8
	RP    uint8
}

// MaxLBAFormats is the number of LBA format descriptors in Identify
// Namespace (bytes 128-383).
const MaxLBAFormats = 64

// IdentifyNamespace is the Identify Namespace data structure for the NVM
// command set (CNS 0x00). Offsets are those of struct nvme_id_ns in
// include/linux/nvme.h.
type IdentifyNamespace struct {
	NSZE     uint64   // 0, blocks
	NCAP     uint64   // 8, blocks; 0 = not allocated
	NUSE     uint64   // 16, blocks
	NSFEAT   uint8    // 24
	NLBAF    uint8    // 25, 0's based
	FLBAS    uint8    // 26
	MC       uint8    // 27
	DPC      uint8    // 28
	DPS      uint8    // 29
	NMIC     uint8    // 30
	RESCAP   uint8    // 31
	FPI      uint8    // 32
	DLFEAT   uint8    // 33
	NAWUN    uint16   // 34
	NAWUPF   uint16   // 36
	NACWU    uint16   // 38
	NABSN    uint16   // 40
	NABO     uint16   // 42
	NABSPF   uint16   // 44
	NOIOB    uint16   // 46
	NVMCAP   [16]byte // 48
	NPWG     uint16   // 64
	NPWA     uint16   // 66
	NPDG     uint16   // 68
	NPDA     uint16   // 70
	NOWS     uint16   // 72
	ANAGRPID uint32   // 92
	NSATTR   uint8    // 99
	NVMSETID uint16   // 100
	ENDGID   uint16   // 102
	NGUID    [16]byte // 104
	EUI64    [8]byte  // 120
	LBAF     [MaxLBAFormats]LBAFormat
}

// Marshal writes the structure into b (every byte of b).
func (ns *IdentifyNamespace) Marshal(b *[IdentifySize]byte) {
	*b = [IdentifySize]byte{}
	le := binary.LittleEndian
	le.PutUint64(b[0:], ns.NSZE)
	le.PutUint64(b[8:], ns.NCAP)
	le.PutUint64(b[16:], ns.NUSE)
	b[24], b[25], b[26], b[27] = ns.NSFEAT, ns.NLBAF, ns.FLBAS, ns.MC
	b[28], b[29], b[30], b[31] = ns.DPC, ns.DPS, ns.NMIC, ns.RESCAP
	b[32], b[33] = ns.FPI, ns.DLFEAT
	le.PutUint16(b[34:], ns.NAWUN)
	le.PutUint16(b[36:], ns.NAWUPF)
	le.PutUint16(b[38:], ns.NACWU)
	le.PutUint16(b[40:], ns.NABSN)
	le.PutUint16(b[42:], ns.NABO)
	le.PutUint16(b[44:], ns.NABSPF)
	le.PutUint16(b[46:], ns.NOIOB)
	copy(b[48:64], ns.NVMCAP[:])
	le.PutUint16(b[64:], ns.NPWG)
	le.PutUint16(b[66:], ns.NPWA)
	le.PutUint16(b[68:], ns.NPDG)
	le.PutUint16(b[70:], ns.NPDA)
	le.PutUint16(b[72:], ns.NOWS)
	le.PutUint32(b[92:], ns.ANAGRPID)
	b[99] = ns.NSATTR
	le.PutUint16(b[100:], ns.NVMSETID)
	le.PutUint16(b[102:], ns.ENDGID)
	copy(b[104:120], ns.NGUID[:])
	copy(b[120:128], ns.EUI64[:])
	for i, f := range ns.LBAF {
		le.PutUint32(b[128+4*i:], f.word())
	}
}

// Unmarshal reads the structure from the first 4096 bytes of b.
func (ns *IdentifyNamespace) Unmarshal(b []byte) error {
	if len(b) < IdentifySize {
		return ErrShortBuffer
	}
	le := binary.LittleEndian
	ns.NSZE = le.Uint64(b[0:])
	ns.NCAP = le.Uint64(b[8:])
	ns.NUSE = le.Uint64(b[16:])
	ns.NSFEAT, ns.NLBAF, ns.FLBAS, ns.MC = b[24], b[25], b[26], b[27]
	ns.DPC, ns.DPS, ns.NMIC, ns.RESCAP = b[28], b[29], b[30], b[31]
	ns.FPI, ns.DLFEAT = b[32], b[33]
	ns.NAWUN = le.Uint16(b[34:])
	ns.NAWUPF = le.Uint16(b[36:])
	ns.NACWU = le.Uint16(b[38:])
	ns.NABSN = le.Uint16(b[40:])
	ns.NABO = le.Uint16(b[42:])
	ns.NABSPF = le.Uint16(b[44:])
	ns.NOIOB = le.Uint16(b[46:])
	copy(ns.NVMCAP[:], b[48:64])
	ns.NPWG = le.Uint16(b[64:])
	ns.NPWA = le.Uint16(b[66:])
	ns.NPDG = le.Uint16(b[68:])
	ns.NPDA = le.Uint16(b[70:])
	ns.NOWS = le.Uint16(b[72:])
	ns.ANAGRPID = le.Uint32(b[92:])
	ns.NSATTR = b[99]
	ns.NVMSETID = le.Uint16(b[100:])
	ns.ENDGID = le.Uint16(b[102:])
	copy(ns.NGUID[:], b[104:120])
	copy(ns.EUI64[:], b[120:128])
	for i := range ns.LBAF {
		w := le.Uint32(b[128+4*i:])
		ns.LBAF[i] = LBAFormat{MS: uint16(w), LBADS: uint8(w >> 16), RP: uint8(w>>24) & 3}
	}
	return nil
}

func (f LBAFormat) word() uint32 {
	return uint32(f.MS) | uint32(f.LBADS)<<16 | uint32(f.RP&3)<<24
}

// FormatIndex returns the LBA format in use: FLBAS bits 3:0, extended by
// bits 6:5 when there are more than 16 formats.
func (ns *IdentifyNamespace) FormatIndex() int {
	return int(ns.FLBAS&0x0F) | int(ns.FLBAS&0x60)>>1
}

// BlockSize returns the LBA data size of the format in use, in bytes, or 0
// if LBADS is out of the range a host can use (9-31).
func (ns *IdentifyNamespace) BlockSize() uint32 {
	ds := ns.LBAF[ns.FormatIndex()&(MaxLBAFormats-1)].LBADS
	if ds < 9 || ds > 31 {
		return 0
	}
	return 1 << ds
}

// IdentifyControllerNVM is the I/O Command Set Specific Identify
// Controller data structure for the NVM command set (CNS 0x06, CSI 0x00;
// struct nvme_id_ctrl_nvm in include/linux/nvme.h). The size limits are
// powers of two in units of the minimum memory page size (CAP.MPSMIN),
// like MDTS; 0 means no limit, or not reported.
//
//	byte 0 VSL, 1 WZSL, 2 WUSL, 3 DMRL, bytes 4-7 DMRSL, 8-15 DMSL
type IdentifyControllerNVM struct {
	VSL   uint8  // Verify Size Limit
	WZSL  uint8  // Write Zeroes Size Limit
	WUSL  uint8  // Write Uncorrectable Size Limit
	DMRL  uint8  // Dataset Management Ranges Limit (ranges per command)
	DMRSL uint32 // Dataset Management Range Size Limit (blocks per range)
	DMSL  uint64 // Dataset Management Size Limit (blocks per command)
}

// Marshal writes the structure into b (every byte of b).
func (id *IdentifyControllerNVM) Marshal(b *[IdentifySize]byte) {
	*b = [IdentifySize]byte{}
	b[0], b[1], b[2], b[3] = id.VSL, id.WZSL, id.WUSL, id.DMRL
	binary.LittleEndian.PutUint32(b[4:], id.DMRSL)
	binary.LittleEndian.PutUint64(b[8:], id.DMSL)
}

// Unmarshal reads the structure from the first 16 bytes of b.
func (id *IdentifyControllerNVM) Unmarshal(b []byte) error {
	if len(b) < 16 {
		return ErrShortBuffer
	}
	id.VSL, id.WZSL, id.WUSL, id.DMRL = b[0], b[1], b[2], b[3]
	id.DMRSL = binary.LittleEndian.Uint32(b[4:])
	id.DMSL = binary.LittleEndian.Uint64(b[8:])
	return nil
}

// Namespace identification descriptor types (Identify CNS 0x03).
const (
	NIDTEUI64 uint8 = 0x01
	NIDTNGUID uint8 = 0x02
	NIDTUUID  uint8 = 0x03
	NIDTCSI   uint8 = 0x04
)

// Command set identifiers.
const (
	CSINVM uint8 = 0x00
	CSIZNS uint8 = 0x02
)

// NIDLength returns the identifier length of a descriptor type, or 0 for
// an unknown type.
func NIDLength(nidt uint8) int {
	switch nidt {
	case NIDTEUI64:
		return 8
	case NIDTNGUID, NIDTUUID:
		return 16
	case NIDTCSI:
		return 1
	}
	return 0
}

// PutNSDescriptor writes one namespace identification descriptor (NIDT,
// NIDL, two reserved bytes, then the identifier) at the start of b and
// returns its length. It fails with ErrShortBuffer if b is too small and
// with ErrNIDLength if id does not have the length the type requires.
func PutNSDescriptor(b []byte, nidt uint8, id []byte) (int, error) {
	if n := NIDLength(nidt); n == 0 || n != len(id) {
		return 0, ErrNIDLength
	}
	if len(b) < 4+len(id) {
		return 0, ErrShortBuffer
	}
	b[0], b[1], b[2], b[3] = nidt, uint8(len(id)), 0, 0
	copy(b[4:], id)
	return 4 + len(id), nil
}

// WalkNSDescriptors calls fn for each descriptor of a namespace
// identification descriptor list, up to the first with NIDL 0 or the end
// of b. A descriptor running past the end of b, or a known type with the
// wrong NIDL, stops the walk with ErrNIDLength (the Linux host stops
// parsing there too).
func WalkNSDescriptors(b []byte, fn func(nidt uint8, id []byte)) error {
	for off := 0; off+4 <= len(b); {
		nidt, nidl := b[off], int(b[off+1])
		if nidl == 0 {
			return nil
		}
		if off+4+nidl > len(b) {
			return ErrNIDLength
		}
		if n := NIDLength(nidt); n != 0 && n != nidl {
			return ErrNIDLength
		}
		fn(nidt, b[off+4:off+4+nidl])
		off += 4 + nidl
	}
	return nil
}

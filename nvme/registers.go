package nvme

// CAP is the Controller Capabilities property (offset 0x00, 8 bytes).
//
//	MQES 15:0 (0's based), CQR 16, AMS 18:17, TO 31:24 (500 ms units),
//	DSTRD 35:32, NSSRS 36, CSS 44:37, BPS 45, MPSMIN 51:48, MPSMAX 55:52,
//	PMRS 56, CMBS 57, NSSS 58, CRWMS 59, CRIMS 60
type CAP uint64

// CAP.CSS bits (CSS field, i.e. CAP bits 44:37 shifted down).
const (
	CAPCSSNVM    uint8 = 1 << 0 // NVM command set (CAP bit 37)
	CAPCSSIOCS   uint8 = 1 << 6 // one or more I/O command sets (CAP bit 43)
	CAPCSSNoIOCS uint8 = 1 << 7 // no I/O command set (CAP bit 44)
)

// CAP single-bit flags.
const (
	CAPCQR   CAP = 1 << 16
	CAPNSSRS CAP = 1 << 36
	CAPCRWMS CAP = 1 << 59
	CAPCRIMS CAP = 1 << 60
)

// CAPFields are the CAP fields a fabrics controller sets.
type CAPFields struct {
	MQES   uint16 // maximum queue entries, 0's based
	CQR    bool   // contiguous queues required
	AMS    uint8  // arbitration mechanisms supported, 2 bits
	TO     uint8  // ready timeout in 500 ms units
	DSTRD  uint8  // doorbell stride, 4 bits
	NSSRS  bool   // NVM subsystem reset supported
	CSS    uint8  // command sets supported (CAPCSS*)
	MPSMIN uint8  // minimum memory page size, 2^(12+MPSMIN); Linux needs 0
	MPSMAX uint8  // maximum memory page size
	CRWMS  bool   // controller ready with media support
	CRIMS  bool   // controller ready independent of media support
}

// MakeCAP encodes the fields.
func MakeCAP(f CAPFields) CAP {
	v := CAP(f.MQES) |
		CAP(f.AMS&3)<<17 |
		CAP(f.TO)<<24 |
		CAP(f.DSTRD&0xF)<<32 |
		CAP(f.CSS)<<37 |
		CAP(f.MPSMIN&0xF)<<48 |
		CAP(f.MPSMAX&0xF)<<52
	if f.CQR {
		v |= CAPCQR
	}
	if f.NSSRS {
		v |= CAPNSSRS
	}
	if f.CRWMS {
		v |= CAPCRWMS
	}
	if f.CRIMS {
		v |= CAPCRIMS
	}
	return v
}

// MQES returns maximum queue entries supported, 0's based.
func (c CAP) MQES() uint16 { return uint16(c) }

// CQR reports contiguous queues required.
func (c CAP) CQR() bool { return c&CAPCQR != 0 }

// AMS returns the arbitration mechanisms supported.
func (c CAP) AMS() uint8 { return uint8(c>>17) & 3 }

// TO returns the ready timeout in 500 ms units.
func (c CAP) TO() uint8 { return uint8(c >> 24) }

// DSTRD returns the doorbell stride.
func (c CAP) DSTRD() uint8 { return uint8(c>>32) & 0xF }

// NSSRS reports NVM subsystem reset supported.
func (c CAP) NSSRS() bool { return c&CAPNSSRS != 0 }

// CSS returns the command sets supported field (CAPCSS* bits).
func (c CAP) CSS() uint8 { return uint8(c >> 37) }

// MPSMIN returns the minimum memory page size exponent (2^(12+MPSMIN)).
func (c CAP) MPSMIN() uint8 { return uint8(c>>48) & 0xF }

// MPSMAX returns the maximum memory page size exponent.
func (c CAP) MPSMAX() uint8 { return uint8(c>>52) & 0xF }

// CRWMS reports controller ready with media support.
func (c CAP) CRWMS() bool { return c&CAPCRWMS != 0 }

// CRIMS reports controller ready independent of media support.
func (c CAP) CRIMS() bool { return c&CAPCRIMS != 0 }

// CC is the Controller Configuration property (offset 0x14, 4 bytes).
//
//	EN 0, CSS 6:4, MPS 10:7, AMS 13:11, SHN 15:14, IOSQES 19:16,
//	IOCQES 23:20, CRIME 24
type CC uint32

// CC bits and field values.
const (
	CCEnable CC = 1 << 0
	CCCRIME  CC = 1 << 24

	CCCSSNVM  uint8 = 0 // NVM command set only
	CCCSSCSI  uint8 = 6 // all I/O command sets CAP.CSS reports
	CCCSSNone uint8 = 7 // admin command set only

	ShutdownNone   uint8 = 0
	ShutdownNormal uint8 = 1
	ShutdownAbrupt uint8 = 2
)

// CCFields are the fields of CC.
type CCFields struct {
	EN     bool
	CSS    uint8 // CCCSS*
	MPS    uint8 // memory page size 2^(12+MPS)
	AMS    uint8
	SHN    uint8 // Shutdown*
	IOSQES uint8 // log2 of the I/O SQE size; 6 for NVM
	IOCQES uint8 // log2 of the I/O CQE size; 4 for NVM
	CRIME  bool
}

// MakeCC encodes the fields.
func MakeCC(f CCFields) CC {
	v := CC(f.CSS&7)<<4 |
		CC(f.MPS&0xF)<<7 |
		CC(f.AMS&7)<<11 |
		CC(f.SHN&3)<<14 |
		CC(f.IOSQES&0xF)<<16 |
		CC(f.IOCQES&0xF)<<20
	if f.EN {
		v |= CCEnable
	}
	if f.CRIME {
		v |= CCCRIME
	}
	return v
}

// EN reports the enable bit.
func (c CC) EN() bool { return c&CCEnable != 0 }

// CSS returns the I/O command set selected.
func (c CC) CSS() uint8 { return uint8(c>>4) & 7 }

// MPS returns the memory page size exponent.
func (c CC) MPS() uint8 { return uint8(c>>7) & 0xF }

// AMS returns the arbitration mechanism selected.
func (c CC) AMS() uint8 { return uint8(c>>11) & 7 }

// SHN returns the shutdown notification (Shutdown*).
func (c CC) SHN() uint8 { return uint8(c>>14) & 3 }

// IOSQES returns log2 of the I/O submission queue entry size.
func (c CC) IOSQES() uint8 { return uint8(c>>16) & 0xF }

// IOCQES returns log2 of the I/O completion queue entry size.
func (c CC) IOCQES() uint8 { return uint8(c>>20) & 0xF }

// CRIME reports controller ready independent of media enable.
func (c CC) CRIME() bool { return c&CCCRIME != 0 }

// CSTS is the Controller Status property (offset 0x1C, 4 bytes).
//
//	RDY 0, CFS 1, SHST 3:2, NSSRO 4, PP 5
type CSTS uint32

// CSTS bits and shutdown status values.
const (
	CSTSReady CSTS = 1 << 0
	CSTSCFS   CSTS = 1 << 1
	CSTSNSSRO CSTS = 1 << 4
	CSTSPP    CSTS = 1 << 5

	ShutdownStatusNormal    uint8 = 0 // normal operation
	ShutdownStatusOccurring uint8 = 1 // shutdown processing occurring
	ShutdownStatusComplete  uint8 = 2 // shutdown processing complete
	cstsSHSTShift                 = 2
	cstsSHSTMask            CSTS  = 3 << cstsSHSTShift
)

// MakeCSTS encodes CSTS from its ready bit, fatal status bit and shutdown
// status (ShutdownStatus*).
func MakeCSTS(rdy, cfs bool, shst uint8) CSTS {
	v := CSTS(shst&3) << cstsSHSTShift
	if rdy {
		v |= CSTSReady
	}
	if cfs {
		v |= CSTSCFS
	}
	return v
}

// RDY reports ready.
func (c CSTS) RDY() bool { return c&CSTSReady != 0 }

// CFS reports controller fatal status.
func (c CSTS) CFS() bool { return c&CSTSCFS != 0 }

// SHST returns the shutdown status (ShutdownStatus*).
func (c CSTS) SHST() uint8 { return uint8(c&cstsSHSTMask) >> cstsSHSTShift }

// NSSRO reports NVM subsystem reset occurred.
func (c CSTS) NSSRO() bool { return c&CSTSNSSRO != 0 }

// WithSHST returns c with the shutdown status replaced.
func (c CSTS) WithSHST(shst uint8) CSTS {
	return c&^cstsSHSTMask | CSTS(shst&3)<<cstsSHSTShift
}

// Version is the VS property (offset 0x08): major 31:16, minor 15:8,
// tertiary 7:0.
type Version uint32

// MakeVersion encodes a version.
func MakeVersion(major uint16, minor, tertiary uint8) Version {
	return Version(uint32(major)<<16 | uint32(minor)<<8 | uint32(tertiary))
}

// Major returns the major version.
func (v Version) Major() uint16 { return uint16(v >> 16) }

// Minor returns the minor version.
func (v Version) Minor() uint8 { return uint8(v >> 8) }

// Tertiary returns the tertiary version.
func (v Version) Tertiary() uint8 { return uint8(v) }

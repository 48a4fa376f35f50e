package nvme

import "encoding/binary"

// Reservation commands (NVMe base specification 2.0, §7.3-7.6 and the NVM
// command set's "Reservations"): the CDW10 fields of Register (0Dh),
// Acquire (11h), Release (15h) and Report (0Eh), their 16- or 8-byte data,
// the Reservation Notification log entry (log page 80h), and the feature
// identifiers 82h and 83h. The rules live in nvme/resv; this file is the
// wire only.
//
//	Register CDW10: RREGA 2:0, IEKEY 3, DISNSRS 4, CPTPL 31:30
//	Acquire  CDW10: RACQA 2:0, IEKEY 3, DISNSRS 4, RTYPE 15:8
//	Release  CDW10: RRELA 2:0, IEKEY 3, DISNSRS 4, RTYPE 15:8
//	Report   CDW10: NUMD (0's based dwords); CDW11: EDS 0
const (
	ResvActionMask uint32 = 0x7
	ResvIEKEY      uint32 = 1 << 3
	ResvDISNSRS    uint32 = 1 << 4
	ResvRTypeShift        = 8
	ResvCPTPLShift        = 30
	// ResvReportEDS is CDW11 bit 0 of Reservation Report: the extended
	// (128-bit host identifier) data structure.
	ResvReportEDS uint32 = 1 << 0
)

// Register actions (RREGA), Acquire actions (RACQA), Release actions
// (RRELA).
const (
	RREGARegister   uint8 = 0
	RREGAUnregister uint8 = 1
	RREGAReplace    uint8 = 2

	RACQAAcquire         uint8 = 0
	RACQAPreempt         uint8 = 1
	RACQAPreemptAndAbort uint8 = 2

	RRELARelease uint8 = 0
	RRELAClear   uint8 = 1
)

// Change Persist Through Power Loss (Register CPTPL).
const (
	CPTPLNoChange uint8 = 0 // 00b
	CPTPLClear    uint8 = 2 // 10b: PTPL 0
	CPTPLSet      uint8 = 3 // 11b: PTPL 1
)

// Reservation feature and log identifiers.
const (
	FeatureResvMask     uint8 = 0x82 // Reservation Notification Mask
	FeatureResvPersist  uint8 = 0x83 // Reservation Persistence (PTPL, CDW11 bit 0)
	LogResvNotification uint8 = 0x80
)

// Reservation Notification Mask bits (feature 82h CDW11): a set bit hides
// that notice kind from the controller's log.
const (
	ResvMaskRegPreempted  uint32 = 1 << 1 // REGPRE
	ResvMaskResvReleased  uint32 = 1 << 2 // RESREL
	ResvMaskResvPreempted uint32 = 1 << 3 // RESPRE
)

// ResvAction returns CDW10 bits 2:0 (RREGA, RACQA or RRELA).
func (c *Command) ResvAction() uint8 { return uint8(c.CDW10 & ResvActionMask) }

// ResvIEKEY reports CDW10 bit 3, Ignore Existing Key.
func (c *Command) ResvIEKEY() bool { return c.CDW10&ResvIEKEY != 0 }

// ResvType returns CDW10 bits 15:8 (RTYPE) of Acquire and Release.
func (c *Command) ResvType() uint8 { return uint8(c.CDW10 >> ResvRTypeShift) }

// ResvCPTPL returns CDW10 bits 31:30 (CPTPL) of Register.
func (c *Command) ResvCPTPL() uint8 { return uint8(c.CDW10 >> ResvCPTPLShift) }

// ResvReportEDS reports Reservation Report's CDW11 bit 0.
func (c *Command) ResvReportEDS() bool { return c.CDW11&ResvReportEDS != 0 }

// ResvReportLength returns the Report's data length in bytes,
// (NUMD+1)*4.
func (c *Command) ResvReportLength() uint64 { return (uint64(c.CDW10) + 1) * 4 }

// SetResv fills CDW10 of Register, Acquire or Release: the action, IEKEY,
// RTYPE (Acquire, Release; 0 for Register) and CPTPL (Register; 0
// otherwise).
func (c *Command) SetResv(action uint8, iekey bool, rtype, cptpl uint8) {
	c.CDW10 = uint32(action)&ResvActionMask | uint32(rtype)<<ResvRTypeShift | uint32(cptpl&3)<<ResvCPTPLShift
	if iekey {
		c.CDW10 |= ResvIEKEY
	}
}

// ResvDataSize is the data length of Register and Acquire (two keys);
// Release carries ResvReleaseDataSize (one key).
const (
	ResvDataSize        = 16
	ResvReleaseDataSize = 8
)

// ResvKeys is the data of Register (CRKEY, NRKEY), Acquire (CRKEY, PRKEY)
// and Release (CRKEY; Key2 absent).
//
//	bytes 0-7   CRKEY
//	bytes 8-15  NRKEY (Register) or PRKEY (Acquire)
type ResvKeys struct {
	CRKEY uint64
	Key2  uint64
}

// Marshal writes both keys into b.
func (k *ResvKeys) Marshal(b *[ResvDataSize]byte) {
	binary.LittleEndian.PutUint64(b[0:], k.CRKEY)
	binary.LittleEndian.PutUint64(b[8:], k.Key2)
}

// Unmarshal reads CRKEY and, when b holds 16 bytes, the second key.
// Release's 8 bytes leave Key2 zero; fewer than 8 is ErrShortBuffer.
func (k *ResvKeys) Unmarshal(b []byte) error {
	if len(b) < ResvReleaseDataSize {
		return ErrShortBuffer
	}
	k.CRKEY = binary.LittleEndian.Uint64(b[0:])
	k.Key2 = 0
	if len(b) >= ResvDataSize {
		k.Key2 = binary.LittleEndian.Uint64(b[8:])
	}
	return nil
}

// Reservation Status extended data structure (Report with EDS 1): a
// 64-byte header then 64 bytes per registrant.
//
//	header: bytes 0-3 GEN, 4 RTYPE, 5-6 REGCTL, 9 PTPLS, the rest reserved
//	entry:  bytes 0-1 CNTLID, 2 RCSTS (bit 0: holds the reservation),
//	        8-15 RKEY, 16-31 HOSTID (128 bits), the rest reserved
const (
	ResvStatusHeaderSize = 64
	ResvStatusEntrySize  = 64
	// ResvCNTLIDNone is the CNTLID of a registrant not tied to one
	// controller (a registration is a host's).
	ResvCNTLIDNone uint16 = 0xFFFF
)

// Reservation Notification log page types (byte 8 of an entry).
const (
	ResvNotifEmpty                 uint8 = 0
	ResvNotifRegistrationPreempted uint8 = 1
	ResvNotifReservationReleased   uint8 = 2
	ResvNotifReservationPreempted  uint8 = 3
)

// ResvNotifLogSize is the size of the Reservation Notification log page.
const ResvNotifLogSize = 64

// ResvNotifLog is the Reservation Notification log page (80h).
//
//	bytes 0-7   Log Page Count (0: the log is empty)
//	byte  8     Reservation Notification Log Page Type
//	byte  9     Number of Available Log Pages (after this one, ≤ 255)
//	bytes 12-15 NSID
type ResvNotifLog struct {
	Count     uint64
	Type      uint8
	Available uint8
	NSID      uint32
}

// Marshal writes the page into b.
func (l *ResvNotifLog) Marshal(b *[ResvNotifLogSize]byte) {
	*b = [ResvNotifLogSize]byte{}
	binary.LittleEndian.PutUint64(b[0:], l.Count)
	b[8] = l.Type
	b[9] = l.Available
	binary.LittleEndian.PutUint32(b[12:], l.NSID)
}

// Unmarshal reads the page from the first 64 bytes of b.
func (l *ResvNotifLog) Unmarshal(b []byte) error {
	if len(b) < ResvNotifLogSize {
		return ErrShortBuffer
	}
	l.Count = binary.LittleEndian.Uint64(b[0:])
	l.Type = b[8]
	l.Available = b[9]
	l.NSID = binary.LittleEndian.Uint32(b[12:])
	return nil
}

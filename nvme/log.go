package nvme

import "encoding/binary"

// GetLogPageCommand holds the fields of a Get Log Page command (opcode
// 0x02).
//
//	bytes 4-7 NSID
//	CDW10     LID 7:0, LSP 14:8, RAE 15, NUMDL 31:16
//	CDW11     NUMDU 15:0, LSI 31:16
//	CDW12-13  LPO (byte offset, dword aligned)
//	CDW14     UUID index 6:0, OT 23, CSI 31:24
//
// NUMD is 0's based: the transfer is (NUMD+1)×4 bytes.
type GetLogPageCommand struct {
	NSID uint32
	LID  uint8
	LSP  uint8
	RAE  bool
	NUMD uint32
	LSI  uint16
	LPO  uint64
	UUID uint8
	OT   bool
	CSI  uint8
}

// Decode reads the Get Log Page fields from c (whatever its opcode).
func (g *GetLogPageCommand) Decode(c *Command) {
	g.NSID = c.NSID
	g.LID = uint8(c.CDW10)
	g.LSP = uint8(c.CDW10>>8) & 0x7F
	g.RAE = c.CDW10&(1<<15) != 0
	g.NUMD = c.CDW10>>16 | (c.CDW11&0xFFFF)<<16
	g.LSI = uint16(c.CDW11 >> 16)
	g.LPO = uint64(c.CDW12) | uint64(c.CDW13)<<32
	g.UUID = uint8(c.CDW14) & 0x7F
	g.OT = c.CDW14&(1<<23) != 0
	g.CSI = uint8(c.CDW14 >> 24)
}

// Encode writes the Get Log Page fields into c, leaving the other fields
// (CID, flags, DPTR) as they are.
func (g *GetLogPageCommand) Encode(c *Command) {
	c.Opcode = uint8(AdminGetLogPage)
	c.NSID = g.NSID
	c.CDW10 = uint32(g.LID) | uint32(g.LSP&0x7F)<<8 | (g.NUMD&0xFFFF)<<16
	if g.RAE {
		c.CDW10 |= 1 << 15
	}
	c.CDW11 = g.NUMD>>16 | uint32(g.LSI)<<16
	c.CDW12 = uint32(g.LPO)
	c.CDW13 = uint32(g.LPO >> 32)
	c.CDW14 = uint32(g.UUID&0x7F) | uint32(g.CSI)<<24
	if g.OT {
		c.CDW14 |= 1 << 23
	}
}

// Length returns the transfer length in bytes, (NUMD+1)×4.
func (g *GetLogPageCommand) Length() uint64 { return (uint64(g.NUMD) + 1) * 4 }

// LogNUMD returns the 0's based dword count that asks for n bytes (n a
// positive multiple of 4).
func LogNUMD(n uint32) uint32 { return n/4 - 1 }

// ErrorLogEntrySize is the size of one Error Information log entry.
const ErrorLogEntrySize = 64

// ErrorLogEntry is one entry of the Error Information log page (LID
// 0x01), as struct nvme_error_slot in include/linux/nvme.h.
//
//	bytes 0-7   error count (unique, increasing; 0 = empty entry)
//	bytes 8-9   SQID
//	bytes 10-11 CID
//	bytes 12-13 status field (the CQE status word: phase bit 0, status 15:1)
//	bytes 14-15 parameter error location (byte 7:0, bit 10:8; 0xFFFF none)
//	bytes 16-23 LBA
//	bytes 24-27 NSID
//	byte  28    vendor specific information available
//	bytes 32-39 command specific information
//
// Bytes 29 (transport type) and 40-41 (transport specific information)
// are defined by NVMe 1.4 but reserved in the Linux header; they are
// written as zero.
type ErrorLogEntry struct {
	ErrorCount uint64
	SQID       uint16
	CID        uint16
	Status     Status
	ParamLoc   uint16
	LBA        uint64
	NSID       uint32
	VS         uint8
	CS         uint64
}

// ParamLocNone is the parameter error location of an error not tied to a
// command field.
const ParamLocNone uint16 = 0xFFFF

// Marshal writes the entry into b.
func (e *ErrorLogEntry) Marshal(b *[ErrorLogEntrySize]byte) {
	*b = [ErrorLogEntrySize]byte{}
	le := binary.LittleEndian
	le.PutUint64(b[0:], e.ErrorCount)
	le.PutUint16(b[8:], e.SQID)
	le.PutUint16(b[10:], e.CID)
	le.PutUint16(b[12:], e.Status.Wire(false))
	le.PutUint16(b[14:], e.ParamLoc)
	le.PutUint64(b[16:], e.LBA)
	le.PutUint32(b[24:], e.NSID)
	b[28] = e.VS
	le.PutUint64(b[32:], e.CS)
}

// Unmarshal reads the entry from the first 64 bytes of b.
func (e *ErrorLogEntry) Unmarshal(b []byte) error {
	if len(b) < ErrorLogEntrySize {
		return ErrShortBuffer
	}
	le := binary.LittleEndian
	e.ErrorCount = le.Uint64(b[0:])
	e.SQID = le.Uint16(b[8:])
	e.CID = le.Uint16(b[10:])
	e.Status, _ = StatusFromWire(le.Uint16(b[12:]))
	e.ParamLoc = le.Uint16(b[14:])
	e.LBA = le.Uint64(b[16:])
	e.NSID = le.Uint32(b[24:])
	e.VS = b[28]
	e.CS = le.Uint64(b[32:])
	return nil
}

// SMARTLogSize is the size of the SMART / Health Information log page.
const SMARTLogSize = 512

// Uint128 is a 16-byte little-endian counter of the SMART log.
type Uint128 struct{ Lo, Hi uint64 }

// SMART critical warning bits (byte 0).
const (
	SMARTCritSpare       uint8 = 1 << 0
	SMARTCritTemperature uint8 = 1 << 1
	SMARTCritReliability uint8 = 1 << 2
	SMARTCritReadOnly    uint8 = 1 << 3
	SMARTCritVolatileMem uint8 = 1 << 4
)

// SMARTLog is the SMART / Health Information log page (LID 0x02), as
// struct nvme_smart_log in include/linux/nvme.h. Data units are thousands
// of 512-byte units, rounded up.
type SMARTLog struct {
	CriticalWarning  uint8   // 0
	Temperature      uint16  // 1, kelvin
	AvailSpare       uint8   // 3, percent
	SpareThresh      uint8   // 4, percent
	PercentUsed      uint8   // 5
	EnduranceCW      uint8   // 6
	DataUnitsRead    Uint128 // 32
	DataUnitsWritten Uint128 // 48
	HostReads        Uint128 // 64, read commands
	HostWrites       Uint128 // 80, write commands
	CtrlBusyTime     Uint128 // 96, minutes
	PowerCycles      Uint128 // 112
	PowerOnHours     Uint128 // 128
	UnsafeShutdowns  Uint128 // 144
	MediaErrors      Uint128 // 160
	NumErrLogEntries Uint128 // 176
	WarningTempTime  uint32  // 192, minutes
	CriticalTempTime uint32  // 196, minutes
	TempSensor       [8]uint16
}

// Marshal writes the page into b.
func (s *SMARTLog) Marshal(b *[SMARTLogSize]byte) {
	*b = [SMARTLogSize]byte{}
	le := binary.LittleEndian
	b[0] = s.CriticalWarning
	le.PutUint16(b[1:], s.Temperature)
	b[3], b[4], b[5], b[6] = s.AvailSpare, s.SpareThresh, s.PercentUsed, s.EnduranceCW
	for i, v := range [...]Uint128{s.DataUnitsRead, s.DataUnitsWritten, s.HostReads,
		s.HostWrites, s.CtrlBusyTime, s.PowerCycles, s.PowerOnHours,
		s.UnsafeShutdowns, s.MediaErrors, s.NumErrLogEntries} {
		le.PutUint64(b[32+16*i:], v.Lo)
		le.PutUint64(b[40+16*i:], v.Hi)
	}
	le.PutUint32(b[192:], s.WarningTempTime)
	le.PutUint32(b[196:], s.CriticalTempTime)
	for i, v := range s.TempSensor {
		le.PutUint16(b[200+2*i:], v)
	}
}

// Unmarshal reads the page from the first 512 bytes of b.
func (s *SMARTLog) Unmarshal(b []byte) error {
	if len(b) < SMARTLogSize {
		return ErrShortBuffer
	}
	le := binary.LittleEndian
	s.CriticalWarning = b[0]
	s.Temperature = le.Uint16(b[1:])
	s.AvailSpare, s.SpareThresh, s.PercentUsed, s.EnduranceCW = b[3], b[4], b[5], b[6]
	for i, p := range [...]*Uint128{&s.DataUnitsRead, &s.DataUnitsWritten, &s.HostReads,
		&s.HostWrites, &s.CtrlBusyTime, &s.PowerCycles, &s.PowerOnHours,
		&s.UnsafeShutdowns, &s.MediaErrors, &s.NumErrLogEntries} {
		p.Lo = le.Uint64(b[32+16*i:])
		p.Hi = le.Uint64(b[40+16*i:])
	}
	s.WarningTempTime = le.Uint32(b[192:])
	s.CriticalTempTime = le.Uint32(b[196:])
	for i := range s.TempSensor {
		s.TempSensor[i] = le.Uint16(b[200+2*i:])
	}
	return nil
}

// DataUnits converts a byte count into SMART data units: thousands of
// 512-byte units, rounded up (as the Linux target computes them).
func DataUnits(bytes uint64) uint64 {
	sectors := bytes / 512
	if bytes%512 != 0 {
		sectors++
	}
	return (sectors + 999) / 1000
}

// CommandEffectsLogSize is the size of the Commands Supported and Effects
// log page (LID 0x05).
const CommandEffectsLogSize = 4096

// Commands Supported and Effects bits.
const (
	EffectsCSUPP uint32 = 1 << 0 // command supported
	EffectsLBCC  uint32 = 1 << 1 // logical block content change
	EffectsNCC   uint32 = 1 << 2 // namespace capability change
	EffectsNIC   uint32 = 1 << 3 // namespace inventory change
	EffectsCCC   uint32 = 1 << 4 // controller capability change
)

// CommandEffectsLog is the Commands Supported and Effects log page: one
// 32-bit entry per admin opcode (ACS, bytes 0-1023) and per I/O opcode
// (IOCS, bytes 1024-2047), indexed by opcode.
type CommandEffectsLog struct {
	ACS  [256]uint32
	IOCS [256]uint32
}

// Marshal writes the page into b.
func (l *CommandEffectsLog) Marshal(b *[CommandEffectsLogSize]byte) {
	*b = [CommandEffectsLogSize]byte{}
	for i, v := range l.ACS {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	for i, v := range l.IOCS {
		binary.LittleEndian.PutUint32(b[1024+4*i:], v)
	}
}

// Unmarshal reads the page from the first 4096 bytes of b.
func (l *CommandEffectsLog) Unmarshal(b []byte) error {
	if len(b) < CommandEffectsLogSize {
		return ErrShortBuffer
	}
	for i := range l.ACS {
		l.ACS[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	for i := range l.IOCS {
		l.IOCS[i] = binary.LittleEndian.Uint32(b[1024+4*i:])
	}
	return nil
}

// Changed Namespace List log page (LID 0x04): up to 1024 NSIDs, zero
// terminated; the first entry is NSIDAll when more than 1024 changed.
const (
	ChangedNSListSize    = 4096
	MaxChangedNamespaces = 1024
)

// Asynchronous event types (AER completion DW0 bits 2:0).
const (
	AERTypeError   uint8 = 0
	AERTypeSMART   uint8 = 1
	AERTypeNotice  uint8 = 2
	AERTypeCmdSet  uint8 = 6
	AERTypeVendor  uint8 = 7
	AERNoticeNS    uint8 = 0x00 // namespace attribute changed (log 0x04)
	AERNoticeFWAct uint8 = 0x01 // firmware activation starting
	AERNoticeANA   uint8 = 0x03 // ANA change (log 0x0C)
	AERNoticeDisc  uint8 = 0xF0 // discovery log page changed (log 0x70)
)

// AsyncEventResult builds DW0 of an Asynchronous Event Request completion:
// type bits 2:0, information bits 15:8, log page identifier bits 23:16.
func AsyncEventResult(typ, info, lid uint8) uint32 {
	return uint32(typ&7) | uint32(info)<<8 | uint32(lid)<<16
}

// AsyncEvent splits DW0 of an Asynchronous Event Request completion.
func AsyncEvent(dw0 uint32) (typ, info, lid uint8) {
	return uint8(dw0) & 7, uint8(dw0 >> 8), uint8(dw0 >> 16)
}

// ANAState is an Asymmetric Namespace Access state: of an ANA group, as
// the ANA log page (LID 0x0C) reports it for one controller.
type ANAState uint8

// The ANA states. A Linux host sends I/O to optimized paths, then to
// non-optimized ones; inaccessible and persistent-loss paths get none,
// and a path in change state is retried until it leaves it (for at most
// 2 × ANATT, then the host resets the controller).
const (
	ANAOptimized      ANAState = 0x01
	ANANonOptimized   ANAState = 0x02
	ANAInaccessible   ANAState = 0x03
	ANAPersistentLoss ANAState = 0x04
	ANAChange         ANAState = 0x0F
)

// Valid reports whether s is one of the five ANA states.
func (s ANAState) Valid() bool {
	switch s {
	case ANAOptimized, ANANonOptimized, ANAInaccessible, ANAPersistentLoss, ANAChange:
		return true
	}
	return false
}

// IOStatus is the status an I/O command to a namespace in state s gets
// before it reaches storage: success (served) for optimized and
// non-optimized, else the Path Related status of the state, without
// DNR, so that the host retries the command on another path.
func (s ANAState) IOStatus() Status {
	switch s {
	case ANAInaccessible:
		return StatusANAInaccessible
	case ANAPersistentLoss:
		return StatusANAPersistentLoss
	case ANAChange:
		return StatusANATransition
	}
	return StatusSuccess
}

func (s ANAState) String() string {
	switch s {
	case ANAOptimized:
		return "optimized"
	case ANANonOptimized:
		return "non-optimized"
	case ANAInaccessible:
		return "inaccessible"
	case ANAPersistentLoss:
		return "persistent-loss"
	case ANAChange:
		return "change"
	}
	return "ana-state(" + itoa(uint64(s)) + ")"
}

func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}

// ANA log page (LID 0x0C) layout, as struct nvme_ana_rsp_hdr and struct
// nvme_ana_group_desc in include/linux/nvme.h:
//
//	header     bytes 0-7 change count, 8-9 number of descriptors, 10-15 reserved
//	descriptor bytes 0-3 ANA group ID, 4-7 number of NSIDs, 8-15 change
//	           count, 16 state (bits 3:0), 17-31 reserved, then the NSIDs,
//	           4 bytes each, increasing
//
// Descriptors follow each other with no padding (a descriptor of one NSID
// is 36 bytes), as nvmet sends them and nvme_parse_ana_log reads them.
const (
	ANALogHeaderSize = 16
	ANAGroupDescSize = 32
	// ANALogRGO is Get Log Page LSP bit 0 for the ANA log, Return Groups
	// Only: every descriptor with no NSID (Number of NSIDs 0).
	ANALogRGO uint8 = 1 << 0
)

// ANAGroupDesc is one ANA group descriptor.
type ANAGroupDesc struct {
	GroupID     uint32
	ChangeCount uint64
	State       ANAState
	NSIDs       []uint32
}

// ANALog is the Asymmetric Namespace Access log page.
type ANALog struct {
	// ChangeCount counts the ANA changes the controller reported.
	ChangeCount uint64
	Groups      []ANAGroupDesc
}

// Size is the length of the encoded page in bytes.
func (l *ANALog) Size() int {
	n := ANALogHeaderSize
	for i := range l.Groups {
		n += ANAGroupDescSize + 4*len(l.Groups[i].NSIDs)
	}
	return n
}

// Marshal writes the page into the first Size bytes of b (which it
// zeroes first) and returns that size; b shorter than Size is
// ErrShortBuffer.
func (l *ANALog) Marshal(b []byte) (int, error) {
	n := l.Size()
	if len(b) < n {
		return 0, ErrShortBuffer
	}
	clear(b[:n])
	le := binary.LittleEndian
	le.PutUint64(b[0:], l.ChangeCount)
	le.PutUint16(b[8:], uint16(len(l.Groups)))
	off := ANALogHeaderSize
	for i := range l.Groups {
		g := &l.Groups[i]
		le.PutUint32(b[off:], g.GroupID)
		le.PutUint32(b[off+4:], uint32(len(g.NSIDs)))
		le.PutUint64(b[off+8:], g.ChangeCount)
		b[off+16] = uint8(g.State) & 0x0F
		off += ANAGroupDescSize
		for _, id := range g.NSIDs {
			le.PutUint32(b[off:], id)
			off += 4
		}
	}
	return n, nil
}

// Unmarshal reads a page from b (at least its header; b may extend past
// the last descriptor, as a host's buffer of the largest page does).
func (l *ANALog) Unmarshal(b []byte) error {
	if len(b) < ANALogHeaderSize {
		return ErrShortBuffer
	}
	le := binary.LittleEndian
	l.ChangeCount = le.Uint64(b[0:])
	ngrps := int(le.Uint16(b[8:]))
	l.Groups = make([]ANAGroupDesc, 0, min(ngrps, (len(b)-ANALogHeaderSize)/ANAGroupDescSize))
	off := ANALogHeaderSize
	for range ngrps {
		if len(b)-off < ANAGroupDescSize {
			return ErrANALog
		}
		g := ANAGroupDesc{GroupID: le.Uint32(b[off:]), ChangeCount: le.Uint64(b[off+8:]), State: ANAState(b[off+16] & 0x0F)}
		n := uint64(le.Uint32(b[off+4:]))
		off += ANAGroupDescSize
		if n > uint64(len(b)-off)/4 {
			return ErrANALog
		}
		if n > 0 {
			g.NSIDs = make([]uint32, n)
			for i := range g.NSIDs {
				g.NSIDs[i] = le.Uint32(b[off:])
				off += 4
			}
		}
		l.Groups = append(l.Groups, g)
	}
	return nil
}

package nvme

import (
	"bytes"
	"encoding/binary"
)

// ConnectDataSize is the size of the data a Connect command carries.
const ConnectDataSize = 1024

// CNTLID values.
const (
	// CNTLIDDynamic in an admin Connect asks the dynamic controller model
	// for any free controller ID.
	CNTLIDDynamic uint16 = 0xFFFF
	// CNTLIDMin and CNTLIDMax bound the IDs a controller may be given.
	CNTLIDMin uint16 = 1
	CNTLIDMax uint16 = 0xFFEF
)

// Connect CATTR bits (SQE byte 46).
const (
	// ConnectAttrPriorityMask selects the priority class, bits 1:0.
	ConnectAttrPriorityMask uint8 = 0x03
	// ConnectAttrDisableSQFlow asks the controller to disable SQ flow
	// control; completions then carry SQHD 0xFFFF.
	ConnectAttrDisableSQFlow uint8 = 1 << 2
)

// Connect response DW0 AUTHREQ bits (bits 31:16 of DW0).
const (
	ConnectAuthReqATR  uint32 = 1 << 17 // authentication transaction required
	ConnectAuthReqASCR uint32 = 1 << 18 // secure channel concatenation required
)

// ConnectCommand holds the Connect-specific fields of a fabrics Connect
// SQE (FCTYPE 0x01).
//
//	bytes 40-41 RECFMT  record format, 0
//	bytes 42-43 QID     0 admin, 1..N I/O
//	bytes 44-45 SQSIZE  0's based submission queue size
//	byte  46    CATTR   connect attributes
//	bytes 48-51 KATO    keep alive timeout in milliseconds
type ConnectCommand struct {
	CID    uint16
	Flags  uint8
	DPTR   SGL
	RecFmt uint16
	QID    uint16
	SQSize uint16
	CAttr  uint8
	KATO   uint32
}

// Encode fills c (overwriting it) with the SQE of this Connect command.
func (cc *ConnectCommand) Encode(c *Command) {
	*c = Command{
		Opcode: OpcodeFabrics,
		Flags:  cc.Flags,
		CID:    cc.CID,
		NSID:   uint32(FabricsConnect),
		DPTR:   cc.DPTR,
		CDW10:  uint32(cc.RecFmt) | uint32(cc.QID)<<16,
		CDW11:  uint32(cc.SQSize) | uint32(cc.CAttr)<<16,
		CDW12:  cc.KATO,
	}
}

// Decode reads the Connect fields from c. It returns ErrNotFabrics if c is
// not a Connect command.
func (cc *ConnectCommand) Decode(c *Command) error {
	if !c.IsFabrics() || uint8(c.NSID) != uint8(FabricsConnect) {
		return ErrNotFabrics
	}
	cc.CID = c.CID
	cc.Flags = c.Flags
	cc.DPTR = c.DPTR
	cc.RecFmt = uint16(c.CDW10)
	cc.QID = uint16(c.CDW10 >> 16)
	cc.SQSize = uint16(c.CDW11)
	cc.CAttr = uint8(c.CDW11 >> 16)
	cc.KATO = c.CDW12
	return nil
}

// NQNField is a 256-byte NUL-padded NQN field as carried in the Connect
// data, Identify Controller and the discovery log.
type NQNField [256]byte

// MakeNQNField copies s into a NUL-padded field. It fails if s does not fit
// with a terminating NUL; it does not check that s is a well-formed NQN
// (see ValidateNQN).
func MakeNQNField(s string) (NQNField, error) {
	var f NQNField
	if len(s) >= len(f) {
		return f, ErrFieldTooLong
	}
	copy(f[:], s)
	return f, nil
}

// Bytes returns the field's contents up to the first NUL (the whole field
// if there is none). It aliases f and does not allocate.
func (f *NQNField) Bytes() []byte {
	if i := bytes.IndexByte(f[:], 0); i >= 0 {
		return f[:i]
	}
	return f[:]
}

// String returns the field's contents up to the first NUL.
func (f *NQNField) String() string { return string(f.Bytes()) }

// Terminated reports whether the field holds a NUL terminator.
func (f *NQNField) Terminated() bool { return bytes.IndexByte(f[:], 0) >= 0 }

// Equal reports whether the field holds exactly s, without allocating.
func (f *NQNField) Equal(s string) bool { return string(f.Bytes()) == s }

// ConnectData is the 1024-byte data of a Connect command.
//
//	bytes 0-15    HOSTID   host identifier (UUID bytes in textual order)
//	bytes 16-17   CNTLID   0xFFFF on an admin Connect (dynamic model)
//	bytes 256-511 SUBNQN
//	bytes 512-767 HOSTNQN
//
// All other bytes are reserved: written as zero, ignored when read.
type ConnectData struct {
	HostID  [16]byte
	CNTLID  uint16
	SubNQN  NQNField
	HostNQN NQNField
}

// Marshal writes the data into b.
func (d *ConnectData) Marshal(b *[ConnectDataSize]byte) {
	*b = [ConnectDataSize]byte{}
	copy(b[0:16], d.HostID[:])
	binary.LittleEndian.PutUint16(b[16:18], d.CNTLID)
	copy(b[256:512], d.SubNQN[:])
	copy(b[512:768], d.HostNQN[:])
}

// Unmarshal reads the data from the first 1024 bytes of b. It does not
// validate the NQNs; see Validate.
func (d *ConnectData) Unmarshal(b []byte) error {
	if len(b) < ConnectDataSize {
		return ErrShortBuffer
	}
	copy(d.HostID[:], b[0:16])
	d.CNTLID = binary.LittleEndian.Uint16(b[16:18])
	copy(d.SubNQN[:], b[256:512])
	copy(d.HostNQN[:], b[512:768])
	return nil
}

// Validate checks that both NQN fields are NUL-terminated, well-formed
// NQNs.
func (d *ConnectData) Validate() error {
	if !d.SubNQN.Terminated() || !d.HostNQN.Terminated() {
		return ErrFieldNotTerminated
	}
	if err := validateNQN(d.SubNQN.Bytes()); err != nil {
		return err
	}
	return validateNQN(d.HostNQN.Bytes())
}

// ConnectResponseDW0 builds DW0 of a successful Connect completion:
// CNTLID in bits 15:0, AUTHREQ (ConnectAuthReqATR, ConnectAuthReqASCR) in
// bits 31:16.
func ConnectResponseDW0(cntlid uint16, authreq uint32) uint32 {
	return uint32(cntlid) | authreq&0xFFFF0000
}

// ConnectResponseCNTLID returns the controller ID from DW0 of a
// successful Connect completion.
func ConnectResponseCNTLID(dw0 uint32) uint16 { return uint16(dw0) }

// ConnectInvalidParamDW0 builds DW0 of a Connect Invalid Parameters
// completion: IPO (the byte offset of the bad field) in bits 15:0, and
// IATTR bit 16 set when the offset is into the Connect data rather than the
// SQE.
func ConnectInvalidParamDW0(ipo uint16, inData bool) uint32 {
	dw0 := uint32(ipo)
	if inData {
		dw0 |= 1 << 16
	}
	return dw0
}

// ConnectInvalidParam splits DW0 of a Connect Invalid Parameters
// completion into IPO and whether it points into the Connect data.
func ConnectInvalidParam(dw0 uint32) (ipo uint16, inData bool) {
	return uint16(dw0), dw0&(1<<16) != 0
}

// Property offsets (the PCIe register offsets, reused by fabrics).
const (
	PropCAP  uint32 = 0x00 // Controller Capabilities, 8 bytes
	PropVS   uint32 = 0x08 // Version, 4 bytes
	PropCC   uint32 = 0x14 // Controller Configuration, 4 bytes
	PropCSTS uint32 = 0x1C // Controller Status, 4 bytes
	PropNSSR uint32 = 0x20 // NVM Subsystem Reset, 4 bytes
	PropCRTO uint32 = 0x68 // Controller Ready Timeouts, 4 bytes
)

// NSSRReset is the only value that triggers an NVM subsystem reset when
// written to NSSR ("NVMe" in ASCII).
const NSSRReset uint32 = 0x4E564D65

// PropertyCommand holds the fields of a Property Get (FCTYPE 0x04) or
// Property Set (FCTYPE 0x00).
//
//	byte  40    ATTRIB  bits 2:0 size: 0 = 4 bytes, 1 = 8 bytes
//	bytes 44-47 OFST    property offset
//	bytes 48-55 VALUE   Property Set only
type PropertyCommand struct {
	CID    uint16
	Flags  uint8
	Set    bool // Property Set when true, Property Get otherwise
	Size8  bool // 8-byte property
	Offset uint32
	Value  uint64 // Property Set only
}

// Encode fills c (overwriting it) with the SQE of this property command.
func (p *PropertyCommand) Encode(c *Command) {
	fct := FabricsPropertyGet
	if p.Set {
		fct = FabricsPropertySet
	}
	var attrib uint32
	if p.Size8 {
		attrib = 1
	}
	*c = Command{
		Opcode: OpcodeFabrics,
		Flags:  p.Flags,
		CID:    p.CID,
		NSID:   uint32(fct),
		CDW10:  attrib,
		CDW11:  p.Offset,
	}
	if p.Set {
		c.CDW12 = uint32(p.Value)
		c.CDW13 = uint32(p.Value >> 32)
	}
}

// Decode reads a Property Get or Set from c. It returns ErrNotFabrics for
// any other command.
func (p *PropertyCommand) Decode(c *Command) error {
	if !c.IsFabrics() {
		return ErrNotFabrics
	}
	switch FabricsType(c.NSID & 0xFF) {
	case FabricsPropertyGet:
		p.Set = false
		p.Value = 0
	case FabricsPropertySet:
		p.Set = true
		p.Value = uint64(c.CDW12) | uint64(c.CDW13)<<32
	default:
		return ErrNotFabrics
	}
	p.CID = c.CID
	p.Flags = c.Flags
	p.Size8 = c.CDW10&7 == 1
	p.Offset = c.CDW11
	return nil
}

// PropertySize returns the property size a Property Get or Set asks for,
// from ATTRIB bits 2:0: 4 or 8 bytes, and false for the reserved values
// 2-7, which Decode otherwise reads as 4 bytes.
func PropertySize(c *Command) (int, bool) {
	switch c.CDW10 & 7 {
	case 0:
		return 4, true
	case 1:
		return 8, true
	}
	return 0, false
}

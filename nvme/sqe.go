package nvme

import "encoding/binary"

// SQESize is the size of a submission queue entry (command capsule header).
const SQESize = 64

// Command flags (SQE byte 1).
const (
	// FlagFuseFirst and FlagFuseSecond are the FUSE field, bits 1:0.
	FlagFuseFirst  uint8 = 1 << 0
	FlagFuseSecond uint8 = 1 << 1
	// FlagFuseMask selects the FUSE field.
	FlagFuseMask uint8 = 0x03
	// FlagSGLMetaBuf is PSDT 01: SGL for data, MPTR is a contiguous buffer.
	// The Linux fabrics host sets it (flags 0x40) on every command.
	FlagSGLMetaBuf uint8 = 1 << 6
	// FlagSGLMetaSeg is PSDT 10: SGL for data, MPTR points at an SGL segment.
	FlagSGLMetaSeg uint8 = 1 << 7
	// FlagPSDTMask selects the PSDT field, bits 7:6.
	FlagPSDTMask uint8 = 0xC0
)

// PSDT values (flags bits 7:6 shifted down).
const (
	PSDTPRP        uint8 = 0
	PSDTSGLMetaBuf uint8 = 1
	PSDTSGLMetaSeg uint8 = 2
)

// Command is a 64-byte submission queue entry.
//
//	byte 0      OPC        opcode
//	byte 1      FLAGS      FUSE 1:0, PSDT 7:6
//	bytes 2-3   CID        command identifier
//	bytes 4-7   NSID       (fabrics: byte 4 is FCTYPE, 5-23 reserved)
//	bytes 8-15  CDW2, CDW3
//	bytes 16-23 MPTR
//	bytes 24-39 DPTR       one SGL descriptor (SGL1)
//	bytes 40-63 CDW10-CDW15, CDWn at byte 4n
type Command struct {
	Opcode uint8
	Flags  uint8
	CID    uint16
	NSID   uint32
	CDW2   uint32
	CDW3   uint32
	MPTR   uint64
	DPTR   SGL
	CDW10  uint32
	CDW11  uint32
	CDW12  uint32
	CDW13  uint32
	CDW14  uint32
	CDW15  uint32
}

// Fuse returns the FUSE field (flags bits 1:0).
func (c *Command) Fuse() uint8 { return c.Flags & FlagFuseMask }

// PSDT returns the PSDT field (flags bits 7:6).
func (c *Command) PSDT() uint8 { return c.Flags >> 6 }

// IsFabrics reports whether the command is a fabrics command (opcode 0x7F).
func (c *Command) IsFabrics() bool { return c.Opcode == OpcodeFabrics }

// FCType returns the fabrics command type (byte 4). Meaningful only when
// IsFabrics.
func (c *Command) FCType() FabricsType { return FabricsType(c.NSID) }

// DataDirection returns the transfer direction encoded in bits 1:0 of the
// opcode, or of FCTYPE for fabrics commands.
func (c *Command) DataDirection() Direction {
	if c.IsFabrics() {
		return Direction(uint8(c.NSID) & 3)
	}
	return Direction(c.Opcode & 3)
}

// Marshal writes the entry into b. It fails only if DPTR is a keyed SGL
// descriptor whose length does not fit 24 bits.
func (c *Command) Marshal(b *[SQESize]byte) error {
	b[0] = c.Opcode
	b[1] = c.Flags
	binary.LittleEndian.PutUint16(b[2:4], c.CID)
	binary.LittleEndian.PutUint32(b[4:8], c.NSID)
	binary.LittleEndian.PutUint32(b[8:12], c.CDW2)
	binary.LittleEndian.PutUint32(b[12:16], c.CDW3)
	binary.LittleEndian.PutUint64(b[16:24], c.MPTR)
	if err := c.DPTR.put(b[24:40]); err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(b[40:44], c.CDW10)
	binary.LittleEndian.PutUint32(b[44:48], c.CDW11)
	binary.LittleEndian.PutUint32(b[48:52], c.CDW12)
	binary.LittleEndian.PutUint32(b[52:56], c.CDW13)
	binary.LittleEndian.PutUint32(b[56:60], c.CDW14)
	binary.LittleEndian.PutUint32(b[60:64], c.CDW15)
	return nil
}

// Unmarshal reads an entry from the first 64 bytes of b.
func (c *Command) Unmarshal(b []byte) error {
	if len(b) < SQESize {
		return ErrShortBuffer
	}
	b = b[:SQESize]
	c.Opcode = b[0]
	c.Flags = b[1]
	c.CID = binary.LittleEndian.Uint16(b[2:4])
	c.NSID = binary.LittleEndian.Uint32(b[4:8])
	c.CDW2 = binary.LittleEndian.Uint32(b[8:12])
	c.CDW3 = binary.LittleEndian.Uint32(b[12:16])
	c.MPTR = binary.LittleEndian.Uint64(b[16:24])
	c.DPTR.get(b[24:40])
	c.CDW10 = binary.LittleEndian.Uint32(b[40:44])
	c.CDW11 = binary.LittleEndian.Uint32(b[44:48])
	c.CDW12 = binary.LittleEndian.Uint32(b[48:52])
	c.CDW13 = binary.LittleEndian.Uint32(b[52:56])
	c.CDW14 = binary.LittleEndian.Uint32(b[56:60])
	c.CDW15 = binary.LittleEndian.Uint32(b[60:64])
	return nil
}

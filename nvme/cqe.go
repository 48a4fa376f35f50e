package nvme

import "encoding/binary"

// CQESize is the size of a completion queue entry.
const CQESize = 16

// SQHeadFlowControlDisabled is the SQHD value a controller reports when SQ
// flow control was disabled at Connect (CATTR bit 2).
const SQHeadFlowControlDisabled = 0xFFFF

// Completion is a 16-byte completion queue entry.
//
//	bytes 0-3   DW0     command specific
//	bytes 4-7   DW1     command specific (Property Get of 8 bytes: high half)
//	bytes 8-9   SQHD    SQ head pointer
//	bytes 10-11 SQID    submission queue identifier
//	bytes 12-13 CID     command identifier, echoed
//	bytes 14-15 status  bit 0 phase, bits 15:1 the status field (Status)
type Completion struct {
	DW0    uint32
	DW1    uint32
	SQHead uint16
	SQID   uint16
	CID    uint16
	Status Status
	Phase  bool
}

// Result64 returns DW0 and DW1 as one little-endian 64-bit value, as
// returned by an 8-byte Property Get.
func (c *Completion) Result64() uint64 { return uint64(c.DW0) | uint64(c.DW1)<<32 }

// SetResult64 stores v into DW0 (low half) and DW1 (high half).
func (c *Completion) SetResult64(v uint64) {
	c.DW0 = uint32(v)
	c.DW1 = uint32(v >> 32)
}

// Marshal writes the entry into b.
func (c *Completion) Marshal(b *[CQESize]byte) {
	binary.LittleEndian.PutUint32(b[0:4], c.DW0)
	binary.LittleEndian.PutUint32(b[4:8], c.DW1)
	binary.LittleEndian.PutUint16(b[8:10], c.SQHead)
	binary.LittleEndian.PutUint16(b[10:12], c.SQID)
	binary.LittleEndian.PutUint16(b[12:14], c.CID)
	binary.LittleEndian.PutUint16(b[14:16], c.Status.Wire(c.Phase))
}

// Unmarshal reads an entry from the first 16 bytes of b.
func (c *Completion) Unmarshal(b []byte) error {
	if len(b) < CQESize {
		return ErrShortBuffer
	}
	b = b[:CQESize]
	c.DW0 = binary.LittleEndian.Uint32(b[0:4])
	c.DW1 = binary.LittleEndian.Uint32(b[4:8])
	c.SQHead = binary.LittleEndian.Uint16(b[8:10])
	c.SQID = binary.LittleEndian.Uint16(b[10:12])
	c.CID = binary.LittleEndian.Uint16(b[12:14])
	c.Status, c.Phase = StatusFromWire(binary.LittleEndian.Uint16(b[14:16]))
	return nil
}

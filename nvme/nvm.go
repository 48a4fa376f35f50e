package nvme

import "encoding/binary"

// NVM command set fields of the Read, Write, Compare and Write Zeroes
// commands, read straight from the Command (no decode step, so nothing to
// copy on the I/O path):
//
//	CDW10-11  SLBA (64 bits)
//	CDW12     NLB 15:0 (0's based), DEAC 25 (Write Zeroes), PRINFO 29:26,
//	          FUA 30, LR 31
//	CDW13     DSM hints 7:0
//	CDW14     reference tag
//	CDW15     application tag 15:0, mask 31:16
const (
	RWDEAC        uint32 = 1 << 25
	RWPRINFOShift        = 26
	RWPRINFOMask  uint32 = 0xF << RWPRINFOShift
	RWFUA         uint32 = 1 << 30
	RWLR          uint32 = 1 << 31
)

// SLBA returns the starting LBA (CDW10-11).
func (c *Command) SLBA() uint64 { return uint64(c.CDW10) | uint64(c.CDW11)<<32 }

// NLB returns the 0's based number of logical blocks (CDW12 bits 15:0).
func (c *Command) NLB() uint16 { return uint16(c.CDW12) }

// Blocks returns the number of logical blocks, NLB+1.
func (c *Command) Blocks() uint32 { return uint32(uint16(c.CDW12)) + 1 }

// FUA reports the force unit access bit (CDW12 bit 30).
func (c *Command) FUA() bool { return c.CDW12&RWFUA != 0 }

// DEAC reports the deallocate bit of Write Zeroes (CDW12 bit 25).
func (c *Command) DEAC() bool { return c.CDW12&RWDEAC != 0 }

// PRINFO returns the protection information field (CDW12 bits 29:26).
func (c *Command) PRINFO() uint8 { return uint8((c.CDW12 & RWPRINFOMask) >> RWPRINFOShift) }

// SetRW fills the Read/Write/Compare/Write Zeroes fields: SLBA and the
// 1's based block count (1..65536), plus the CDW12 flag bits (RWFUA,
// RWDEAC, RWLR).
func (c *Command) SetRW(slba uint64, blocks uint32, flags uint32) {
	c.CDW10 = uint32(slba)
	c.CDW11 = uint32(slba >> 32)
	c.CDW12 = (blocks-1)&0xFFFF | flags&^0xFFFF
}

// Dataset Management (opcode 0x09): CDW10 NR bits 7:0 (ranges − 1), CDW11
// attributes.
const (
	DSMIDR uint32 = 1 << 0 // integral dataset for read
	DSMIDW uint32 = 1 << 1 // integral dataset for write
	DSMAD  uint32 = 1 << 2 // deallocate

	// DSMRangeSize is the size of one range descriptor.
	DSMRangeSize = 16
	// DSMMaxRanges is the most ranges one command can carry (NR 255).
	DSMMaxRanges = 256
)

// DSMRanges returns the number of ranges of a Dataset Management command,
// NR+1.
func (c *Command) DSMRanges() int { return int(uint8(c.CDW10)) + 1 }

// DSMRange is one Dataset Management range descriptor.
//
//	bytes 0-3  context attributes
//	bytes 4-7  NLB (1's based: a block count)
//	bytes 8-15 SLBA
type DSMRange struct {
	Attrs uint32
	NLB   uint32
	SLBA  uint64
}

// Marshal writes the range into b.
func (r *DSMRange) Marshal(b *[DSMRangeSize]byte) {
	binary.LittleEndian.PutUint32(b[0:], r.Attrs)
	binary.LittleEndian.PutUint32(b[4:], r.NLB)
	binary.LittleEndian.PutUint64(b[8:], r.SLBA)
}

// Unmarshal reads the range from the first 16 bytes of b.
func (r *DSMRange) Unmarshal(b []byte) error {
	if len(b) < DSMRangeSize {
		return ErrShortBuffer
	}
	r.Attrs = binary.LittleEndian.Uint32(b[0:])
	r.NLB = binary.LittleEndian.Uint32(b[4:])
	r.SLBA = binary.LittleEndian.Uint64(b[8:])
	return nil
}

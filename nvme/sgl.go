package nvme

import "encoding/binary"

// SGLSize is the wire size of one SGL descriptor.
const SGLSize = 16

// SGL descriptor types (identifier byte bits 7:4).
const (
	SGLTypeDataBlock     uint8 = 0x0 // data block
	SGLTypeBitBucket     uint8 = 0x1 // bit bucket
	SGLTypeSegment       uint8 = 0x2 // segment
	SGLTypeLastSegment   uint8 = 0x3 // last segment
	SGLTypeKeyedData     uint8 = 0x4 // keyed data block (RDMA)
	SGLTypeTransportData uint8 = 0x5 // transport data block (TCP)
)

// SGL descriptor subtypes (identifier byte bits 3:0).
const (
	SGLSubtypeAddress    uint8 = 0x0 // address is an absolute address
	SGLSubtypeOffset     uint8 = 0x1 // address is an offset into in-capsule data
	SGLSubtypeTransportA uint8 = 0xA // transport specific (TCP)
	SGLSubtypeInvalidate uint8 = 0xF // RDMA: invalidate the key on completion
)

// Complete SGL identifier bytes (byte 15) used by the fabrics transports.
const (
	SGLIDDataAddress      uint8 = SGLTypeDataBlock<<4 | SGLSubtypeAddress        // 0x00
	SGLIDInCapsule        uint8 = SGLTypeDataBlock<<4 | SGLSubtypeOffset         // 0x01: in-capsule data
	SGLIDSegment          uint8 = SGLTypeSegment<<4 | SGLSubtypeAddress          // 0x20
	SGLIDLastSegment      uint8 = SGLTypeLastSegment<<4 | SGLSubtypeAddress      // 0x30
	SGLIDLastSegmentOff   uint8 = SGLTypeLastSegment<<4 | SGLSubtypeOffset       // 0x31
	SGLIDKeyed            uint8 = SGLTypeKeyedData<<4 | SGLSubtypeAddress        // 0x40: RDMA remote buffer
	SGLIDKeyedInvalidate  uint8 = SGLTypeKeyedData<<4 | SGLSubtypeInvalidate     // 0x4F: RDMA, answer with Send with Invalidate
	SGLIDTransportDataTCP uint8 = SGLTypeTransportData<<4 | SGLSubtypeTransportA // 0x5A: TCP data PDUs
)

// MaxKeyedSGLLength is the largest length a keyed data block descriptor
// can carry: its length field is 24 bits.
const MaxKeyedSGLLength = 1<<24 - 1

// SGL is one 16-byte SGL descriptor, as found in DPTR (SGL1).
//
// Layout (byte 15 is the identifier: type in bits 7:4, subtype in 3:0):
//
//	non-keyed: 0-7 address, 8-11 length, 12-14 reserved, 15 identifier
//	keyed:     0-7 address, 8-10 length (24 bits), 11-14 key, 15 identifier
//
// Key is meaningful only for keyed descriptors; reserved bytes 12-14 of a
// non-keyed descriptor are written as zero and ignored when read.
type SGL struct {
	Addr   uint64
	Length uint32
	Key    uint32
	ID     uint8
}

// Type returns the descriptor type (identifier bits 7:4).
func (s SGL) Type() uint8 { return s.ID >> 4 }

// Subtype returns the descriptor subtype (identifier bits 3:0).
func (s SGL) Subtype() uint8 { return s.ID & 0x0F }

// Keyed reports whether the descriptor is a keyed data block.
func (s SGL) Keyed() bool { return s.Type() == SGLTypeKeyedData }

// KeyedSGL builds a keyed data block descriptor. invalidate selects the
// 0x4F identifier (the host registered the buffer for this command only and
// expects the key invalidated) instead of 0x40.
func KeyedSGL(addr uint64, length uint32, key uint32, invalidate bool) SGL {
	id := SGLIDKeyed
	if invalidate {
		id = SGLIDKeyedInvalidate
	}
	return SGL{Addr: addr, Length: length, Key: key, ID: id}
}

// InCapsuleSGL builds the data block descriptor with the offset subtype
// (0x01) that points at in-capsule data.
func InCapsuleSGL(offset uint64, length uint32) SGL {
	return SGL{Addr: offset, Length: length, ID: SGLIDInCapsule}
}

// TransportSGL builds the TCP transport data block descriptor (0x5A).
func TransportSGL(length uint32) SGL {
	return SGL{Length: length, ID: SGLIDTransportDataTCP}
}

// Marshal writes the descriptor into b.
func (s SGL) Marshal(b *[SGLSize]byte) error {
	return s.put(b[:])
}

func (s SGL) put(b []byte) error {
	_ = b[15]
	binary.LittleEndian.PutUint64(b[0:8], s.Addr)
	if s.Keyed() {
		if s.Length > MaxKeyedSGLLength {
			return ErrSGLLength
		}
		b[8] = byte(s.Length)
		b[9] = byte(s.Length >> 8)
		b[10] = byte(s.Length >> 16)
		binary.LittleEndian.PutUint32(b[11:15], s.Key)
	} else {
		binary.LittleEndian.PutUint32(b[8:12], s.Length)
		b[12], b[13], b[14] = 0, 0, 0
	}
	b[15] = s.ID
	return nil
}

// Unmarshal reads a descriptor from the first 16 bytes of b.
func (s *SGL) Unmarshal(b []byte) error {
	if len(b) < SGLSize {
		return ErrShortBuffer
	}
	s.get(b)
	return nil
}

func (s *SGL) get(b []byte) {
	_ = b[15]
	s.Addr = binary.LittleEndian.Uint64(b[0:8])
	s.ID = b[15]
	if s.Keyed() {
		s.Length = uint32(b[8]) | uint32(b[9])<<8 | uint32(b[10])<<16
		s.Key = binary.LittleEndian.Uint32(b[11:15])
	} else {
		s.Length = binary.LittleEndian.Uint32(b[8:12])
		s.Key = 0
	}
}

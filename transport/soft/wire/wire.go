// Package wire encodes and decodes the iWARP protocol stack the soft
// provider speaks over TCP: MPA (RFC 5044) connection frames with the
// enhanced connection setup of MPA revision 2 (RFC 6581), MPA FPDUs with
// their padding and CRC32C, DDP (RFC 5041) tagged and untagged segment
// headers and RDMAP (RFC 5040) messages, including Read Request and
// Terminate. It does no I/O beyond reading a connection frame and allocates
// nothing on the FPDU path.
//
// Layout of one FPDU as it crosses TCP (markers are never used):
//
//	+----------------+------------------------------+-----+--------+
//	| ULPDU length 2 | DDP/RDMAP header | payload   | pad | CRC 4  |
//	+----------------+------------------------------+-----+--------+
//
// ULPDU length counts header and payload; pad (0–3 bytes of zero) makes
// 2+ULPDU length+pad a multiple of 4; the CRC covers everything before it
// and is zero when CRC was not negotiated.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// MPA connection frame constants (RFC 5044 §7.1, RFC 6581 §5).
const (
	KeyRequest = "MPA ID Req Frame"
	KeyReply   = "MPA ID Rep Frame"

	FlagMarkers  = 0x80 // M: receiver requires markers
	FlagCRC      = 0x40 // C: CRC32C in use
	FlagReject   = 0x20 // R: connection rejected (reply only)
	FlagEnhanced = 0x10 // enhanced connection setup (revision 2)

	Revision1 = 1
	Revision2 = 2

	// FrameHeaderLen is the fixed part of a connection frame: key, flags,
	// revision and private data length.
	FrameHeaderLen = 20
	// MaxPrivateData is the most private data bytes an MPA frame may carry
	// (RFC 5044: 512), including the 4 bytes of IRD/ORD of revision 2.
	MaxPrivateData = 512
	// EnhancedLen is the size of the revision 2 IRD/ORD words.
	EnhancedLen = 4

	// Bits of the revision 2 IRD and ORD words (RFC 6581 §5).
	IRDPeerToPeer = 0x8000 // A: peer-to-peer mode
	IRDSendRTR    = 0x4000 // B: zero length Send as RTR
	ORDWriteRTR   = 0x8000 // C: zero length RDMA Write as RTR
	ORDReadRTR    = 0x4000 // D: zero length RDMA Read as RTR
	IRDORDMask    = 0x3fff
)

// Errors of the framing layer.
var (
	ErrBadKey         = errors.New("iwarp: MPA frame key mismatch")
	ErrBadRevision    = errors.New("iwarp: unsupported MPA revision")
	ErrPrivateData    = errors.New("iwarp: MPA private data too long")
	ErrShort          = errors.New("iwarp: truncated header")
	ErrDDPVersion     = errors.New("iwarp: invalid DDP version")
	ErrRDMAPVersion   = errors.New("iwarp: invalid RDMAP version")
	ErrBadOpcode      = errors.New("iwarp: invalid RDMAP opcode")
	ErrBadULPDULength = errors.New("iwarp: ULPDU length smaller than the DDP header")
	ErrCRC            = errors.New("iwarp: MPA CRC mismatch")
)

// Frame is an MPA request or reply frame.
type Frame struct {
	Reply    bool
	Markers  bool
	CRC      bool
	Reject   bool
	Enhanced bool // revision 2 enhanced setup: IRD/ORD words present
	Revision uint8
	// IRD and ORD include their flag bits (IRDPeerToPeer etc.); valid when
	// Enhanced.
	IRD, ORD uint16
	// PrivateData is the application's private data, after the IRD/ORD
	// words when Enhanced.
	PrivateData []byte
}

// Len is the encoded size of f.
func (f *Frame) Len() int {
	n := FrameHeaderLen + len(f.PrivateData)
	if f.Enhanced {
		n += EnhancedLen
	}
	return n
}

// Append encodes f at the end of b.
func (f *Frame) Append(b []byte) ([]byte, error) {
	pd := len(f.PrivateData)
	if f.Enhanced {
		pd += EnhancedLen
	}
	if pd > MaxPrivateData {
		return b, ErrPrivateData
	}
	if f.Reply {
		b = append(b, KeyReply...)
	} else {
		b = append(b, KeyRequest...)
	}
	var flags byte
	if f.Markers {
		flags |= FlagMarkers
	}
	if f.CRC {
		flags |= FlagCRC
	}
	if f.Reject {
		flags |= FlagReject
	}
	if f.Enhanced {
		flags |= FlagEnhanced
	}
	b = append(b, flags, f.Revision, byte(pd>>8), byte(pd))
	if f.Enhanced {
		b = binary.BigEndian.AppendUint16(b, f.IRD)
		b = binary.BigEndian.AppendUint16(b, f.ORD)
	}
	return append(b, f.PrivateData...), nil
}

// ReadFrame reads one connection frame from r; reply says which key to
// expect. Revision 1 frames and revision 2 frames without the enhanced flag
// are accepted (Enhanced false).
func ReadFrame(r io.Reader, reply bool) (Frame, error) {
	var h [FrameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	f, pdLen, err := parseFrameHeader(h[:], reply)
	if err != nil {
		return f, err
	}
	pd := make([]byte, pdLen)
	if _, err := io.ReadFull(r, pd); err != nil {
		return f, err
	}
	return f, f.setPrivateData(pd)
}

// ParseFrame decodes a whole connection frame held in b.
func ParseFrame(b []byte, reply bool) (Frame, error) {
	if len(b) < FrameHeaderLen {
		return Frame{}, ErrShort
	}
	f, pdLen, err := parseFrameHeader(b[:FrameHeaderLen], reply)
	if err != nil {
		return f, err
	}
	if len(b) != FrameHeaderLen+pdLen {
		return f, ErrShort
	}
	return f, f.setPrivateData(append([]byte(nil), b[FrameHeaderLen:]...))
}

func parseFrameHeader(h []byte, reply bool) (Frame, int, error) {
	want := KeyRequest
	if reply {
		want = KeyReply
	}
	if string(h[:16]) != want {
		return Frame{}, 0, ErrBadKey
	}
	flags := h[16]
	f := Frame{
		Reply:    reply,
		Markers:  flags&FlagMarkers != 0,
		CRC:      flags&FlagCRC != 0,
		Reject:   flags&FlagReject != 0,
		Revision: h[17],
	}
	if f.Revision != Revision1 && f.Revision != Revision2 {
		return f, 0, fmt.Errorf("%w %d", ErrBadRevision, f.Revision)
	}
	f.Enhanced = f.Revision == Revision2 && flags&FlagEnhanced != 0
	pdLen := int(binary.BigEndian.Uint16(h[18:20]))
	if pdLen > MaxPrivateData {
		return f, 0, ErrPrivateData
	}
	return f, pdLen, nil
}

func (f *Frame) setPrivateData(pd []byte) error {
	if f.Enhanced {
		if len(pd) < EnhancedLen {
			return ErrShort
		}
		f.IRD = binary.BigEndian.Uint16(pd[0:2])
		f.ORD = binary.BigEndian.Uint16(pd[2:4])
		pd = pd[EnhancedLen:]
	}
	f.PrivateData = pd
	return nil
}

// RDMAP opcodes (RFC 5040 §4.2).
const (
	OpWrite                   = 0
	OpReadRequest             = 1
	OpReadResponse            = 2
	OpSend                    = 3
	OpSendInvalidate          = 4
	OpSendSolicited           = 5
	OpSendSolicitedInvalidate = 6
	OpTerminate               = 7
)

// Untagged queue numbers (RFC 5040 §5).
const (
	QNSend        = 0
	QNReadRequest = 1
	QNTerminate   = 2
)

// Header sizes.
const (
	MPAHeaderLen      = 2
	CRCLen            = 4
	TaggedHeaderLen   = 14 // DDP control, RDMAP control, STag, TO
	UntaggedHeaderLen = 18 // DDP control, RDMAP control, inv. STag, QN, MSN, MO
	ReadRequestLen    = 28 // sink STag, sink TO, size, source STag, source TO
	// MaxULPDU is the largest ULPDU the 16-bit MPA length can describe.
	MaxULPDU = 0xffff

	ddpTagged    = 0x80
	ddpLast      = 0x40
	ddpVersion   = 0x01 // DV field, low two bits
	rdmapVersion = 0x40 // RV field, high two bits of the RDMAP control byte
)

// Header is a DDP segment header with its RDMAP control fields.
type Header struct {
	Tagged bool
	Last   bool
	Opcode uint8
	// Tagged segments.
	STag uint32
	TO   uint64
	// Untagged segments. Inval is the STag to invalidate
	// (Send with Invalidate); 0 otherwise.
	Inval uint32
	QN    uint32
	MSN   uint32
	MO    uint32
}

// Len is the encoded header length.
func (h *Header) Len() int {
	if h.Tagged {
		return TaggedHeaderLen
	}
	return UntaggedHeaderLen
}

// Put encodes h into b, which must hold h.Len() bytes, and returns h.Len().
func (h *Header) Put(b []byte) int {
	c := byte(ddpVersion)
	if h.Tagged {
		c |= ddpTagged
	}
	if h.Last {
		c |= ddpLast
	}
	b[0] = c
	b[1] = rdmapVersion | h.Opcode&0x0f
	if h.Tagged {
		binary.BigEndian.PutUint32(b[2:6], h.STag)
		binary.BigEndian.PutUint64(b[6:14], h.TO)
		return TaggedHeaderLen
	}
	binary.BigEndian.PutUint32(b[2:6], h.Inval)
	binary.BigEndian.PutUint32(b[6:10], h.QN)
	binary.BigEndian.PutUint32(b[10:14], h.MSN)
	binary.BigEndian.PutUint32(b[14:18], h.MO)
	return UntaggedHeaderLen
}

// HeaderLenFromControl tells from the first (DDP control) byte how long the
// header is.
func HeaderLenFromControl(c byte) int {
	if c&ddpTagged != 0 {
		return TaggedHeaderLen
	}
	return UntaggedHeaderLen
}

// ParseHeader decodes a header from b and returns its length.
func ParseHeader(b []byte) (Header, int, error) {
	var h Header
	if len(b) < 2 {
		return h, 0, ErrShort
	}
	if b[0]&0x03 != ddpVersion {
		return h, 0, ErrDDPVersion
	}
	if b[1]&0xc0 != rdmapVersion {
		return h, 0, ErrRDMAPVersion
	}
	h.Tagged = b[0]&ddpTagged != 0
	h.Last = b[0]&ddpLast != 0
	h.Opcode = b[1] & 0x0f
	if h.Opcode > OpTerminate {
		return h, 0, ErrBadOpcode
	}
	n := h.Len()
	if len(b) < n {
		return h, 0, ErrShort
	}
	if h.Tagged {
		h.STag = binary.BigEndian.Uint32(b[2:6])
		h.TO = binary.BigEndian.Uint64(b[6:14])
		return h, n, nil
	}
	h.Inval = binary.BigEndian.Uint32(b[2:6])
	h.QN = binary.BigEndian.Uint32(b[6:10])
	h.MSN = binary.BigEndian.Uint32(b[10:14])
	h.MO = binary.BigEndian.Uint32(b[14:18])
	return h, n, nil
}

// PadLen is the zero padding after a ULPDU of ulpduLen bytes.
func PadLen(ulpduLen int) int { return (4 - (MPAHeaderLen+ulpduLen)&3) & 3 }

// FPDULen is the size on the wire of an FPDU carrying a ULPDU of ulpduLen.
func FPDULen(ulpduLen int) int {
	return MPAHeaderLen + ulpduLen + PadLen(ulpduLen) + CRCLen
}

// MaxPayload is the most payload bytes an FPDU with a header of hdrLen
// may carry when FPDUs must fit in fpduMax bytes on the wire (at most
// MaxULPDU of ULPDU). The result is a multiple of 4 so that every segment
// but the last needs no padding.
func MaxPayload(fpduMax, hdrLen int) int {
	u := fpduMax - MPAHeaderLen - CRCLen
	if u > MaxULPDU {
		u = MaxULPDU
	}
	p := u - hdrLen
	p -= (MPAHeaderLen + hdrLen + p) & 3
	return p
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRCUpdate extends a running CRC32C (start with 0) over p.
func CRCUpdate(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// ReadRequest is the payload of an RDMA Read Request (RFC 5040 §4.4).
type ReadRequest struct {
	SinkSTag uint32
	SinkTO   uint64
	Size     uint32
	SrcSTag  uint32
	SrcTO    uint64
}

// Put encodes r into b (ReadRequestLen bytes).
func (r *ReadRequest) Put(b []byte) {
	binary.BigEndian.PutUint32(b[0:4], r.SinkSTag)
	binary.BigEndian.PutUint64(b[4:12], r.SinkTO)
	binary.BigEndian.PutUint32(b[12:16], r.Size)
	binary.BigEndian.PutUint32(b[16:20], r.SrcSTag)
	binary.BigEndian.PutUint64(b[20:28], r.SrcTO)
}

// ParseReadRequest decodes a Read Request payload.
func ParseReadRequest(b []byte) (ReadRequest, error) {
	if len(b) < ReadRequestLen {
		return ReadRequest{}, ErrShort
	}
	return ReadRequest{
		SinkSTag: binary.BigEndian.Uint32(b[0:4]),
		SinkTO:   binary.BigEndian.Uint64(b[4:12]),
		Size:     binary.BigEndian.Uint32(b[12:16]),
		SrcSTag:  binary.BigEndian.Uint32(b[16:20]),
		SrcTO:    binary.BigEndian.Uint64(b[20:28]),
	}, nil
}

// Terminate layers, error types and codes (RFC 5040 §7, RFC 5041 §7,
// RFC 5044 §8).
const (
	LayerRDMAP = 0
	LayerDDP   = 1
	LayerMPA   = 2

	// RDMAP error types.
	RDMAPLocalCatastrophic = 0
	RDMAPRemoteProtection  = 1
	RDMAPRemoteOperation   = 2
	// RDMAP error codes.
	RDMAPInvalidSTag        = 0x00
	RDMAPBaseBounds         = 0x01
	RDMAPAccessRights       = 0x02
	RDMAPSTagNotAssociated  = 0x03
	RDMAPToWrap             = 0x04
	RDMAPInvalidVersion     = 0x05
	RDMAPUnexpectedOpcode   = 0x06
	RDMAPCatastrophicStream = 0x07
	RDMAPCatastrophicGlobal = 0x08
	RDMAPCannotInvalidate   = 0x09
	RDMAPUnspecified        = 0xff

	// DDP error types.
	DDPCatastrophic   = 0
	DDPTaggedBuffer   = 1
	DDPUntaggedBuffer = 2
	// DDP tagged buffer error codes.
	DDPTaggedInvalidSTag    = 0x00
	DDPTaggedBaseBounds     = 0x01
	DDPTaggedNotAssociated  = 0x02
	DDPTaggedToWrap         = 0x03
	DDPTaggedInvalidVersion = 0x04
	// DDP untagged buffer error codes.
	DDPUntaggedInvalidQN      = 0x01
	DDPUntaggedNoBuffer       = 0x02 // invalid MSN: no buffer available
	DDPUntaggedMSNRange       = 0x03
	DDPUntaggedInvalidMO      = 0x04
	DDPUntaggedTooLong        = 0x05 // message too long for the buffer
	DDPUntaggedInvalidVersion = 0x06

	// MPA (LLP) error codes, error type 0.
	MPACRCError     = 0x02
	MPAMarkerError  = 0x03
	MPAInvalidULPDU = 0x04

	termHdrM = 0x08 // DDP segment length field valid
	termHdrD = 0x04 // DDP header included
	termHdrR = 0x02 // RDMAP header included
	// TerminateHeaderLen is the fixed part of the Terminate payload.
	TerminateHeaderLen = 4
)

// Terminate is an RDMAP Terminate message (RFC 5040 §4.8).
type Terminate struct {
	Layer, EType, Code uint8
	// SegLenValid says the MPA header (ULPDU length) of the offending
	// segment is meaningful; DDPHeader holds the offending DDP header
	// (14 or 18 bytes, with its RDMAP control) when non-nil; RDMAPHeader
	// the Read Request's RDMAP header (28 bytes) when non-nil.
	SegLenValid bool
	DDPSegLen   uint16
	DDPHeader   []byte
	RDMAPHeader []byte
}

// Append encodes t's payload (after its own untagged DDP header) at the
// end of b.
func (t *Terminate) Append(b []byte) []byte {
	var hc byte
	if t.SegLenValid {
		hc |= termHdrM
	}
	if t.DDPHeader != nil {
		hc |= termHdrD
	}
	if t.RDMAPHeader != nil {
		hc |= termHdrR
	}
	b = append(b, t.Layer<<4|t.EType&0x0f, t.Code, hc<<4, 0)
	if t.DDPHeader != nil {
		b = binary.BigEndian.AppendUint16(b, t.DDPSegLen)
		b = append(b, t.DDPHeader...)
	}
	return append(b, t.RDMAPHeader...)
}

// ParseTerminate decodes a Terminate payload.
func ParseTerminate(b []byte) (Terminate, error) {
	if len(b) < TerminateHeaderLen {
		return Terminate{}, ErrShort
	}
	t := Terminate{Layer: b[0] >> 4, EType: b[0] & 0x0f, Code: b[1]}
	hc := b[2] >> 4
	t.SegLenValid = hc&termHdrM != 0
	rest := b[TerminateHeaderLen:]
	if hc&termHdrD != 0 {
		if len(rest) < 2+2 {
			return t, ErrShort
		}
		t.DDPSegLen = binary.BigEndian.Uint16(rest[0:2])
		n := HeaderLenFromControl(rest[2])
		if len(rest) < 2+n {
			return t, ErrShort
		}
		t.DDPHeader = rest[2 : 2+n]
		rest = rest[2+n:]
	}
	if hc&termHdrR != 0 {
		if len(rest) < ReadRequestLen {
			return t, ErrShort
		}
		t.RDMAPHeader = rest[:ReadRequestLen]
	}
	return t, nil
}

func (t Terminate) String() string {
	return fmt.Sprintf("terminate layer %d type %d code %#02x", t.Layer, t.EType, t.Code)
}

// Package wire encodes and decodes the iWARP protocol stack the soft
// provider speaks over TCP: MPA (RFC 5044) connection frames with the
// enhanced connection setup of MPA revision 2 (RFC 6581), MPA FPDUs with
// their padding and CRC32C, DDP (RFC 5041) tagged and untagged segment
// headers and RDMAP (RFC 5040) messages, including Read Request and
// Terminate. It does no I/O beyond reading a connection frame and allocates
// nothing on the FPDU path; it never panics on bytes from the wire.
//
// Layout of one FPDU as it crosses TCP (markers are never used):
//
//	+----------------+------------------------------+-----+--------+
//	| ULPDU length 2 | DDP/RDMAP header | payload   | pad | CRC 4  |
//	+----------------+------------------------------+-----+--------+
//
// ULPDU length (big-endian) counts header and payload; pad (0–3 bytes of
// zero) makes 2+ULPDU length+pad a multiple of 4; the CRC32C covers
// everything before it (length field, ULPDU and pad) and is sent as zero
// when CRC was not negotiated. The CRC is the one odd field: it is stored
// least significant byte first (see PutCRC).
//
// Every layout here was checked byte by byte against the Linux kernel's
// Soft-iWARP driver (drivers/infiniband/sw/siw: iwarp.h, siw_cm.c,
// siw_qp.c, siw_qp_rx.c, siw_qp_tx.c, siw.h), the peer this package is
// tested against, and against captures of it (wire_test.go).
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// MPA connection frame constants (RFC 5044 §7.1, RFC 6581 §5).
//
// A frame is the 16-byte key, one byte of flags, one byte of revision, a
// 16-bit big-endian private data length and the private data (siw: struct
// mpa_rr, MPA_RR_FLAG_*, MPA_RR_MASK_REVISION).
const (
	KeyRequest = "MPA ID Req Frame"
	KeyReply   = "MPA ID Rep Frame"

	FlagMarkers  = 0x80 // M: receiver requires markers
	FlagCRC      = 0x40 // C: CRC32C in use
	FlagReject   = 0x20 // R: connection rejected (reply only)
	FlagEnhanced = 0x10 // enhanced connection setup (revision 2)
	// siw also defines 0x08 (MPA_RR_FLAG_GSO_EXP), a private extension;
	// it is ignored on receipt and never sent.

	Revision1 = 1
	Revision2 = 2

	// FrameHeaderLen is the fixed part of a connection frame: key, flags,
	// revision and private data length.
	FrameHeaderLen = 20
	// MaxPrivateData is the most private data bytes an MPA frame may carry
	// (RFC 5044: 512), including the 4 bytes of IRD/ORD of revision 2.
	MaxPrivateData = 512
	// LinuxMaxPrivateData is the most the Linux iWARP drivers accept (siw
	// and cxgb4 use RDMA_MAX_PRIVATE_DATA, 256, and refuse larger frames);
	// frames sent to them should stay within it.
	LinuxMaxPrivateData = 256
	// EnhancedLen is the size of the revision 2 IRD/ORD words.
	EnhancedLen = 4

	// Bits of the revision 2 IRD and ORD words, each a big-endian 16-bit
	// word ahead of the application's private data (RFC 6581 §5; siw:
	// struct mpa_v2_data, enum mpa_v2_ctrl; the same values in cxgb4's
	// MPA_V2_* and irdma's IETF_* constants). The IRD word carries the
	// connection model and the zero-length RTR flag, the ORD word the RTR
	// message kind.
	IRDPeerToPeer = 0x8000 // A: peer-to-peer mode (siw MPA_V2_PEER_TO_PEER)
	IRDSendRTR    = 0x4000 // B: zero-length FPDU as RTR (siw MPA_V2_ZERO_LENGTH_RTR)
	ORDWriteRTR   = 0x8000 // C: zero length RDMA Write as RTR (siw MPA_V2_RDMA_WRITE_RTR)
	ORDReadRTR    = 0x4000 // D: zero length RDMA Read as RTR (siw MPA_V2_RDMA_READ_RTR)
	IRDORDMask    = 0x3fff // the IRD or ORD value itself (siw MPA_IRD_ORD_MASK)
)

// Errors of the framing layer.
var (
	ErrBadKey         = errors.New("iwarp: MPA frame key mismatch")
	ErrBadRevision    = errors.New("iwarp: unsupported MPA revision")
	ErrPrivateData    = errors.New("iwarp: MPA private data too long")
	ErrShort          = errors.New("iwarp: truncated header")
	ErrTrailing       = errors.New("iwarp: bytes after the end of an MPA frame")
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

// Append encodes f at the end of b. Revision must be 1 or 2, and 2 when
// Enhanced.
func (f *Frame) Append(b []byte) ([]byte, error) {
	if f.Revision != Revision1 && f.Revision != Revision2 ||
		f.Enhanced && f.Revision != Revision2 {
		return b, ErrBadRevision
	}
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
// are accepted (Enhanced false). Revision 0 (pre-RFC MPA, which siw still
// accepts) is refused. A truncated frame gives io.EOF or
// io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, reply bool) (Frame, error) {
	var h [FrameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	f, pdLen, err := parseFrameHeader(h[:], reply)
	if err != nil {
		return f, err
	}
	var pd []byte
	if pdLen > 0 {
		pd = make([]byte, pdLen)
		if _, err := io.ReadFull(r, pd); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return f, err
		}
	}
	return f, f.setPrivateData(pd)
}

// ParseFrame decodes a whole connection frame held in b: ErrShort if b ends
// before the frame does, ErrTrailing if bytes follow it. The private data
// is copied out of b.
func ParseFrame(b []byte, reply bool) (Frame, error) {
	if len(b) < FrameHeaderLen {
		return Frame{}, ErrShort
	}
	f, pdLen, err := parseFrameHeader(b[:FrameHeaderLen], reply)
	if err != nil {
		return f, err
	}
	switch {
	case len(b) < FrameHeaderLen+pdLen:
		return f, ErrShort
	case len(b) > FrameHeaderLen+pdLen:
		return f, ErrTrailing
	}
	var pd []byte
	if pdLen > 0 {
		pd = append([]byte(nil), b[FrameHeaderLen:]...)
	}
	return f, f.setPrivateData(pd)
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
			if f.Reject {
				// siw rejects a request whose private data cannot hold the
				// IRD/ORD words with a reply that keeps the enhanced flag
				// but carries no private data: let the caller see the
				// rejection rather than a framing error.
				f.Enhanced = false
				f.PrivateData = pd
				return nil
			}
			return ErrShort
		}
		f.IRD = binary.BigEndian.Uint16(pd[0:2])
		f.ORD = binary.BigEndian.Uint16(pd[2:4])
		pd = pd[EnhancedLen:]
	}
	f.PrivateData = pd
	return nil
}

// RDMAP opcodes (RFC 5040 §4.2; siw enum rdma_opcode). Write and Read
// Response travel in tagged DDP segments, all others in untagged ones.
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

// Untagged queue numbers (RFC 5040 §5; siw enum rdmap_untagged_qn).
const (
	QNSend        = 0
	QNReadRequest = 1
	QNTerminate   = 2
)

// Header sizes (siw: sizeof struct iwarp_* minus the 2-byte MPA length
// that its structs include).
const (
	MPAHeaderLen      = 2
	CRCLen            = 4
	TaggedHeaderLen   = 14 // DDP control, RDMAP control, STag, TO
	UntaggedHeaderLen = 18 // DDP control, RDMAP control, inv. STag, QN, MSN, MO
	ReadRequestLen    = 28 // sink STag, sink TO, size, source STag, source TO
	// MaxULPDU is the largest ULPDU the 16-bit MPA length can describe.
	MaxULPDU = 0xffff

	// First header byte, DDP control: T (0x80), L (0x40), 4 reserved
	// bits, DV (2 bits). Second byte, RDMAP control: RV (2 bits), 2
	// reserved bits, opcode (4 bits). siw: DDP_FLAG_*, DDP_MASK_VERSION,
	// RDMAP_MASK_VERSION, RDMAP_MASK_OPCODE on the 16-bit ddp_rdmap_ctrl.
	ddpTagged    = 0x80
	ddpLast      = 0x40
	ddpVersion   = 0x01 // DV field, low two bits
	ddpDVMask    = 0x03
	rdmapVersion = 0x40 // RV field, high two bits of the RDMAP control byte
	rdmapRVMask  = 0xc0
	rdmapOpMask  = 0x0f
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
// Reserved bits are sent as zero.
func (h *Header) Put(b []byte) int {
	c := byte(ddpVersion)
	if h.Tagged {
		c |= ddpTagged
	}
	if h.Last {
		c |= ddpLast
	}
	if h.Tagged {
		_ = b[TaggedHeaderLen-1]
	} else {
		_ = b[UntaggedHeaderLen-1]
	}
	b[0] = c
	b[1] = rdmapVersion | h.Opcode&rdmapOpMask
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

// TaggedOpcode reports whether RDMAP opcode op travels in tagged DDP
// segments (RDMA Write and Read Response) rather than untagged ones.
func TaggedOpcode(op uint8) bool { return op == OpWrite || op == OpReadResponse }

// ParseHeader decodes a header from b and returns its length. It checks,
// in siw's order, DV = 1 (ErrDDPVersion), RV = 1 (ErrRDMAPVersion) and the
// opcode (ErrBadOpcode: above 7, or a T flag that does not match the
// opcode, which would make the header length ambiguous: siw sizes headers
// by opcode, RFC 5041 by the T flag). Reserved bits are ignored. On error
// the fields decoded so far are returned, for the Terminate.
func ParseHeader(b []byte) (Header, int, error) {
	var h Header
	if len(b) < 2 {
		return h, 0, ErrShort
	}
	if b[0]&ddpDVMask != ddpVersion {
		return h, 0, ErrDDPVersion
	}
	if b[1]&rdmapRVMask != rdmapVersion {
		return h, 0, ErrRDMAPVersion
	}
	h.Tagged = b[0]&ddpTagged != 0
	h.Last = b[0]&ddpLast != 0
	h.Opcode = b[1] & rdmapOpMask
	if h.Opcode > OpTerminate || h.Tagged != TaggedOpcode(h.Opcode) {
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
// MaxULPDU of ULPDU). The result makes 2+hdrLen+payload a multiple of 4,
// so that every segment but the last needs no padding; for the DDP header
// lengths (14 and 18) it is therefore a multiple of 4 itself. It is 0 when
// no payload fits.
func MaxPayload(fpduMax, hdrLen int) int {
	u := fpduMax - MPAHeaderLen - CRCLen
	if u > MaxULPDU {
		u = MaxULPDU
	}
	p := u - hdrLen
	if p <= 0 {
		return 0
	}
	p -= (MPAHeaderLen + hdrLen + p) & 3
	return p
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRCUpdate extends a running CRC32C (start with 0) over p. The result is
// the CRC32C of everything fed so far (initial value and final inversion
// included, as in RFC 3720 §B.4 and siw's siw_crc_init/siw_crc_final).
func CRCUpdate(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// PutCRC stores crc in the 4-byte CRC field b[0:4]. The field holds the
// CRC32C least significant byte first: siw writes it with
// put_unaligned_le32 (siw.h siw_crc_final; older versions took the bytes of
// the crc32c shash digest, also little-endian) and compares the received
// bytes verbatim (siw_qp_rx.c siw_get_trailer); this is also the byte order
// of the RFC 3720 §B.4 examples MPA refers to (32 zero bytes give
// 0x8a9136aa, sent as aa 36 91 8a). When CRC was not negotiated the field
// is zero.
func PutCRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// ReadCRC reads the 4-byte CRC field b[0:4] (see PutCRC).
func ReadCRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// ReadRequest is the payload of an RDMA Read Request (RFC 5040 §4.4; siw
// struct iwarp_rdma_rreq after its untagged header).
type ReadRequest struct {
	SinkSTag uint32
	SinkTO   uint64
	Size     uint32
	SrcSTag  uint32
	SrcTO    uint64
}

// Put encodes r into b (ReadRequestLen bytes).
func (r *ReadRequest) Put(b []byte) {
	_ = b[ReadRequestLen-1]
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
// RFC 5044 §8, RFC 6581 §6; siw enums term_elayer, rdmap_etype,
// rdmap_ecode, ddp_etype, ddp_ecode, llp_etype, llp_ecode).
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
	// DDP untagged buffer error codes (there is no code 0).
	DDPUntaggedInvalidQN      = 0x01
	DDPUntaggedNoBuffer       = 0x02 // invalid MSN: no buffer available
	DDPUntaggedMSNRange       = 0x03 // invalid MSN: MSN range is not valid
	DDPUntaggedInvalidMO      = 0x04
	DDPUntaggedTooLong        = 0x05 // message too long for the buffer
	DDPUntaggedInvalidVersion = 0x06

	// MPA (LLP) error type and codes.
	MPAErrorType           = 0
	MPAConnectionLost      = 0x01 // TCP connection closed, terminated or lost
	MPACRCError            = 0x02
	MPAMarkerError         = 0x03 // marker and ULPDU length disagree on the FPDU start
	MPAInvalidRequestReply = 0x04 // invalid MPA request or reply frame
	MPALocalCatastrophic   = 0x05 // RFC 6581: enhanced connection setup only
	MPAInsufficientIRD     = 0x06 // RFC 6581
	MPANoMatchingRTR       = 0x07 // RFC 6581

	// MPAInvalidULPDU is the old, wrong name of code 0x04.
	//
	// Deprecated: use MPAInvalidRequestReply.
	MPAInvalidULPDU = MPAInvalidRequestReply

	// TerminateHeaderLen is the fixed part of the Terminate payload.
	TerminateHeaderLen = 4
)

// Bits of byte 2 of the Terminate payload, the Hdrct field (siw: TERM_FLAG_M,
// TERM_FLAG_D, TERM_FLAG_R on the big-endian 32-bit control word, i.e.
// 0x00008000, 0x00004000, 0x00002000).
const (
	terminateHdrctM         = 0x80 // DDP segment length valid
	terminateHdrctD         = 0x40 // DDP header (and its segment length field) included
	terminateHdrctR         = 0x20 // RDMAP header included
	terminateHdrctMask      = 0xe0
	terminateSegLenFieldLen = 2
)

// Terminate is the payload of an RDMAP Terminate message (RFC 5040 §4.8),
// carried after its own untagged DDP header (QN 2, MO 0, L set; siw sends
// MSN 1 and checks it on receipt).
//
// Layout, as siw builds it (siw_qp.c siw_send_terminate) and parses it
// (siw_qp_rx.c siw_proc_terminate):
//
//	byte 0     layer (high nibble) | error type (low nibble)
//	byte 1     error code
//	byte 2     M (0x80) | D (0x40) | R (0x20) | 5 reserved bits
//	byte 3     reserved
//	if D:      DDP segment length (2 bytes, big-endian), then the
//	           offending DDP header, 14 bytes if its T flag is set, else 18
//	if R:      the offending Read Request's RDMA header (28 bytes)
//
// The segment length field is present whenever D is set; M only says
// whether its value is meaningful. siw sets M and D together, and expects a
// segment length and header whenever M is set, so set SegLenValid only with
// a DDPHeader.
type Terminate struct {
	Layer, EType, Code uint8
	// SegLenValid is the M bit: DDPSegLen is meaningful. DDPSegLen is sent
	// whenever DDPHeader is; siw fills it with the offending segment's
	// ULPDU length minus its DDP/RDMAP header length (its payload length),
	// so treat the value as informative only.
	SegLenValid bool
	DDPSegLen   uint16
	// DDPHeader is the offending DDP header (14 or 18 bytes, with its
	// RDMAP control byte) when non-nil, which sets the D bit.
	DDPHeader []byte
	// RDMAPHeader, when non-nil, sets the R bit and is sent after the DDP
	// header: the offending Read Request's 28-byte RDMA header. It may be
	// empty: siw sets R without appending anything when it reports a
	// remote protection error on a Send, and ParseTerminate returns an
	// empty, non-nil RDMAPHeader then, so the R bit survives a round trip.
	RDMAPHeader []byte
}

// Append encodes t's payload (after its own untagged DDP header) at the
// end of b.
func (t *Terminate) Append(b []byte) []byte {
	var hc byte
	if t.SegLenValid {
		hc |= terminateHdrctM
	}
	if t.DDPHeader != nil {
		hc |= terminateHdrctD
	}
	if t.RDMAPHeader != nil {
		hc |= terminateHdrctR
	}
	b = append(b, t.Layer<<4|t.EType&0x0f, t.Code, hc, 0)
	if t.DDPHeader != nil {
		b = binary.BigEndian.AppendUint16(b, t.DDPSegLen)
		b = append(b, t.DDPHeader...)
	}
	return append(b, t.RDMAPHeader...)
}

// Len is the encoded size of t's payload.
func (t *Terminate) Len() int {
	n := TerminateHeaderLen + len(t.RDMAPHeader)
	if t.DDPHeader != nil {
		n += terminateSegLenFieldLen + len(t.DDPHeader)
	}
	return n
}

// ParseTerminate decodes a Terminate payload. DDPHeader and RDMAPHeader
// alias b. The offending headers are not validated (they may be what was
// wrong); only their length is taken from the T flag of the DDP header.
// With R set, the 28-byte RDMA header is required unless the DDP header is
// present and is not a Read Request's (siw's Send case, see Terminate).
// Bytes after the last included field are ignored.
func ParseTerminate(b []byte) (Terminate, error) {
	if len(b) < TerminateHeaderLen {
		return Terminate{}, ErrShort
	}
	t := Terminate{Layer: b[0] >> 4, EType: b[0] & 0x0f, Code: b[1]}
	hc := b[2] & terminateHdrctMask
	t.SegLenValid = hc&terminateHdrctM != 0
	rest := b[TerminateHeaderLen:]
	readRequest := true
	if hc&terminateHdrctD != 0 {
		if len(rest) < terminateSegLenFieldLen+1 {
			return t, ErrShort
		}
		t.DDPSegLen = binary.BigEndian.Uint16(rest[0:2])
		rest = rest[terminateSegLenFieldLen:]
		n := HeaderLenFromControl(rest[0])
		if len(rest) < n {
			return t, ErrShort
		}
		t.DDPHeader = rest[:n:n]
		readRequest = rest[1]&rdmapOpMask == OpReadRequest
		rest = rest[n:]
	}
	if hc&terminateHdrctR != 0 {
		if !readRequest {
			t.RDMAPHeader = rest[:0:0]
			return t, nil
		}
		if len(rest) < ReadRequestLen {
			return t, ErrShort
		}
		t.RDMAPHeader = rest[:ReadRequestLen:ReadRequestLen]
	}
	return t, nil
}

func (t Terminate) String() string {
	return fmt.Sprintf("terminate layer %d type %d code %#02x", t.Layer, t.EType, t.Code)
}

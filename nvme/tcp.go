package nvme

import (
	"encoding/binary"
	"hash/crc32"
)

// NVMe/TCP transport binding: the protocol data units (PDUs) a host and a
// controller exchange on one TCP connection per queue
// (shared/docs/nvmeof-wire.md §5). Every PDU starts with the 8-byte common
// header; the PDU-specific header follows, then (if the header digest was
// negotiated) a 4-byte CRC32C of the header, then the data, then (if the
// data digest was negotiated and there is data) a CRC32C of the data.
// Everything is little-endian.

// PDU types.
const (
	TCPICReq       uint8 = 0x00
	TCPICResp      uint8 = 0x01
	TCPH2CTermReq  uint8 = 0x02
	TCPC2HTermReq  uint8 = 0x03
	TCPCapsuleCmd  uint8 = 0x04
	TCPCapsuleResp uint8 = 0x05
	TCPH2CData     uint8 = 0x06
	TCPC2HData     uint8 = 0x07
	TCPR2T         uint8 = 0x09
)

// Common header FLAGS bits.
const (
	TCPFlagHDGST   uint8 = 1 << 0 // a header digest follows the header
	TCPFlagDDGST   uint8 = 1 << 1 // a data digest follows the data
	TCPFlagLastPDU uint8 = 1 << 2 // H2CData/C2HData: the last PDU of the transfer
	TCPFlagSuccess uint8 = 1 << 3 // C2HData: the command succeeded, no CapsuleResp follows
)

// ICReq/ICResp DGST bits.
const (
	TCPDigestHeader uint8 = 1 << 0
	TCPDigestData   uint8 = 1 << 1
)

// Sizes, in bytes.
const (
	TCPCommonHeaderSize = 8
	// TCPICSize is HLEN and PLEN of ICReq and ICResp.
	TCPICSize = 128
	// TCPTermReqHeaderSize is HLEN of a TermReq; at most
	// TCPTermReqMaxData bytes of the offending PDU's header follow.
	TCPTermReqHeaderSize = 24
	TCPTermReqMaxData    = 128
	// TCPCapsuleCmdHeaderSize is HLEN of a CapsuleCmd: the common header
	// and the 64-byte SQE.
	TCPCapsuleCmdHeaderSize = TCPCommonHeaderSize + SQESize
	// TCPCapsuleRespSize is HLEN of a CapsuleResp: the common header and
	// the 16-byte CQE.
	TCPCapsuleRespSize = TCPCommonHeaderSize + CQESize
	// TCPDataHeaderSize is HLEN of H2CData, C2HData and R2T.
	TCPDataHeaderSize = 24
	// TCPDigestSize is the size of a header or data digest.
	TCPDigestSize = 4
	// TCPMaxHeaderSize is the largest HLEN plus header digest.
	TCPMaxHeaderSize = TCPICSize + TCPDigestSize
	// TCPMinMaxH2CData is the smallest MAXH2CDATA a controller may
	// offer (a Linux host refuses less, or a value not a multiple of 4).
	TCPMinMaxH2CData = 4096
	// TCPAdminInCapsule is the in-capsule data a controller must take on
	// the admin queue and for every fabrics command on any queue
	// (NVME_TCP_ADMIN_CCSZ: a Linux host sends Connect's 1024 bytes and
	// authentication messages inline whatever IOCCSZ says).
	TCPAdminInCapsule = 8192
)

// Well-known NVMe/TCP ports.
const (
	TCPPort          = "4420" // I/O controllers
	TCPDiscoveryPort = "8009" // discovery controllers
)

// Fatal error status (FES) of a TermReq.
const (
	TCPFESInvalidHeaderField uint16 = 0x01 // FEI: byte offset of the field
	TCPFESPDUSequence        uint16 = 0x02
	TCPFESHeaderDigest       uint16 = 0x03
	TCPFESDataOutOfRange     uint16 = 0x04
	TCPFESDataLimitExceeded  uint16 = 0x05 // also: too many R2Ts
	TCPFESUnsupportedParam   uint16 = 0x06 // FEI: byte offset of the field
)

// Byte offsets of common header fields, for FEI.
const (
	TCPOffType  = 0
	TCPOffFlags = 1
	TCPOffHLen  = 2
	TCPOffPDO   = 3
	TCPOffPLen  = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// TCPDigest is the CRC32C of b as NVMe/TCP digests compute it (initial
// value all ones, final XOR all ones).
func TCPDigest(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// TCPDigestUpdate continues a digest over more bytes:
// TCPDigestUpdate(TCPDigest(a), b) == TCPDigest(a ++ b).
func TCPDigestUpdate(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// TCPHeader is the 8-byte common header of every PDU.
//
//	byte 0    PDU-type
//	byte 1    FLAGS
//	byte 2    HLEN  header length, without the header digest
//	byte 3    PDO   offset of the data from the start of the PDU (0: none)
//	bytes 4-7 PLEN  total length: header, digests, padding and data
type TCPHeader struct {
	Type  uint8
	Flags uint8
	HLen  uint8
	PDO   uint8
	PLen  uint32
}

// Marshal writes the header into b[:8].
func (h *TCPHeader) Marshal(b []byte) {
	_ = b[7]
	b[0], b[1], b[2], b[3] = h.Type, h.Flags, h.HLen, h.PDO
	binary.LittleEndian.PutUint32(b[4:8], h.PLen)
}

// Unmarshal reads the header from b[:8].
func (h *TCPHeader) Unmarshal(b []byte) error {
	if len(b) < TCPCommonHeaderSize {
		return ErrShortBuffer
	}
	h.Type, h.Flags, h.HLen, h.PDO = b[0], b[1], b[2], b[3]
	h.PLen = binary.LittleEndian.Uint32(b[4:8])
	return nil
}

// TCPDigests are the digests negotiated on a connection.
type TCPDigests struct{ Header, Data bool }

// DGST returns the ICReq/ICResp DGST byte.
func (d TCPDigests) DGST() uint8 {
	var v uint8
	if d.Header {
		v |= TCPDigestHeader
	}
	if d.Data {
		v |= TCPDigestData
	}
	return v
}

// TCPDigestsOf decodes a DGST byte (its reserved bits ignored).
func TCPDigestsOf(dgst uint8) TCPDigests {
	return TCPDigests{Header: dgst&TCPDigestHeader != 0, Data: dgst&TCPDigestData != 0}
}

// HeaderDigestLen is 4 when header digests are on, else 0.
func (d TCPDigests) HeaderDigestLen() int {
	if d.Header {
		return TCPDigestSize
	}
	return 0
}

// DataDigestLen is 4 when data digests are on, else 0.
func (d TCPDigests) DataDigestLen() int {
	if d.Data {
		return TCPDigestSize
	}
	return 0
}

// TCPFault is why a PDU header is refused: the FES and FEI a TermReq
// reports, and a constant phrase for logs. The zero TCPFault (FES 0)
// means the header is acceptable.
type TCPFault struct {
	FES  uint16
	FEI  uint32
	What string
}

// OK reports whether the header was accepted.
func (f TCPFault) OK() bool { return f.FES == 0 }

func (f TCPFault) Error() string { return "nvme/tcp: " + f.What }

func fault(fes uint16, fei uint32, what string) TCPFault {
	return TCPFault{FES: fes, FEI: fei, What: what}
}

// TCPLimits are what the receiver of a PDU accepts beyond the PDU's own
// rules: the digests negotiated and the largest data a PDU may carry.
type TCPLimits struct {
	Digests TCPDigests
	// MaxData is the largest DATAL (H2CData, C2HData) or in-capsule
	// data (CapsuleCmd) of one PDU. 0: no limit beyond PLEN's.
	MaxData uint32
}

// Check checks a received PDU's common header against the rules of its
// type (HLEN, flags, PDO and PLEN consistent with the digests negotiated)
// and the receiver's limits. fromHost says the receiver is the
// controller: it accepts only host-to-controller types, and the host only
// controller-to-host ones. ICReq and ICResp are checked here too, but only
// the connection's first PDU may be one (the caller's rule). DataLen
// returns how many data bytes an accepted header announces.
func (h *TCPHeader) Check(fromHost bool, l TCPLimits) TCPFault {
	hd := uint32(l.Digests.HeaderDigestLen())
	dd := uint32(l.Digests.DataDigestLen())
	var hlen uint32
	var allowed uint8
	data := false   // the type may carry data
	needed := false // ... and must
	switch h.Type {
	case TCPICReq, TCPICResp:
		if (h.Type == TCPICReq) != fromHost {
			return fault(TCPFESInvalidHeaderField, TCPOffType, "PDU type not sent in this direction")
		}
		if h.HLen != TCPICSize {
			return fault(TCPFESInvalidHeaderField, TCPOffHLen, "ICReq/ICResp HLEN is not 128")
		}
		if h.PLen != TCPICSize {
			return fault(TCPFESInvalidHeaderField, TCPOffPLen, "ICReq/ICResp PLEN is not 128")
		}
		if h.Flags != 0 {
			return fault(TCPFESInvalidHeaderField, TCPOffFlags, "ICReq/ICResp with flags")
		}
		if h.PDO != 0 {
			return fault(TCPFESInvalidHeaderField, TCPOffPDO, "ICReq/ICResp with a PDO")
		}
		return TCPFault{}
	case TCPH2CTermReq, TCPC2HTermReq:
		if (h.Type == TCPH2CTermReq) != fromHost {
			return fault(TCPFESInvalidHeaderField, TCPOffType, "PDU type not sent in this direction")
		}
		if h.HLen != TCPTermReqHeaderSize {
			return fault(TCPFESInvalidHeaderField, TCPOffHLen, "TermReq HLEN is not 24")
		}
		if h.PLen < TCPTermReqHeaderSize || h.PLen > TCPTermReqHeaderSize+TCPTermReqMaxData {
			return fault(TCPFESInvalidHeaderField, TCPOffPLen, "TermReq PLEN outside 24..152")
		}
		return TCPFault{} // never digested; flags and PDO not looked at
	case TCPCapsuleCmd:
		hlen, allowed, data = TCPCapsuleCmdHeaderSize, TCPFlagHDGST|TCPFlagDDGST, true
		if !fromHost {
			return fault(TCPFESInvalidHeaderField, TCPOffType, "PDU type not sent in this direction")
		}
	case TCPH2CData:
		hlen, allowed, data, needed = TCPDataHeaderSize, TCPFlagHDGST|TCPFlagDDGST|TCPFlagLastPDU, true, true
		if !fromHost {
			return fault(TCPFESInvalidHeaderField, TCPOffType, "PDU type not sent in this direction")
		}
	case TCPCapsuleResp:
		hlen, allowed = TCPCapsuleRespSize, TCPFlagHDGST
		if fromHost {
			return fault(TCPFESInvalidHeaderField, TCPOffType, "PDU type not sent in this direction")
		}
	case TCPC2HData:
		hlen, allowed, data, needed = TCPDataHeaderSize, TCPFlagHDGST|TCPFlagDDGST|TCPFlagLastPDU|TCPFlagSuccess, true, true
		if fromHost {
			return fault(TCPFESInvalidHeaderField, TCPOffType, "PDU type not sent in this direction")
		}
		if h.Flags&TCPFlagSuccess != 0 && h.Flags&TCPFlagLastPDU == 0 {
			return fault(TCPFESInvalidHeaderField, TCPOffFlags, "C2HData SUCCESS without LAST_PDU")
		}
	case TCPR2T:
		hlen, allowed = TCPDataHeaderSize, TCPFlagHDGST
		if fromHost {
			return fault(TCPFESInvalidHeaderField, TCPOffType, "PDU type not sent in this direction")
		}
	default:
		return fault(TCPFESInvalidHeaderField, TCPOffType, "unknown PDU type")
	}
	if uint32(h.HLen) != hlen {
		return fault(TCPFESInvalidHeaderField, TCPOffHLen, "HLEN wrong for the PDU type")
	}
	if h.Flags&^allowed != 0 {
		return fault(TCPFESInvalidHeaderField, TCPOffFlags, "flag not allowed for the PDU type")
	}
	if (h.Flags&TCPFlagHDGST != 0) != l.Digests.Header {
		return fault(TCPFESInvalidHeaderField, TCPOffFlags, "HDGSTF does not match the header digest negotiated")
	}
	start := hlen + hd // where data starts: HPDA/CPDA 0, so no padding
	if h.PLen < start {
		return fault(TCPFESInvalidHeaderField, TCPOffPLen, "PLEN shorter than the header")
	}
	if h.PLen == start {
		if needed {
			return fault(TCPFESInvalidHeaderField, TCPOffPLen, "data PDU without data")
		}
		if h.PDO != 0 {
			return fault(TCPFESInvalidHeaderField, TCPOffPDO, "PDO set on a PDU without data")
		}
		if h.Flags&TCPFlagDDGST != 0 {
			return fault(TCPFESInvalidHeaderField, TCPOffFlags, "DDGSTF on a PDU without data")
		}
		return TCPFault{}
	}
	if !data {
		return fault(TCPFESInvalidHeaderField, TCPOffPLen, "PLEN longer than a PDU without data")
	}
	if uint32(h.PDO) != start {
		return fault(TCPFESInvalidHeaderField, TCPOffPDO, "PDO is not where the data starts")
	}
	if (h.Flags&TCPFlagDDGST != 0) != l.Digests.Data {
		return fault(TCPFESInvalidHeaderField, TCPOffFlags, "DDGSTF does not match the data digest negotiated")
	}
	if h.PLen <= start+dd {
		return fault(TCPFESInvalidHeaderField, TCPOffPLen, "PLEN leaves no room for data")
	}
	if l.MaxData > 0 && h.PLen-start-dd > l.MaxData {
		return fault(TCPFESDataLimitExceeded, TCPOffPLen, "PDU data beyond the limit")
	}
	return TCPFault{}
}

// DataLen returns the data bytes of a PDU whose header Check accepted
// with digests d: PLEN less the header, its digest and the data digest.
func (h *TCPHeader) DataLen(d TCPDigests) uint32 {
	if h.PDO == 0 {
		return 0
	}
	return h.PLen - uint32(h.PDO) - uint32(d.DataDigestLen())
}

// TCPICReqPDU is the host's Initialize Connection Request.
//
//	bytes 8-9   PFV     PDU format version, 0
//	byte  10    HPDA    host PDU data alignment, 0's based dwords
//	byte  11    DGST    digests the host asks for
//	bytes 12-15 MAXR2T  R2Ts outstanding per command, 0's based
type TCPICReqPDU struct {
	PFV    uint16
	HPDA   uint8
	DGST   uint8
	MaxR2T uint32
}

// Marshal writes the whole 128-byte PDU, common header included.
func (r *TCPICReqPDU) Marshal(b *[TCPICSize]byte) {
	putIC(b, TCPICReq, r.PFV, r.HPDA, r.DGST, r.MaxR2T)
}

// Unmarshal reads the PDU-specific fields from a 128-byte PDU.
func (r *TCPICReqPDU) Unmarshal(b []byte) (err error) {
	r.PFV, r.HPDA, r.DGST, r.MaxR2T, err = getIC(b)
	return err
}

// TCPICRespPDU is the controller's Initialize Connection Response.
//
//	bytes 8-9   PFV         0
//	byte  10    CPDA        controller PDU data alignment, 0's based dwords
//	byte  11    DGST        digests enabled (a Linux host requires the echo)
//	bytes 12-15 MAXH2CDATA  largest DATAL of one H2CData PDU, bytes
type TCPICRespPDU struct {
	PFV        uint16
	CPDA       uint8
	DGST       uint8
	MaxH2CData uint32
}

// Marshal writes the whole 128-byte PDU, common header included.
func (r *TCPICRespPDU) Marshal(b *[TCPICSize]byte) {
	putIC(b, TCPICResp, r.PFV, r.CPDA, r.DGST, r.MaxH2CData)
}

// Unmarshal reads the PDU-specific fields from a 128-byte PDU.
func (r *TCPICRespPDU) Unmarshal(b []byte) (err error) {
	r.PFV, r.CPDA, r.DGST, r.MaxH2CData, err = getIC(b)
	return err
}

// putIC writes an ICReq or ICResp: the two share one layout — PFV, the
// sender's PDU data alignment (HPDA, CPDA), DGST and a 32-bit limit
// (MAXR2T, MAXH2CDATA) — and are zero to byte 127.
func putIC(b *[TCPICSize]byte, typ uint8, pfv uint16, pda, dgst uint8, limit uint32) {
	*b = [TCPICSize]byte{}
	(&TCPHeader{Type: typ, HLen: TCPICSize, PLen: TCPICSize}).Marshal(b[:])
	binary.LittleEndian.PutUint16(b[8:10], pfv)
	b[10], b[11] = pda, dgst
	binary.LittleEndian.PutUint32(b[12:16], limit)
}

// getIC reads the fields putIC writes.
func getIC(b []byte) (pfv uint16, pda, dgst uint8, limit uint32, err error) {
	if len(b) < TCPICSize {
		return 0, 0, 0, 0, ErrShortBuffer
	}
	return binary.LittleEndian.Uint16(b[8:10]), b[10], b[11], binary.LittleEndian.Uint32(b[12:16]), nil
}

// ICReq field offsets, for FEI.
const (
	TCPOffPFV    = 8
	TCPOffHPDA   = 10
	TCPOffDGST   = 11
	TCPOffMaxR2T = 12
)

// TCPDataPDU is the PDU-specific header of H2CData, C2HData and R2T.
//
//	bytes 8-9   CCCID  the command's CID
//	bytes 10-11 TTAG   transfer tag (R2T, H2CData; reserved in C2HData)
//	bytes 12-15 DATAO  offset of the data in the command's buffer (R2TO)
//	bytes 16-19 DATAL  bytes of data (R2TL for an R2T)
//	bytes 20-23 reserved
type TCPDataPDU struct {
	CCCID  uint16
	TTag   uint16
	Offset uint32
	Length uint32
}

// Marshal writes the 16 bytes after the common header into b[8:24].
func (d *TCPDataPDU) Marshal(b []byte) {
	_ = b[23]
	binary.LittleEndian.PutUint16(b[8:10], d.CCCID)
	binary.LittleEndian.PutUint16(b[10:12], d.TTag)
	binary.LittleEndian.PutUint32(b[12:16], d.Offset)
	binary.LittleEndian.PutUint32(b[16:20], d.Length)
	clear(b[20:24])
}

// Unmarshal reads the fields from b[8:24].
func (d *TCPDataPDU) Unmarshal(b []byte) error {
	if len(b) < TCPDataHeaderSize {
		return ErrShortBuffer
	}
	d.CCCID = binary.LittleEndian.Uint16(b[8:10])
	d.TTag = binary.LittleEndian.Uint16(b[10:12])
	d.Offset = binary.LittleEndian.Uint32(b[12:16])
	d.Length = binary.LittleEndian.Uint32(b[16:20])
	return nil
}

// Data PDU field offsets, for FEI.
const (
	TCPOffCCCID = 8
	TCPOffTTag  = 10
	TCPOffDataO = 12
	TCPOffDataL = 16
)

// TCPTermReqPDU is the fixed part of an H2CTermReq or C2HTermReq.
//
//	bytes 8-9   FES  fatal error status
//	bytes 10-13 FEI  fatal error information (not 4-byte aligned)
//	bytes 14-23 reserved
//
// Up to 128 bytes of the offending PDU's header follow.
type TCPTermReqPDU struct {
	FES uint16
	FEI uint32
}

// MarshalTermReq writes a whole TermReq of type typ (TCPH2CTermReq or
// TCPC2HTermReq) into b, with as much of the offending header bad as fits
// in 128 bytes, and returns its length. b must hold 152 bytes.
func MarshalTermReq(b []byte, typ uint8, f TCPFault, bad []byte) int {
	if len(bad) > TCPTermReqMaxData {
		bad = bad[:TCPTermReqMaxData]
	}
	n := TCPTermReqHeaderSize + len(bad)
	h := TCPHeader{Type: typ, HLen: TCPTermReqHeaderSize, PLen: uint32(n)}
	if len(bad) > 0 {
		h.PDO = TCPTermReqHeaderSize
	}
	h.Marshal(b)
	clear(b[8:TCPTermReqHeaderSize])
	binary.LittleEndian.PutUint16(b[8:10], f.FES)
	binary.LittleEndian.PutUint32(b[10:14], f.FEI)
	copy(b[TCPTermReqHeaderSize:], bad)
	return n
}

// Unmarshal reads FES and FEI from a TermReq.
func (t *TCPTermReqPDU) Unmarshal(b []byte) error {
	if len(b) < TCPTermReqHeaderSize {
		return ErrShortBuffer
	}
	t.FES = binary.LittleEndian.Uint16(b[8:10])
	t.FEI = binary.LittleEndian.Uint32(b[10:14])
	return nil
}

// PutTCPHeaderDigest writes the header digest of b[:hlen] at b[hlen:] and
// returns hlen+4. The caller sets HDGSTF and counts the digest in PLEN.
func PutTCPHeaderDigest(b []byte, hlen int) int {
	binary.LittleEndian.PutUint32(b[hlen:hlen+TCPDigestSize], TCPDigest(b[:hlen]))
	return hlen + TCPDigestSize
}

// TCPHeaderDigestOK reports whether the 4 bytes at b[hlen:] are the digest
// of b[:hlen].
func TCPHeaderDigestOK(b []byte, hlen int) bool {
	return binary.LittleEndian.Uint32(b[hlen:hlen+TCPDigestSize]) == TCPDigest(b[:hlen])
}

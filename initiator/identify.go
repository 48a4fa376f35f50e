package initiator

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/blk-project/blk/nvme"
)

// The few Identify fields the host reads, at the offsets of
// shared/docs/nvmeof-wire.md §3.2 (NVMe base specification). Package nvme
// will grow full Identify structures; until then the host keeps its own
// private, minimal decoding here.

// identifySize is the length of every Identify data structure.
const identifySize = 4096

// Identify Controller offsets.
const (
	idCtrlSN        = 4    // 20 bytes ASCII
	idCtrlMN        = 24   // 40 bytes ASCII
	idCtrlFR        = 64   // 8 bytes ASCII
	idCtrlMDTS      = 77   // 1
	idCtrlCNTLID    = 78   // 2
	idCtrlVER       = 80   // 4
	idCtrlRTD3E     = 88   // 4, µs
	idCtrlOAES      = 92   // 4
	idCtrlCNTRLTYPE = 111  // 1
	idCtrlKAS       = 320  // 2, 100 ms units
	idCtrlMAXCMD    = 514  // 2
	idCtrlNN        = 516  // 4
	idCtrlONCS      = 520  // 2
	idCtrlFUSES     = 522  // 2
	idCtrlVWC       = 525  // 1
	idCtrlSGLS      = 536  // 4
	idCtrlSUBNQN    = 768  // 256
	idCtrlIOCCSZ    = 1792 // 4, 16-byte units
	idCtrlIORCSZ    = 1796 // 4, 16-byte units
	idCtrlICDOFF    = 1800 // 2, 16-byte units
)

// Identify Controller bits the host uses.
const (
	oncsDSM         = 1 << 2
	oncsWriteZeroes = 1 << 3
	vwcPresent      = 1 << 0
	sglsSupported   = 3 << 0  // SGLs supported (bits 1:0 not 0)
	sglsKeyed       = 1 << 2  // keyed SGL data block (RDMA)
	sglsOffset      = 1 << 20 // SGL address as offset: in-capsule data
	oaesNSAttr      = 1 << 8  // namespace attribute notices
	cntrlTypeIO     = 1
	cntrlTypeDisc   = 2
)

// ctrlIdentity is what the host keeps of Identify Controller.
type ctrlIdentity struct {
	SerialNumber, Model, Firmware string
	MDTS                          uint8
	CNTLID                        uint16
	Version                       nvme.Version
	RTD3E                         uint32
	OAES                          uint32
	CntrlType                     uint8
	KAS                           uint16
	MaxCmd                        uint16
	NN                            uint32
	ONCS                          uint16
	FUSES                         uint16
	VWC                           uint8
	SGLS                          uint32
	SubNQN                        string
	IOCCSZ, IORCSZ                uint32
	ICDOFF                        uint16
}

func parseIdentifyController(b []byte) (ctrlIdentity, error) {
	if len(b) < identifySize {
		return ctrlIdentity{}, fmt.Errorf("%w: Identify Controller of %d bytes", ErrProtocol, len(b))
	}
	le := binary.LittleEndian
	var nqn nvme.NQNField
	copy(nqn[:], b[idCtrlSUBNQN:idCtrlSUBNQN+256])
	return ctrlIdentity{
		SerialNumber: asciiField(b[idCtrlSN : idCtrlSN+20]),
		Model:        asciiField(b[idCtrlMN : idCtrlMN+40]),
		Firmware:     asciiField(b[idCtrlFR : idCtrlFR+8]),
		MDTS:         b[idCtrlMDTS],
		CNTLID:       le.Uint16(b[idCtrlCNTLID:]),
		Version:      nvme.Version(le.Uint32(b[idCtrlVER:])),
		RTD3E:        le.Uint32(b[idCtrlRTD3E:]),
		OAES:         le.Uint32(b[idCtrlOAES:]),
		CntrlType:    b[idCtrlCNTRLTYPE],
		KAS:          le.Uint16(b[idCtrlKAS:]),
		MaxCmd:       le.Uint16(b[idCtrlMAXCMD:]),
		NN:           le.Uint32(b[idCtrlNN:]),
		ONCS:         le.Uint16(b[idCtrlONCS:]),
		FUSES:        le.Uint16(b[idCtrlFUSES:]),
		VWC:          b[idCtrlVWC],
		SGLS:         le.Uint32(b[idCtrlSGLS:]),
		SubNQN:       nqn.String(),
		IOCCSZ:       le.Uint32(b[idCtrlIOCCSZ:]),
		IORCSZ:       le.Uint32(b[idCtrlIORCSZ:]),
		ICDOFF:       le.Uint16(b[idCtrlICDOFF:]),
	}, nil
}

// asciiField trims the space (and NUL) padding of an Identify string.
func asciiField(b []byte) string {
	return string(bytes.TrimRight(b, " \x00"))
}

// checkIO applies the checks the Linux host makes on an I/O controller
// (nvme_init_identify, nvme_rdma_setup_ctrl, nvme_tcp_setup_ctrl): the
// CNTLID is the one Connect returned, KAS ≠ 0, IOCCSZ ≥ 4, IORCSZ ≥ 1,
// and the transport's checks (checkTransport).
func (id *ctrlIdentity) checkIO(cntlid uint16, tcp bool) error {
	switch {
	case id.CNTLID != cntlid:
		return fmt.Errorf("%w: Identify CNTLID %#x differs from Connect's %#x", ErrProtocol, id.CNTLID, cntlid)
	case id.KAS == 0:
		return fmt.Errorf("%w: keep-alive not supported (KAS 0)", ErrProtocol)
	case id.IOCCSZ < 4:
		return fmt.Errorf("%w: IOCCSZ %d below 4", ErrProtocol, id.IOCCSZ)
	case id.IORCSZ < 1:
		return fmt.Errorf("%w: IORCSZ %d below 1", ErrProtocol, id.IORCSZ)
	}
	return id.checkTransport(tcp)
}

// checkTransport is the part of the checks that also applies to a
// discovery controller: ICDOFF = 0, and for RDMA SGLS bit 2 (keyed SGL
// data blocks), for TCP SGLS bits 1:0 ≠ 0 (SGLs supported at all: Linux's
// "Mandatory sgls are not supported").
func (id *ctrlIdentity) checkTransport(tcp bool) error {
	switch {
	case id.ICDOFF != 0:
		return fmt.Errorf("%w: ICDOFF %d not supported (must be 0)", ErrProtocol, id.ICDOFF)
	case tcp:
		if id.SGLS&sglsSupported == 0 {
			return fmt.Errorf("%w: SGLs not supported (SGLS %#x, bits 1:0 are 0)", ErrProtocol, id.SGLS)
		}
	case id.SGLS&sglsKeyed == 0:
		return fmt.Errorf("%w: keyed SGL data blocks not supported (SGLS %#x lacks bit 2)", ErrProtocol, id.SGLS)
	}
	return nil
}

// ioInCapsule is the in-capsule data size of I/O queues: IOCCSZ×16 − 64
// bytes; for RDMA only when SGLS bit 20 (SGL offset, i.e. in-capsule data)
// is set, else 0 (Linux nvme-rdma); NVMe/TCP always carries in-capsule
// data (Linux nvme-tcp: cmnd_capsule_len − 64).
func (id *ctrlIdentity) ioInCapsule(tcp bool) int {
	if (!tcp && id.SGLS&sglsOffset == 0) || id.IOCCSZ < 4 {
		return 0
	}
	return int(min(id.IOCCSZ, 1<<20))*16 - nvme.SQESize
}

// mdtsBytes is the controller's maximum data transfer size in bytes (MDTS
// is a power of two in units of the minimum page size, 4 KiB since the host
// requires CAP.MPSMIN = 0), or 0 for no limit.
func (id *ctrlIdentity) mdtsBytes() int {
	if id.MDTS == 0 {
		return 0
	}
	if id.MDTS >= 20 {
		return 1 << 31 // beyond anything the host uses
	}
	return 4096 << id.MDTS
}

// Identify Namespace offsets.
const (
	idNsNSZE   = 0
	idNsNCAP   = 8
	idNsNLBAF  = 25
	idNsFLBAS  = 26
	idNsDLFEAT = 33
	idNsLBAF   = 128 // 4 bytes each: MS 15:0, LBADS 23:16, RP 25:24
)

// nsIdentity is what the host keeps of Identify Namespace.
type nsIdentity struct {
	Blocks    uint64 // NSZE
	Capacity  uint64 // NCAP
	BlockSize int    // 2^LBADS of the format FLBAS selects
	Metadata  int    // MS of that format
	DLFEAT    uint8
}

func parseIdentifyNamespace(b []byte) (nsIdentity, error) {
	if len(b) < identifySize {
		return nsIdentity{}, fmt.Errorf("%w: Identify Namespace of %d bytes", ErrProtocol, len(b))
	}
	le := binary.LittleEndian
	nlbaf := int(b[idNsNLBAF]) // 0's based
	flbas := b[idNsFLBAS]
	idx := int(flbas & 0x0F)
	if nlbaf >= 16 {
		// FLBAS bits 6:5 are the high bits of the index when more than
		// 16 formats exist.
		idx |= int(flbas>>5&3) << 4
	}
	if idx > nlbaf || idx >= 64 {
		return nsIdentity{}, fmt.Errorf("%w: FLBAS selects format %d of %d", ErrProtocol, idx, nlbaf+1)
	}
	lbaf := le.Uint32(b[idNsLBAF+4*idx:])
	lbads := uint8(lbaf >> 16)
	if lbads < 9 || lbads > 16 {
		return nsIdentity{}, fmt.Errorf("%w: LBADS %d not in [9, 16]", ErrProtocol, lbads)
	}
	return nsIdentity{
		Blocks:    le.Uint64(b[idNsNSZE:]),
		Capacity:  le.Uint64(b[idNsNCAP:]),
		BlockSize: 1 << lbads,
		Metadata:  int(uint16(lbaf)),
		DLFEAT:    b[idNsDLFEAT],
	}, nil
}

// parseNSList reads an Active Namespace ID list (CNS 0x02): increasing
// NSIDs, zero-terminated, at most 1024. full reports a full page (the
// host must ask again from the last NSID).
func parseNSList(b []byte, out []uint32) (ids []uint32, full bool) {
	ids = out
	for off := 0; off+4 <= len(b) && off < identifySize; off += 4 {
		id := binary.LittleEndian.Uint32(b[off:])
		if id == 0 {
			return ids, false
		}
		ids = append(ids, id)
	}
	return ids, true
}

// Namespace identification descriptor types (CNS 0x03).
const (
	nidtEUI64 = 0x01
	nidtNGUID = 0x02
	nidtUUID  = 0x03
	nidtCSI   = 0x04
)

// nsDescriptors is what the host reads of the descriptor list.
type nsDescriptors struct {
	EUI64  [8]byte
	NGUID  [16]byte
	UUID   [16]byte
	CSI    uint8
	HasCSI bool
}

// parseNSDescriptors walks the NIDT/NIDL records until NIDL = 0. A wrong
// length for a known type stops parsing with an error (as Linux does).
func parseNSDescriptors(b []byte) (nsDescriptors, error) {
	var d nsDescriptors
	for off := 0; off+4 <= len(b) && off < identifySize; {
		nidt, nidl := b[off], int(b[off+1])
		if nidl == 0 {
			break
		}
		start := off + 4
		if start+nidl > len(b) {
			return d, fmt.Errorf("%w: descriptor %#x of %d bytes overruns the list", ErrProtocol, nidt, nidl)
		}
		want := 0
		switch nidt {
		case nidtEUI64:
			want = 8
		case nidtNGUID, nidtUUID:
			want = 16
		case nidtCSI:
			want = 1
		}
		if want != 0 && nidl != want {
			return d, fmt.Errorf("%w: descriptor %#x with length %d, want %d", ErrProtocol, nidt, nidl, want)
		}
		v := b[start : start+nidl]
		switch nidt {
		case nidtEUI64:
			copy(d.EUI64[:], v)
		case nidtNGUID:
			copy(d.NGUID[:], v)
		case nidtUUID:
			copy(d.UUID[:], v)
		case nidtCSI:
			d.CSI, d.HasCSI = v[0], true
		}
		off = start + nidl
	}
	return d, nil
}

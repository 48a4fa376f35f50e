package nvme

import "encoding/binary"

// Discovery log page sizes: a 1024-byte header, then 1024-byte entries.
const (
	DiscoveryLogHeaderSize = 1024
	DiscoveryLogEntrySize  = 1024
)

// Transport types (TRTYPE).
const (
	TrTypeRDMA uint8 = 1
	TrTypeFC   uint8 = 2
	TrTypeTCP  uint8 = 3
	TrTypeLoop uint8 = 254
)

// Address families (ADRFAM).
const (
	AdrFamIPv4 uint8 = 1
	AdrFamIPv6 uint8 = 2
	AdrFamIB   uint8 = 3
	AdrFamFC   uint8 = 4
)

// Subsystem types (SUBTYPE).
const (
	SubTypeReferral         uint8 = 1 // another discovery service
	SubTypeNVM              uint8 = 2 // NVM subsystem
	SubTypeCurrentDiscovery uint8 = 3 // this discovery subsystem
)

// TREQ bits.
const (
	TReqSecureNotSpecified uint8 = 0
	TReqSecureRequired     uint8 = 1
	TReqSecureNotRequired  uint8 = 2
	TReqDisableSQFlow      uint8 = 1 << 2 // SQ flow control disable supported
)

// EFLAGS bits.
const (
	EFlagDupRetInfo uint16 = 1 << 0
	EFlagEPCSD      uint16 = 1 << 1
)

// RDMA TSAS values.
const (
	RDMAQPTypeConnected    uint8 = 1
	RDMAQPTypeDatagram     uint8 = 2
	RDMAPrTypeNotSpecified uint8 = 1
	RDMAPrTypeIB           uint8 = 2
	RDMAPrTypeRoCE         uint8 = 3
	RDMAPrTypeRoCEv2       uint8 = 4
	RDMAPrTypeIWARP        uint8 = 5
	RDMACMSRDMACM          uint8 = 1
)

// TCP TSAS SECTYPE values: the security the port requires before ICReq.
const (
	TCPSecTypeNone  uint8 = 0 // no security
	TCPSecTypeTLS12 uint8 = 1 // TLS 1.2
	TCPSecTypeTLS13 uint8 = 2 // TLS 1.3
)

// DiscoveryLogHeader is the header of the discovery log page (LID 0x70).
//
//	bytes 0-7   GENCTR  changes whenever the log changes
//	bytes 8-15  NUMREC  number of entries
//	bytes 16-17 RECFMT  0
type DiscoveryLogHeader struct {
	GenCtr uint64
	NumRec uint64
	RecFmt uint16
}

// Marshal writes the header into b.
func (h *DiscoveryLogHeader) Marshal(b *[DiscoveryLogHeaderSize]byte) {
	*b = [DiscoveryLogHeaderSize]byte{}
	binary.LittleEndian.PutUint64(b[0:8], h.GenCtr)
	binary.LittleEndian.PutUint64(b[8:16], h.NumRec)
	binary.LittleEndian.PutUint16(b[16:18], h.RecFmt)
}

// Unmarshal reads the header from b. Only the first 18 bytes are needed,
// so a host may pass the short first read of the log (nvme-cli reads 20).
func (h *DiscoveryLogHeader) Unmarshal(b []byte) error {
	if len(b) < 18 {
		return ErrShortBuffer
	}
	h.GenCtr = binary.LittleEndian.Uint64(b[0:8])
	h.NumRec = binary.LittleEndian.Uint64(b[8:16])
	h.RecFmt = binary.LittleEndian.Uint16(b[16:18])
	return nil
}

// RDMATSAS is the RDMA form of the transport specific address subtype.
//
//	byte 0 QPTYPE, byte 1 PRTYPE, byte 2 CMS, bytes 8-9 PKEY
type RDMATSAS struct {
	QPType uint8
	PrType uint8
	CMS    uint8
	PKey   uint16
}

// TCPTSAS is the TCP form of the transport specific address subtype.
//
//	byte 0 SECTYPE (TCPSecTypeNone, TCPSecTypeTLS12, TCPSecTypeTLS13)
type TCPTSAS struct {
	SecType uint8
}

// DiscoveryLogEntry is one 1024-byte discovery log page entry.
//
//	byte  0        TRTYPE
//	byte  1        ADRFAM
//	byte  2        SUBTYPE
//	byte  3        TREQ
//	bytes 4-5      PORTID
//	bytes 6-7      CNTLID
//	bytes 8-9      ASQSZ
//	bytes 10-11    EFLAGS
//	bytes 32-63    TRSVCID  ASCII, NUL padded
//	bytes 256-511  SUBNQN
//	bytes 512-767  TRADDR   ASCII, NUL padded
//	bytes 768-1023 TSAS     transport specific (RDMATSAS for RDMA,
//	                        TCPTSAS for TCP)
type DiscoveryLogEntry struct {
	TrType  uint8
	AdrFam  uint8
	SubType uint8
	TReq    uint8
	PortID  uint16
	CNTLID  uint16
	ASQSZ   uint16
	EFlags  uint16
	TrSvcID [32]byte
	SubNQN  NQNField
	TrAddr  [256]byte
	TSAS    [256]byte
}

// SetRDMATSAS encodes t into the entry's TSAS field.
func (e *DiscoveryLogEntry) SetRDMATSAS(t RDMATSAS) {
	e.TSAS = [256]byte{}
	e.TSAS[0] = t.QPType
	e.TSAS[1] = t.PrType
	e.TSAS[2] = t.CMS
	binary.LittleEndian.PutUint16(e.TSAS[8:10], t.PKey)
}

// RDMATSAS decodes the entry's TSAS field in its RDMA form.
func (e *DiscoveryLogEntry) RDMATSAS() RDMATSAS {
	return RDMATSAS{
		QPType: e.TSAS[0],
		PrType: e.TSAS[1],
		CMS:    e.TSAS[2],
		PKey:   binary.LittleEndian.Uint16(e.TSAS[8:10]),
	}
}

// SetTCPTSAS encodes t into the entry's TSAS field.
func (e *DiscoveryLogEntry) SetTCPTSAS(t TCPTSAS) {
	e.TSAS = [256]byte{}
	e.TSAS[0] = t.SecType
}

// TCPTSAS decodes the entry's TSAS field in its TCP form.
func (e *DiscoveryLogEntry) TCPTSAS() TCPTSAS {
	return TCPTSAS{SecType: e.TSAS[0]}
}

// SetTrSvcID stores s, NUL padded. It fails if s does not fit with a NUL.
func (e *DiscoveryLogEntry) SetTrSvcID(s string) error {
	if len(s) >= len(e.TrSvcID) {
		return ErrFieldTooLong
	}
	e.TrSvcID = [32]byte{}
	copy(e.TrSvcID[:], s)
	return nil
}

// SetTrAddr stores s, NUL padded. It fails if s does not fit with a NUL.
func (e *DiscoveryLogEntry) SetTrAddr(s string) error {
	if len(s) >= len(e.TrAddr) {
		return ErrFieldTooLong
	}
	e.TrAddr = [256]byte{}
	copy(e.TrAddr[:], s)
	return nil
}

// Marshal writes the entry into b.
func (e *DiscoveryLogEntry) Marshal(b *[DiscoveryLogEntrySize]byte) {
	*b = [DiscoveryLogEntrySize]byte{}
	b[0] = e.TrType
	b[1] = e.AdrFam
	b[2] = e.SubType
	b[3] = e.TReq
	binary.LittleEndian.PutUint16(b[4:6], e.PortID)
	binary.LittleEndian.PutUint16(b[6:8], e.CNTLID)
	binary.LittleEndian.PutUint16(b[8:10], e.ASQSZ)
	binary.LittleEndian.PutUint16(b[10:12], e.EFlags)
	copy(b[32:64], e.TrSvcID[:])
	copy(b[256:512], e.SubNQN[:])
	copy(b[512:768], e.TrAddr[:])
	copy(b[768:1024], e.TSAS[:])
}

// Unmarshal reads the entry from the first 1024 bytes of b.
func (e *DiscoveryLogEntry) Unmarshal(b []byte) error {
	if len(b) < DiscoveryLogEntrySize {
		return ErrShortBuffer
	}
	e.TrType = b[0]
	e.AdrFam = b[1]
	e.SubType = b[2]
	e.TReq = b[3]
	e.PortID = binary.LittleEndian.Uint16(b[4:6])
	e.CNTLID = binary.LittleEndian.Uint16(b[6:8])
	e.ASQSZ = binary.LittleEndian.Uint16(b[8:10])
	e.EFlags = binary.LittleEndian.Uint16(b[10:12])
	copy(e.TrSvcID[:], b[32:64])
	copy(e.SubNQN[:], b[256:512])
	copy(e.TrAddr[:], b[512:768])
	copy(e.TSAS[:], b[768:1024])
	return nil
}

package nvme

import (
	"encoding/binary"
	"fmt"
)

// Sizes of the NVMe/RDMA RDMA-CM private data.
const (
	RDMACMRequestSize = 32
	RDMACMAcceptSize  = 32
	RDMACMRejectSize  = 4
)

// RDMACMRecFmt10 is the only defined record format of the private data.
const RDMACMRecFmt10 uint16 = 0

// RDMACMRequest is the private data of the host's RDMA-CM connect request.
//
//	bytes 0-1  RECFMT   0
//	bytes 2-3  QID      0 admin, 1..N I/O
//	bytes 4-5  HRQSIZE  host receive queue size (completions it can take)
//	bytes 6-7  HSQSIZE  host SQ size, 0's based; equals the Connect SQSIZE
//	bytes 8-9  CNTLID   recent Linux hosts fill it on I/O queues, 0 on admin
//	bytes 10-31 reserved
type RDMACMRequest struct {
	RecFmt  uint16
	QID     uint16
	HRQSize uint16
	HSQSize uint16
	CNTLID  uint16
}

// Marshal writes the request into b.
func (r *RDMACMRequest) Marshal(b *[RDMACMRequestSize]byte) {
	*b = [RDMACMRequestSize]byte{}
	binary.LittleEndian.PutUint16(b[0:2], r.RecFmt)
	binary.LittleEndian.PutUint16(b[2:4], r.QID)
	binary.LittleEndian.PutUint16(b[4:6], r.HRQSize)
	binary.LittleEndian.PutUint16(b[6:8], r.HSQSize)
	binary.LittleEndian.PutUint16(b[8:10], r.CNTLID)
}

// Unmarshal reads the request from b. Fewer than 32 bytes is
// ErrShortBuffer (a target answers it with RDMACMInvalidLength).
func (r *RDMACMRequest) Unmarshal(b []byte) error {
	if len(b) < RDMACMRequestSize {
		return ErrShortBuffer
	}
	r.RecFmt = binary.LittleEndian.Uint16(b[0:2])
	r.QID = binary.LittleEndian.Uint16(b[2:4])
	r.HRQSize = binary.LittleEndian.Uint16(b[4:6])
	r.HSQSize = binary.LittleEndian.Uint16(b[6:8])
	r.CNTLID = binary.LittleEndian.Uint16(b[8:10])
	return nil
}

// RDMACMAccept is the private data of the controller's RDMA-CM accept.
//
//	bytes 0-1 RECFMT   0
//	bytes 2-3 CRQSIZE  controller receive queue size
//	bytes 4-31 reserved
type RDMACMAccept struct {
	RecFmt  uint16
	CRQSize uint16
}

// Marshal writes the accept into b.
func (a *RDMACMAccept) Marshal(b *[RDMACMAcceptSize]byte) {
	*b = [RDMACMAcceptSize]byte{}
	binary.LittleEndian.PutUint16(b[0:2], a.RecFmt)
	binary.LittleEndian.PutUint16(b[2:4], a.CRQSize)
}

// Unmarshal reads the accept from b.
func (a *RDMACMAccept) Unmarshal(b []byte) error {
	if len(b) < RDMACMAcceptSize {
		return ErrShortBuffer
	}
	a.RecFmt = binary.LittleEndian.Uint16(b[0:2])
	a.CRQSize = binary.LittleEndian.Uint16(b[2:4])
	return nil
}

// RDMACMRejectStatus is the STS of an NVMe/RDMA RDMA-CM reject.
type RDMACMRejectStatus uint16

// Reject status codes.
const (
	RDMACMInvalidLength  RDMACMRejectStatus = 0x01
	RDMACMInvalidRecFmt  RDMACMRejectStatus = 0x02
	RDMACMInvalidQID     RDMACMRejectStatus = 0x03
	RDMACMInvalidHSQSize RDMACMRejectStatus = 0x04
	RDMACMInvalidHRQSize RDMACMRejectStatus = 0x05
	RDMACMNoResources    RDMACMRejectStatus = 0x06
	RDMACMInvalidIRD     RDMACMRejectStatus = 0x07
	RDMACMInvalidORD     RDMACMRejectStatus = 0x08
	// RDMACMInvalidCNTLID is in recent Linux headers only (with the CNTLID
	// field of the request).
	RDMACMInvalidCNTLID RDMACMRejectStatus = 0x09
)

var rejectNames = map[RDMACMRejectStatus]string{
	RDMACMInvalidLength:  "invalid length",
	RDMACMInvalidRecFmt:  "invalid record format",
	RDMACMInvalidQID:     "invalid queue ID",
	RDMACMInvalidHSQSize: "invalid host SQ size",
	RDMACMInvalidHRQSize: "invalid host RQ size",
	RDMACMNoResources:    "no resources",
	RDMACMInvalidIRD:     "invalid IRD",
	RDMACMInvalidORD:     "invalid ORD",
	RDMACMInvalidCNTLID:  "invalid controller ID",
}

func (s RDMACMRejectStatus) String() string {
	if n, ok := rejectNames[s]; ok {
		return n
	}
	return fmt.Sprintf("reject status %#02x", uint16(s))
}

// RDMACMReject is the private data of the controller's RDMA-CM reject.
//
//	bytes 0-1 RECFMT 0
//	bytes 2-3 STS
type RDMACMReject struct {
	RecFmt uint16
	Status RDMACMRejectStatus
}

// Marshal writes the reject into b.
func (r *RDMACMReject) Marshal(b *[RDMACMRejectSize]byte) {
	binary.LittleEndian.PutUint16(b[0:2], r.RecFmt)
	binary.LittleEndian.PutUint16(b[2:4], uint16(r.Status))
}

// Unmarshal reads the reject from b.
func (r *RDMACMReject) Unmarshal(b []byte) error {
	if len(b) < RDMACMRejectSize {
		return ErrShortBuffer
	}
	r.RecFmt = binary.LittleEndian.Uint16(b[0:2])
	r.Status = RDMACMRejectStatus(binary.LittleEndian.Uint16(b[2:4]))
	return nil
}

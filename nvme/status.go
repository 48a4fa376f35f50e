package nvme

import "fmt"

// Status is the 15-bit status field of a completion, without the phase
// bit: the wire status word shifted right by one. This is the same
// numbering as the Linux NVME_SC_* constants, so SCT 1 / SC 0x82 is 0x182.
//
//	bits 7:0   SC   status code
//	bits 10:8  SCT  status code type
//	bits 12:11 CRD  command retry delay
//	bit  13    M    more (details in the error log)
//	bit  14    DNR  do not retry
type Status uint16

// Status code types.
const (
	SCTGeneric         uint8 = 0
	SCTCommandSpecific uint8 = 1
	SCTMedia           uint8 = 2
	SCTPath            uint8 = 3
	SCTVendor          uint8 = 7
)

// Status flag bits.
const (
	StatusMore    Status = 1 << 13
	StatusDNR     Status = 1 << 14
	statusCRDMask Status = 3 << 11
	statusMask    Status = 0x7FFF
)

// MakeStatus builds a status from a status code type and status code.
func MakeStatus(sct, sc uint8) Status { return Status(sct&7)<<8 | Status(sc) }

// StatusFromWire splits a wire status word (CQE bytes 14-15) into the
// status field and the phase bit.
func StatusFromWire(w uint16) (Status, bool) { return Status(w >> 1), w&1 != 0 }

// Wire returns the wire status word with the given phase bit.
func (s Status) Wire(phase bool) uint16 {
	w := uint16(s&statusMask) << 1
	if phase {
		w |= 1
	}
	return w
}

// SC returns the status code.
func (s Status) SC() uint8 { return uint8(s) }

// SCT returns the status code type.
func (s Status) SCT() uint8 { return uint8(s>>8) & 7 }

// CRD returns the command retry delay selector (0 = none, 1-3 = CRDT1-3).
func (s Status) CRD() uint8 { return uint8(s>>11) & 3 }

// DNR reports the do-not-retry bit.
func (s Status) DNR() bool { return s&StatusDNR != 0 }

// More reports the more bit.
func (s Status) More() bool { return s&StatusMore != 0 }

// Code returns the status with DNR, More and CRD cleared: SCT and SC only,
// comparable with the Status constants.
func (s Status) Code() Status { return s & 0x7FF }

// WithDNR returns s with the do-not-retry bit set.
func (s Status) WithDNR() Status { return s | StatusDNR }

// WithMore returns s with the more bit set.
func (s Status) WithMore() Status { return s | StatusMore }

// WithCRD returns s with the command retry delay selector set to crd (0-3).
func (s Status) WithCRD(crd uint8) Status {
	return s&^statusCRDMask | Status(crd&3)<<11
}

// Success reports whether the status code is Successful Completion
// (flags ignored).
func (s Status) Success() bool { return s.Code() == StatusSuccess }

// Generic command status (SCT 0).
const (
	StatusSuccess               Status = 0x000
	StatusInvalidOpcode         Status = 0x001
	StatusInvalidField          Status = 0x002
	StatusCIDConflict           Status = 0x003
	StatusDataTransferError     Status = 0x004
	StatusPowerLoss             Status = 0x005
	StatusInternalError         Status = 0x006
	StatusAbortRequested        Status = 0x007
	StatusAbortSQDeleted        Status = 0x008
	StatusAbortFusedFail        Status = 0x009
	StatusAbortFusedMissing     Status = 0x00A
	StatusInvalidNamespace      Status = 0x00B
	StatusCommandSequenceError  Status = 0x00C
	StatusSGLInvalidLast        Status = 0x00D
	StatusSGLInvalidCount       Status = 0x00E
	StatusSGLInvalidDataLength  Status = 0x00F
	StatusSGLInvalidMetaLength  Status = 0x010
	StatusSGLInvalidType        Status = 0x011
	StatusSGLInvalidOffset      Status = 0x016
	StatusHostIDInconsistent    Status = 0x018
	StatusKeepAliveExpired      Status = 0x019
	StatusKeepAliveInvalid      Status = 0x01A
	StatusNamespaceWriteProtect Status = 0x020
	StatusCommandInterrupted    Status = 0x021
	StatusTransientTransportErr Status = 0x022
	StatusLBAOutOfRange         Status = 0x080
	StatusCapacityExceeded      Status = 0x081
	StatusNamespaceNotReady     Status = 0x082
	StatusReservationConflict   Status = 0x083
	StatusFormatInProgress      Status = 0x084
)

// Command specific status (SCT 1). Codes 0x80-0x84 mean different things
// for Fabrics Connect and for NVM I/O commands; both names are given.
const (
	StatusInvalidCQ           Status = 0x100
	StatusInvalidQID          Status = 0x101
	StatusInvalidQueueSize    Status = 0x102
	StatusAbortLimitExceeded  Status = 0x103
	StatusAERLimitExceeded    Status = 0x105
	StatusInvalidLogPage      Status = 0x109
	StatusInvalidFormat       Status = 0x10A
	StatusFeatureNotSaveable  Status = 0x10D
	StatusFeatureNotChangable Status = 0x10E
	StatusFeatureNotPerNS     Status = 0x10F

	// Fabrics Connect.
	StatusConnectIncompatibleFormat Status = 0x180
	StatusConnectControllerBusy     Status = 0x181
	StatusConnectInvalidParameters  Status = 0x182
	StatusConnectRestartDiscovery   Status = 0x183
	StatusConnectInvalidHost        Status = 0x184
	StatusDiscoveryRestart          Status = 0x190
	StatusAuthenticationRequired    Status = 0x191

	// NVM command set I/O commands.
	StatusConflictingAttributes Status = 0x180
	StatusInvalidProtectionInfo Status = 0x181
	StatusWriteToReadOnly       Status = 0x182
)

// Media and data integrity errors (SCT 2).
const (
	StatusWriteFault           Status = 0x280
	StatusUnrecoveredReadError Status = 0x281
	StatusGuardCheckError      Status = 0x282
	StatusAppTagCheckError     Status = 0x283
	StatusRefTagCheckError     Status = 0x284
	StatusCompareFailure       Status = 0x285
	StatusAccessDenied         Status = 0x286
	StatusDeallocatedBlock     Status = 0x287
)

// Path related status (SCT 3).
const (
	StatusInternalPathError   Status = 0x300
	StatusANAPersistentLoss   Status = 0x301
	StatusANAInaccessible     Status = 0x302
	StatusANATransition       Status = 0x303
	StatusControllerPathError Status = 0x360
	StatusHostPathError       Status = 0x370
	StatusHostAbortedCommand  Status = 0x371
)

var statusNames = map[Status]string{
	StatusSuccess:               "Successful Completion",
	StatusInvalidOpcode:         "Invalid Command Opcode",
	StatusInvalidField:          "Invalid Field in Command",
	StatusCIDConflict:           "Command ID Conflict",
	StatusDataTransferError:     "Data Transfer Error",
	StatusPowerLoss:             "Commands Aborted due to Power Loss Notification",
	StatusInternalError:         "Internal Error",
	StatusAbortRequested:        "Command Abort Requested",
	StatusAbortSQDeleted:        "Command Aborted due to SQ Deletion",
	StatusAbortFusedFail:        "Command Aborted due to Failed Fused Command",
	StatusAbortFusedMissing:     "Command Aborted due to Missing Fused Command",
	StatusInvalidNamespace:      "Invalid Namespace or Format",
	StatusCommandSequenceError:  "Command Sequence Error",
	StatusSGLInvalidLast:        "Invalid SGL Segment Descriptor",
	StatusSGLInvalidCount:       "Invalid Number of SGL Descriptors",
	StatusSGLInvalidDataLength:  "Data SGL Length Invalid",
	StatusSGLInvalidMetaLength:  "Metadata SGL Length Invalid",
	StatusSGLInvalidType:        "SGL Descriptor Type Invalid",
	StatusSGLInvalidOffset:      "SGL Offset Invalid",
	StatusHostIDInconsistent:    "Host Identifier Inconsistent Format",
	StatusKeepAliveExpired:      "Keep Alive Timer Expired",
	StatusKeepAliveInvalid:      "Keep Alive Timeout Invalid",
	StatusNamespaceWriteProtect: "Namespace is Write Protected",
	StatusCommandInterrupted:    "Command Interrupted",
	StatusTransientTransportErr: "Transient Transport Error",
	StatusLBAOutOfRange:         "LBA Out of Range",
	StatusCapacityExceeded:      "Capacity Exceeded",
	StatusNamespaceNotReady:     "Namespace Not Ready",
	StatusReservationConflict:   "Reservation Conflict",
	StatusFormatInProgress:      "Format In Progress",

	StatusInvalidCQ:           "Completion Queue Invalid",
	StatusInvalidQID:          "Invalid Queue Identifier",
	StatusInvalidQueueSize:    "Invalid Queue Size",
	StatusAbortLimitExceeded:  "Abort Command Limit Exceeded",
	StatusAERLimitExceeded:    "Asynchronous Event Request Limit Exceeded",
	StatusInvalidLogPage:      "Invalid Log Page",
	StatusInvalidFormat:       "Invalid Format",
	StatusFeatureNotSaveable:  "Feature Identifier Not Saveable",
	StatusFeatureNotChangable: "Feature Not Changeable",
	StatusFeatureNotPerNS:     "Feature Not Namespace Specific",

	StatusConnectIncompatibleFormat: "Connect Incompatible Format / Conflicting Attributes",
	StatusConnectControllerBusy:     "Connect Controller Busy / Invalid Protection Information",
	StatusConnectInvalidParameters:  "Connect Invalid Parameters / Attempted Write to Read Only Range",
	StatusConnectRestartDiscovery:   "Connect Restart Discovery",
	StatusConnectInvalidHost:        "Connect Invalid Host",
	StatusDiscoveryRestart:          "Discovery Restart",
	StatusAuthenticationRequired:    "Authentication Required",

	StatusWriteFault:           "Write Fault",
	StatusUnrecoveredReadError: "Unrecovered Read Error",
	StatusGuardCheckError:      "End-to-end Guard Check Error",
	StatusAppTagCheckError:     "End-to-end Application Tag Check Error",
	StatusRefTagCheckError:     "End-to-end Reference Tag Check Error",
	StatusCompareFailure:       "Compare Failure",
	StatusAccessDenied:         "Access Denied",
	StatusDeallocatedBlock:     "Deallocated or Unwritten Logical Block",

	StatusInternalPathError:   "Internal Path Error",
	StatusANAPersistentLoss:   "Asymmetric Access Persistent Loss",
	StatusANAInaccessible:     "Asymmetric Access Inaccessible",
	StatusANATransition:       "Asymmetric Access Transition",
	StatusControllerPathError: "Controller Pathing Error",
	StatusHostPathError:       "Host Pathing Error",
	StatusHostAbortedCommand:  "Command Aborted By Host",
}

// String names the status code and appends any flags. For SCT 1 codes
// 0x80-0x82 both the Fabrics Connect and the NVM I/O meaning are given,
// since the code alone does not say which command it answered.
func (s Status) String() string {
	name, ok := statusNames[s.Code()]
	if !ok {
		name = fmt.Sprintf("SCT %d SC %#02x", s.SCT(), s.SC())
	}
	if s.CRD() != 0 {
		name += fmt.Sprintf(" +CRD%d", s.CRD())
	}
	if s.More() {
		name += " +M"
	}
	if s.DNR() {
		name += " +DNR"
	}
	return name
}

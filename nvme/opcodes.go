package nvme

import "fmt"

// OpcodeFabrics is the opcode of every NVMe over Fabrics command; the
// command type is FCTYPE in byte 4.
const OpcodeFabrics uint8 = 0x7F

// Direction is the data transfer direction in opcode (or FCTYPE) bits 1:0.
type Direction uint8

// Transfer directions.
const (
	DirNone          Direction = 0 // no data
	DirHostToCtrl    Direction = 1 // write: host to controller
	DirCtrlToHost    Direction = 2 // read: controller to host
	DirBidirectional Direction = 3
)

// AdminOpcode is an admin command set opcode (admin queue, QID 0).
type AdminOpcode uint8

// Admin opcodes.
const (
	AdminDeleteSQ         AdminOpcode = 0x00
	AdminCreateSQ         AdminOpcode = 0x01
	AdminGetLogPage       AdminOpcode = 0x02
	AdminDeleteCQ         AdminOpcode = 0x04
	AdminCreateCQ         AdminOpcode = 0x05
	AdminIdentify         AdminOpcode = 0x06
	AdminAbort            AdminOpcode = 0x08
	AdminSetFeatures      AdminOpcode = 0x09
	AdminGetFeatures      AdminOpcode = 0x0A
	AdminAsyncEvent       AdminOpcode = 0x0C
	AdminNSManagement     AdminOpcode = 0x0D
	AdminFirmwareCommit   AdminOpcode = 0x10
	AdminFirmwareDownload AdminOpcode = 0x11
	AdminDeviceSelfTest   AdminOpcode = 0x14
	AdminNSAttachment     AdminOpcode = 0x15
	AdminKeepAlive        AdminOpcode = 0x18
	AdminDirectiveSend    AdminOpcode = 0x19
	AdminDirectiveRecv    AdminOpcode = 0x1A
	AdminFormatNVM        AdminOpcode = 0x80
	AdminSecuritySend     AdminOpcode = 0x81
	AdminSecurityRecv     AdminOpcode = 0x82
	AdminSanitize         AdminOpcode = 0x84
	AdminGetLBAStatus     AdminOpcode = 0x86
)

var adminNames = map[AdminOpcode]string{
	AdminDeleteSQ:         "Delete I/O SQ",
	AdminCreateSQ:         "Create I/O SQ",
	AdminGetLogPage:       "Get Log Page",
	AdminDeleteCQ:         "Delete I/O CQ",
	AdminCreateCQ:         "Create I/O CQ",
	AdminIdentify:         "Identify",
	AdminAbort:            "Abort",
	AdminSetFeatures:      "Set Features",
	AdminGetFeatures:      "Get Features",
	AdminAsyncEvent:       "Asynchronous Event Request",
	AdminNSManagement:     "Namespace Management",
	AdminFirmwareCommit:   "Firmware Commit",
	AdminFirmwareDownload: "Firmware Image Download",
	AdminDeviceSelfTest:   "Device Self-test",
	AdminNSAttachment:     "Namespace Attachment",
	AdminKeepAlive:        "Keep Alive",
	AdminDirectiveSend:    "Directive Send",
	AdminDirectiveRecv:    "Directive Receive",
	AdminFormatNVM:        "Format NVM",
	AdminSecuritySend:     "Security Send",
	AdminSecurityRecv:     "Security Receive",
	AdminSanitize:         "Sanitize",
	AdminGetLBAStatus:     "Get LBA Status",
}

func (o AdminOpcode) String() string {
	if uint8(o) == OpcodeFabrics {
		return "Fabrics"
	}
	if n, ok := adminNames[o]; ok {
		return n
	}
	return fmt.Sprintf("admin opcode %#02x", uint8(o))
}

// IOOpcode is an NVM command set opcode (I/O queues).
type IOOpcode uint8

// NVM command set opcodes.
const (
	IOFlush               IOOpcode = 0x00
	IOWrite               IOOpcode = 0x01
	IORead                IOOpcode = 0x02
	IOWriteUncorrectable  IOOpcode = 0x04
	IOCompare             IOOpcode = 0x05
	IOWriteZeroes         IOOpcode = 0x08
	IODatasetManagement   IOOpcode = 0x09
	IOVerify              IOOpcode = 0x0C
	IOReservationRegister IOOpcode = 0x0D
	IOReservationReport   IOOpcode = 0x0E
	IOReservationAcquire  IOOpcode = 0x11
	IOReservationRelease  IOOpcode = 0x15
)

var ioNames = map[IOOpcode]string{
	IOFlush:               "Flush",
	IOWrite:               "Write",
	IORead:                "Read",
	IOWriteUncorrectable:  "Write Uncorrectable",
	IOCompare:             "Compare",
	IOWriteZeroes:         "Write Zeroes",
	IODatasetManagement:   "Dataset Management",
	IOVerify:              "Verify",
	IOReservationRegister: "Reservation Register",
	IOReservationReport:   "Reservation Report",
	IOReservationAcquire:  "Reservation Acquire",
	IOReservationRelease:  "Reservation Release",
}

func (o IOOpcode) String() string {
	if uint8(o) == OpcodeFabrics {
		return "Fabrics"
	}
	if n, ok := ioNames[o]; ok {
		return n
	}
	return fmt.Sprintf("I/O opcode %#02x", uint8(o))
}

// FabricsType is the FCTYPE of a fabrics command (SQE byte 4).
type FabricsType uint8

// Fabrics command types.
const (
	FabricsPropertySet FabricsType = 0x00
	FabricsConnect     FabricsType = 0x01
	FabricsPropertyGet FabricsType = 0x04
	FabricsAuthSend    FabricsType = 0x05
	FabricsAuthRecv    FabricsType = 0x06
	// FabricsDisconnect is defined by NVMe-oF 1.1 but by neither the Linux
	// nor the SPDK headers; Linux hosts never send it.
	FabricsDisconnect FabricsType = 0x08
)

var fabricsNames = map[FabricsType]string{
	FabricsPropertySet: "Property Set",
	FabricsConnect:     "Connect",
	FabricsPropertyGet: "Property Get",
	FabricsAuthSend:    "Authentication Send",
	FabricsAuthRecv:    "Authentication Receive",
	FabricsDisconnect:  "Disconnect",
}

func (t FabricsType) String() string {
	if n, ok := fabricsNames[t]; ok {
		return n
	}
	return fmt.Sprintf("fctype %#02x", uint8(t))
}

// Feature identifiers (Get/Set Features CDW10 bits 7:0) used on fabrics.
const (
	FeatureArbitration      uint8 = 0x01
	FeaturePowerManagement  uint8 = 0x02
	FeatureTempThreshold    uint8 = 0x04
	FeatureErrorRecovery    uint8 = 0x05
	FeatureVolatileWC       uint8 = 0x06
	FeatureNumQueues        uint8 = 0x07
	FeatureIRQCoalescing    uint8 = 0x08
	FeatureWriteAtomicity   uint8 = 0x0A
	FeatureAsyncEventConfig uint8 = 0x0B
	FeatureTimestamp        uint8 = 0x0E
	FeatureKeepAliveTimer   uint8 = 0x0F
	FeatureHostBehavior     uint8 = 0x16
	FeatureHostID           uint8 = 0x81
)

// Log page identifiers (Get Log Page CDW10 bits 7:0).
const (
	LogErrorInfo       uint8 = 0x01
	LogSMART           uint8 = 0x02
	LogFirmwareSlot    uint8 = 0x03
	LogChangedNSList   uint8 = 0x04
	LogCommandsEffects uint8 = 0x05
	LogANA             uint8 = 0x0C
	LogDiscovery       uint8 = 0x70
)

// Identify CNS values (Identify CDW10 bits 7:0).
const (
	CNSNamespace        uint8 = 0x00
	CNSController       uint8 = 0x01
	CNSActiveNSList     uint8 = 0x02
	CNSNSDescriptorList uint8 = 0x03
	CNSCSNamespace      uint8 = 0x05
	CNSCSController     uint8 = 0x06
	CNSNamespaceCSIndep uint8 = 0x08
)

package initiator

import (
	"encoding/binary"

	"github.com/blk-project/blk/nvme"
)

// Builders of every submission queue entry the host sends. Each fills the
// fields of its command and leaves CID and DPTR to the queue, which sets
// them at submission (the CID from the slot, the SGL from where the data
// is). Like the Linux fabrics host, every command carries flags 0x40
// (PSDT = SGL, MPTR a buffer), fabrics commands included.

const cmdFlags = nvme.FlagSGLMetaBuf

// Command names used in errors and logs.
const (
	nameConnect     = "Connect"
	namePropertyGet = "Property Get"
	namePropertySet = "Property Set"
	nameIdentify    = "Identify"
	nameSetFeatures = "Set Features"
	nameGetLogPage  = "Get Log Page"
	nameKeepAlive   = "Keep Alive"
	nameAER         = "Asynchronous Event Request"
	nameRead        = "Read"
	nameWrite       = "Write"
	nameFlush       = "Flush"
	nameWriteZeroes = "Write Zeroes"
	nameDSM         = "Dataset Management"
)

// connectCmd is the Fabrics Connect for queue qid of depth entries
// (SQSIZE = depth−1, 0's based). kato is in ms and only meaningful on the
// admin queue (I/O Connects send 0, as Linux does).
func connectCmd(c *nvme.Command, qid uint16, depth int, kato uint32) {
	cc := nvme.ConnectCommand{
		Flags:  cmdFlags,
		RecFmt: 0,
		QID:    qid,
		SQSize: uint16(depth - 1),
		KATO:   kato,
	}
	cc.Encode(c)
}

// connectData fills the 1024 bytes of Connect data.
func connectData(b *[nvme.ConnectDataSize]byte, hostID [16]byte, cntlid uint16, subNQN, hostNQN string) error {
	d := nvme.ConnectData{HostID: hostID, CNTLID: cntlid}
	var err error
	if d.SubNQN, err = nvme.MakeNQNField(subNQN); err != nil {
		return err
	}
	if d.HostNQN, err = nvme.MakeNQNField(hostNQN); err != nil {
		return err
	}
	d.Marshal(b)
	return nil
}

// cmRequest is the RDMA CM private data of the connect request of queue
// qid: HRQSIZE = depth (the responses the host can take: one per entry),
// HSQSIZE = depth−1 (equal to the Connect SQSIZE), CNTLID on I/O queues
// (what upstream Linux sends; 0 on the admin queue).
func cmRequest(qid uint16, depth int, cntlid uint16) [nvme.RDMACMRequestSize]byte {
	r := nvme.RDMACMRequest{
		RecFmt:  nvme.RDMACMRecFmt10,
		QID:     qid,
		HRQSize: uint16(depth),
		HSQSize: uint16(depth - 1),
	}
	if qid != 0 {
		r.CNTLID = cntlid
	}
	var b [nvme.RDMACMRequestSize]byte
	r.Marshal(&b)
	return b
}

func propertyGetCmd(c *nvme.Command, off uint32, size8 bool) {
	p := nvme.PropertyCommand{Flags: cmdFlags, Offset: off, Size8: size8}
	p.Encode(c)
}

func propertySetCmd(c *nvme.Command, off uint32, value uint64) {
	p := nvme.PropertyCommand{Flags: cmdFlags, Set: true, Offset: off, Value: value}
	p.Encode(c)
}

// identifyCmd: CDW10 CNS 7:0 (CNTID 31:16 unused), CDW11 CSI 31:24.
func identifyCmd(c *nvme.Command, cns uint8, nsid uint32, csi uint8) {
	*c = nvme.Command{
		Opcode: uint8(nvme.AdminIdentify),
		Flags:  cmdFlags,
		NSID:   nsid,
		CDW10:  uint32(cns),
		CDW11:  uint32(csi) << 24,
	}
}

// setFeaturesCmd: CDW10 FID 7:0, CDW11 the value.
func setFeaturesCmd(c *nvme.Command, fid uint8, cdw11 uint32) {
	*c = nvme.Command{
		Opcode: uint8(nvme.AdminSetFeatures),
		Flags:  cmdFlags,
		CDW10:  uint32(fid),
		CDW11:  cdw11,
	}
}

// numQueuesValue is the Number of Queues request: NSQR and NCQR, both 0's
// based.
func numQueuesValue(n int) uint32 { return uint32(n-1) | uint32(n-1)<<16 }

// grantedQueues reads the Number of Queues result: min(NSQA, NCQA)+1.
func grantedQueues(dw0 uint32) int { return int(min(uint16(dw0), uint16(dw0>>16))) + 1 }

// getLogPageCmd reads n bytes (a multiple of 4) of log lid from byte
// offset off. CDW10: LID 7:0, LSP 14:8, RAE 15, NUMDL 31:16; CDW11: NUMDU
// 15:0; CDW12/13: LPO; NUMD is dwords − 1.
func getLogPageCmd(c *nvme.Command, lid uint8, nsid uint32, off uint64, n int, rae bool) {
	numd := uint32(n/4 - 1)
	cdw10 := uint32(lid) | (numd&0xFFFF)<<16
	if rae {
		cdw10 |= 1 << 15
	}
	*c = nvme.Command{
		Opcode: uint8(nvme.AdminGetLogPage),
		Flags:  cmdFlags,
		NSID:   nsid,
		CDW10:  cdw10,
		CDW11:  numd >> 16,
		CDW12:  uint32(off),
		CDW13:  uint32(off >> 32),
	}
}

func keepAliveCmd(c *nvme.Command) {
	*c = nvme.Command{Opcode: uint8(nvme.AdminKeepAlive), Flags: cmdFlags}
}

func aerCmd(c *nvme.Command) {
	*c = nvme.Command{Opcode: uint8(nvme.AdminAsyncEvent), Flags: cmdFlags}
}

// I/O command bits (CDW12 of Read/Write/Write Zeroes, CDW11 of DSM).
const (
	cdw12FUA  = 1 << 30
	cdw12DEAC = 1 << 25
	dsmAD     = 1 << 2
	// maxWriteZeroesBlocks is what one Write Zeroes may cover: NLB is a
	// 16-bit 0's based count (Linux also caps at 65536).
	maxWriteZeroesBlocks = 1 << 16
	// maxDSMRanges is the most ranges one Dataset Management carries (NR
	// is 8 bits, 0's based); each is 16 bytes, 4096 in all.
	maxDSMRanges = 256
	dsmRangeSize = 16
)

// rwCmd is Read or Write: SLBA in CDW10/11, NLB 0's based in CDW12 15:0,
// FUA bit 30.
func rwCmd(c *nvme.Command, op nvme.IOOpcode, nsid uint32, slba uint64, blocks uint32, fua bool) {
	cdw12 := blocks - 1
	if fua {
		cdw12 |= cdw12FUA
	}
	*c = nvme.Command{
		Opcode: uint8(op),
		Flags:  cmdFlags,
		NSID:   nsid,
		CDW10:  uint32(slba),
		CDW11:  uint32(slba >> 32),
		CDW12:  cdw12,
	}
}

func flushCmd(c *nvme.Command, nsid uint32) {
	*c = nvme.Command{Opcode: uint8(nvme.IOFlush), Flags: cmdFlags, NSID: nsid}
}

func writeZeroesCmd(c *nvme.Command, nsid uint32, slba uint64, blocks uint32, deac bool) {
	cdw12 := blocks - 1
	if deac {
		cdw12 |= cdw12DEAC
	}
	*c = nvme.Command{
		Opcode: uint8(nvme.IOWriteZeroes),
		Flags:  cmdFlags,
		NSID:   nsid,
		CDW10:  uint32(slba),
		CDW11:  uint32(slba >> 32),
		CDW12:  cdw12,
	}
}

// dsmCmd is Dataset Management with Attribute Deallocate over nr ranges:
// CDW10 NR 7:0 (0's based), CDW11 AD bit 2.
func dsmCmd(c *nvme.Command, nsid uint32, nr int) {
	*c = nvme.Command{
		Opcode: uint8(nvme.IODatasetManagement),
		Flags:  cmdFlags,
		NSID:   nsid,
		CDW10:  uint32(nr - 1),
		CDW11:  dsmAD,
	}
}

// putDSMRange writes one 16-byte range: context attributes 0–3 (0), NLB
// 4–7 (a count, 1's based), SLBA 8–15.
func putDSMRange(b []byte, slba uint64, blocks uint32) {
	binary.LittleEndian.PutUint32(b[0:4], 0)
	binary.LittleEndian.PutUint32(b[4:8], blocks)
	binary.LittleEndian.PutUint64(b[8:16], slba)
}

// noDataSGL is the RDMA "no data" descriptor: keyed, address, length and
// key all zero (what Linux sends for commands without data).
var noDataSGL = nvme.SGL{ID: nvme.SGLIDKeyed}

// commandName names an SQE for errors (admin opcodes on QID 0, NVM I/O
// opcodes elsewhere, fabrics by FCTYPE).
func commandName(c *nvme.Command, qid uint16) string {
	if c.IsFabrics() {
		switch c.FCType() {
		case nvme.FabricsConnect:
			return nameConnect
		case nvme.FabricsPropertyGet:
			return namePropertyGet
		case nvme.FabricsPropertySet:
			return namePropertySet
		}
		return c.FCType().String()
	}
	if qid == 0 {
		switch nvme.AdminOpcode(c.Opcode) {
		case nvme.AdminIdentify:
			return nameIdentify
		case nvme.AdminSetFeatures:
			return nameSetFeatures
		case nvme.AdminGetLogPage:
			return nameGetLogPage
		case nvme.AdminKeepAlive:
			return nameKeepAlive
		case nvme.AdminAsyncEvent:
			return nameAER
		}
		return nvme.AdminOpcode(c.Opcode).String()
	}
	switch nvme.IOOpcode(c.Opcode) {
	case nvme.IORead:
		return nameRead
	case nvme.IOWrite:
		return nameWrite
	case nvme.IOFlush:
		return nameFlush
	case nvme.IOWriteZeroes:
		return nameWriteZeroes
	case nvme.IODatasetManagement:
		return nameDSM
	}
	return nvme.IOOpcode(c.Opcode).String()
}

package target

import (
	"github.com/blk-project/blk/nvme"
)

// targetVersion is VS and Identify Controller VER: NVMe 1.4. A Linux host
// then asks for the namespace identification descriptors (CNS 0x03,
// needed since 1.3) and, from any VER of 1.1 or later, for the NVM
// command set's Identify Controller (CNS 0x06, for WZSL), but not for the
// I/O-command-set-independent namespace (CNS 0x08, used from 2.0).
const targetVersion nvme.Version = 0x00010400

// writeZeroesLimit is WZSL in Identify CNS 0x06: the largest Write Zeroes,
// 2^13 pages of 4 KiB (CAP.MPSMIN 0) = 32 MiB. The limit is the command,
// not the target: a Write Zeroes names at most 65536 blocks (NLB is 16
// bits, 0's based), and with the smallest block size a namespace may have
// (512 bytes, AddNamespace) that is 32 MiB. A Linux host sizes its
// requests by WZSL alone (max_write_zeroes_sectors; it checks no NLB
// overflow), so a larger WZSL would let it build commands whose block
// count wraps. Any length up to that is served at the same cost: a
// volume removes the range (one range deletion past its point-delete
// threshold), with DEAC or without. Without CNS 0x06 a Linux host limits
// Write Zeroes to MDTS.
const writeZeroesLimit = 16 + 9 - 12 // log2(65536 blocks × 512 bytes / 4096 bytes)

// execAdmin serves the admin queue of a connected controller.
func (q *Queue) execAdmin(r *Request) {
	c := q.ctrl.Load()
	c.sawCommand()
	cmd := &r.Cmd
	if c.disc && !(cmd.IsFabrics() && nvme.FabricsType(uint8(cmd.NSID)) == nvme.FabricsConnect) {
		c.spoke()
	}
	switch {
	case cmd.Fuse() != 0:
		q.complete(r, nvme.StatusInvalidField.WithDNR())
		return
	case c.dead.Load():
		q.complete(r, nvme.StatusAbortSQDeleted)
		return
	case cmd.IsFabrics():
		q.execFabrics(c, r)
		return
	case !psdtOK(cmd):
		q.complete(r, nvme.StatusInvalidField.WithDNR())
		return
	case !c.ready.Load():
		// Before CSTS.RDY only fabrics commands are served.
		q.complete(r, nvme.StatusCommandSequenceError.WithDNR())
		return
	}
	if c.disc {
		q.execDiscoveryAdmin(c, r)
		return
	}
	if q.execResvAdmin(c, r) { // log 80h, features 81h-83h (resv_cmd.go)
		return
	}
	var st nvme.Status
	switch nvme.AdminOpcode(cmd.Opcode) {
	case nvme.AdminIdentify:
		st = c.identify(r)
	case nvme.AdminGetLogPage:
		st = c.getLogPage(r)
	case nvme.AdminSetFeatures:
		st = c.setFeatures(r)
	case nvme.AdminGetFeatures:
		st = c.getFeatures(r)
	case nvme.AdminAsyncEvent:
		c.asyncEventRequest(r)
		return
	case nvme.AdminKeepAlive:
		st = c.keepAliveCmd(r)
	case nvme.AdminAbort:
		st = abort(r)
	default:
		st = nvme.StatusInvalidOpcode.WithDNR()
	}
	q.complete(r, st)
}

// abort answers Abort as nvmet does: success, "command not aborted" (DW0
// bit 0). Commands here finish quickly or are held AERs, which the host
// does not abort.
func abort(r *Request) nvme.Status {
	if r.Len != 0 {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	r.Rsp.DW0 = 1
	return nvme.StatusSuccess
}

// keepAliveCmd restarts the keep-alive timeout. With no timeout (KATO 0)
// it is Keep Alive Timeout Invalid.
func (c *ctrl) keepAliveCmd(r *Request) nvme.Status {
	if r.Len != 0 {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kato == 0 {
		return nvme.StatusKeepAliveInvalid.WithDNR()
	}
	c.keepAlive()
	return nvme.StatusSuccess
}

// asyncEventRequest holds an AER until an event, or completes it at once
// with a pending one. More than AERL+1 outstanding: AER Limit Exceeded.
func (c *ctrl) asyncEventRequest(r *Request) {
	q := r.q
	if r.Len != 0 {
		q.complete(r, nvme.StatusSGLInvalidDataLength.WithDNR())
		return
	}
	c.mu.Lock()
	switch {
	case c.state != ctrlLive:
		c.mu.Unlock()
		q.complete(r, nvme.StatusAbortSQDeleted)
	case c.nevents > 0:
		r.Rsp.DW0 = c.events[0]
		copy(c.events[:], c.events[1:c.nevents])
		c.nevents--
		c.mu.Unlock()
		q.complete(r, nvme.StatusSuccess)
	case c.naers == aerLimit:
		c.mu.Unlock()
		q.complete(r, nvme.StatusAERLimitExceeded.WithDNR())
	default:
		c.aers[c.naers] = r
		c.naers++
		c.t.enter(r, reqHeld)
		c.mu.Unlock()
	}
}

// identify serves Identify: controller, namespace, active namespace list,
// namespace identification descriptors and the NVM command set's
// controller structure (CNS 0x06); any other CNS is Invalid Field (with
// VER 1.4 a Linux host asks for nothing else).
func (c *ctrl) identify(r *Request) nvme.Status {
	data := r.data()
	if r.Len != nvme.IdentifySize || data == nil {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	buf := (*[nvme.IdentifySize]byte)(data)
	var ic nvme.IdentifyCommand
	ic.Decode(&r.Cmd)
	switch ic.CNS {
	case nvme.CNSController:
		c.identifyController(buf)
		return nvme.StatusSuccess
	case nvme.CNSNamespace:
		return c.identifyNamespace(ic.NSID, buf)
	case nvme.CNSActiveNSList:
		return c.activeNSList(ic.NSID, buf)
	case nvme.CNSNSDescriptorList:
		return c.nsDescriptors(ic.NSID, buf)
	case nvme.CNSCSController:
		return identifyControllerNVM(ic.CSI, buf)
	}
	return nvme.StatusInvalidField.WithDNR()
}

// identifyControllerNVM fills the I/O Command Set Specific Identify
// Controller structure of the NVM command set (CNS 0x06, CSI 0x00): WZSL
// (writeZeroesLimit); VSL and WUSL 0 (neither Verify nor Write
// Uncorrectable is in ONCS); DMRL, DMRSL and DMSL 0, no Dataset
// Management limits: the host's defaults (up to 256 ranges of any length)
// are served, and a range costs a volume at most its point-delete
// threshold of deletions, else one range deletion. Another CSI is
// Invalid Field: every namespace is NVM. The NSID is not used (a Linux
// host sends 0).
func identifyControllerNVM(csi uint8, buf *[nvme.IdentifySize]byte) nvme.Status {
	if csi != nvme.CSINVM {
		return nvme.StatusInvalidField.WithDNR()
	}
	id := nvme.IdentifyControllerNVM{WZSL: writeZeroesLimit}
	id.Marshal(buf)
	return nvme.StatusSuccess
}

// identifyController fills Identify Controller: the profile of
// shared/docs/nvmeof-wire.md §9 with the limits of the controller's
// transport port.
func (c *ctrl) identifyController(buf *[nvme.IdentifySize]byte) {
	t := c.t
	l := &c.lim
	id := nvme.IdentifyController{
		SN:     c.s.serial,
		MN:     c.s.model,
		CNTLID: c.cntlid,
		VER:    targetVersion,
		OAES:   c.oaes(),
		AERL:   aerLimit - 1,
		ELPE:   uint8(t.cfg.ErrorLogEntries - 1),
		// A discovery controller too: a persistent discovery connection
		// keeps itself alive (EPCSD in its log entry).
		KAS: kasUnits,
		// MAXCMD = CAP.MQES + 1: a Linux host clamps its queue size to
		// both, so neither may say less than the other (65535, the
		// field's most, for a 65536-entry MQES).
		MAXCMD: uint16(min(l.MaxQueueEntries, 0xFFFF)),
		SGLS:   l.SGLS(),
		IOCCSZ: l.IOCCSZ(),
		IORCSZ: nvme.CQESize / 16,
		MSDBD:  1,
	}
	_ = nvme.SetASCII(id.FR[:], t.cfg.FirmwareRevision)
	id.SubNQN, _ = nvme.MakeNQNField(c.s.nqn)
	if c.disc {
		// RAB, CTRATT, ACL, FRMW, SQES, CQES and the power states are
		// reserved for a discovery controller: zero, as nvmet's and
		// nvmf_tgt's discovery Identify (docs/spdk-identify.md).
		id.CNTRLTYPE = nvme.CtrlTypeDiscovery
		id.LPA = nvme.LPAExtendedData
	} else {
		id.CNTRLTYPE = nvme.CtrlTypeIO
		id.RAB = 6
		id.CTRATT = nvme.CtrAttHostID128
		id.ACL = 3
		// One firmware slot, read-only: the Firmware Slot log shows FR.
		id.FRMW = 1<<0 | 1<<1
		id.SQES, id.CQES = 0x66, 0x44
		// One power state, faked as nvmet (and qemu) do.
		id.PSD0 = nvme.PowerState{MaxPower: 0x9c4, EntryLat: 0x10, ExitLat: 0x4}
		// Traffic-based keep-alive: any command restarts the
		// keep-alive timer (ctrl.keepAliveFired), so a host moving I/O
		// needs no Keep Alive.
		id.CTRATT |= nvme.CtrAttTBKAS
		id.CMIC = nvme.CMICMultiPort | nvme.CMICMultiCtrl
		id.MDTS = l.MDTS()
		id.LPA = nvme.LPASMARTPerNS | nvme.LPACommandsEffects | nvme.LPAExtendedData
		id.NN = t.cfg.MaxNSID
		id.ONCS = c.oncs()
		id.FUSES = 1 // Compare and Write, atomic against writes (fused.go, rangelock.go)
		// Flush with NSID FFFFFFFFh flushes every namespace (flushAll).
		id.VWC = nvme.VWCPresent | nvme.VWCFlushAll
		if c.s.ana {
			c.setIdentifyANA(&id)
		}
	}
	id.Marshal(buf)
}

// oncs is Identify Controller's ONCS: the optional NVM commands an I/O
// controller serves. The effects log (effectsLog) follows it.
func (c *ctrl) oncs() uint16 {
	o := nvme.ONCSCompare | nvme.ONCSDSM | nvme.ONCSWriteZeroes
	if c.s.reservationsServed() {
		o |= nvme.ONCSReservations
	}
	return o
}

// identifyNamespace fills Identify Namespace. NSID 0 and 0xFFFFFFFF are
// Invalid Namespace; an NSID with no namespace gets an all-zero page, as
// nvmet (the host reads NCAP 0 as "not there").
func (c *ctrl) identifyNamespace(nsid uint32, buf *[nvme.IdentifySize]byte) nvme.Status {
	if nsid == 0 || nsid == nvme.NSIDAll {
		return nvme.StatusInvalidNamespace.WithDNR()
	}
	ns := c.s.acquireNS(nsid)
	if ns == nil {
		*buf = [nvme.IdentifySize]byte{}
		return nvme.StatusSuccess
	}
	defer ns.release()
	// As nvmet_ns_revalidate: pick up a resized or write-protected
	// backend, and tell every controller if it changed. Without waiting:
	// this runs on a poll group (revalidateNow).
	if changed, err := ns.revalidateNow(); err != nil {
		c.t.logf("target: %s NSID %d: revalidate: %v", c.s.nqn, nsid, err)
	} else if changed {
		c.s.nsChanged(nsid)
	}
	blocks := ns.blocks.Load()
	id := nvme.IdentifyNamespace{
		// Thin volumes cost nothing until written, but the space a host
		// can use is the whole namespace: NCAP = NUSE = NSZE, as nvmet.
		NSZE: blocks, NCAP: blocks, NUSE: blocks,
		NMIC: nvme.NMICShared,
		// Deallocated blocks read as zeros and Write Zeroes may
		// deallocate: the host sets DEAC.
		DLFEAT: nvme.DLFeatZeroes | nvme.DLFeatWZDEAC,
		NGUID:  ns.nguid,
	}
	id.LBAF[0] = nvme.LBAFormat{LBADS: ns.shift}
	if ns.readOnly.Load() {
		id.NSATTR = nvme.NSAttrRO
	}
	if ns.keeper() != nil {
		id.RESCAP = rescap
	}
	if c.s.ana {
		id.ANAGRPID = anaGroupID
	}
	id.Marshal(buf)
	return nvme.StatusSuccess
}

// activeNSList lists up to 1024 active NSIDs above nsid, increasing.
func (c *ctrl) activeNSList(nsid uint32, buf *[nvme.IdentifySize]byte) nvme.Status {
	if nsid >= nvme.NSIDMax {
		return nvme.StatusInvalidNamespace.WithDNR()
	}
	*buf = [nvme.IdentifySize]byte{}
	i := 0
	for _, ns := range c.s.table().list {
		if ns.nsid <= nsid {
			continue
		}
		if i == nvme.IdentifySize/4 {
			break
		}
		putLE32(buf[4*i:], ns.nsid)
		i++
	}
	return nvme.StatusSuccess
}

// nsDescriptors lists a namespace's identifiers: its NGUID and its
// command set (NVM). An inactive NSID is Invalid Namespace, as nvmet.
func (c *ctrl) nsDescriptors(nsid uint32, buf *[nvme.IdentifySize]byte) nvme.Status {
	ns := c.s.acquireNS(nsid)
	if ns == nil {
		return nvme.StatusInvalidNamespace.WithDNR()
	}
	defer ns.release()
	*buf = [nvme.IdentifySize]byte{}
	n, _ := nvme.PutNSDescriptor(buf[:], nvme.NIDTNGUID, ns.nguid[:])
	_, _ = nvme.PutNSDescriptor(buf[n:], nvme.NIDTCSI, []byte{nvme.CSINVM})
	return nvme.StatusSuccess
}

func putLE32(b []byte, v uint32) {
	_ = b[3]
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

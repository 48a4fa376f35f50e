package target

import (
	"encoding/binary"
	"time"

	"github.com/blk-project/blk/nvme"
)

// Log pages an I/O controller serves; any other LID is Invalid Field, as
// nvmet:
//
//	0x01 Error Information         the controller's last ErrorLogEntries errors, newest first
//	0x02 SMART / Health            data units and commands read and written, per namespace or all
//	0x03 Firmware Slot Information one read-only slot, active, holding FR
//	0x04 Changed Namespace List    cleared when read, unless RAE
//	0x05 Commands Supported and Effects
//	0x0C Asymmetric Namespace Access   a subsystem with ANA only (ana.go); LSP bit 0
//	     (RGO) leaves out the NSIDs; read without RAE it re-arms the ANA notice
//
// A discovery controller serves only 0x70 (discovery.go). Every log is
// built whole into the controller's scratch buffer, then the window the
// command asks for (any dword-aligned offset and length) is copied out,
// zero-filled past the end of the log.

// logPageArgs decodes r's Get Log Page and checks what every log asks
// of it: a data buffer of the length the command names, at a
// dword-aligned offset.
func logPageArgs(r *Request) (nvme.GetLogPageCommand, []byte, nvme.Status) {
	var g nvme.GetLogPageCommand
	g.Decode(&r.Cmd)
	data := r.data()
	if g.Length() != uint64(r.Len) || data == nil {
		return g, nil, nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	if g.LPO&3 != 0 {
		return g, nil, nvme.StatusInvalidField.WithDNR()
	}
	return g, data, nvme.StatusSuccess
}

// getLogPage serves Get Log Page.
func (c *ctrl) getLogPage(r *Request) nvme.Status {
	g, data, st := logPageArgs(r)
	if st != nvme.StatusSuccess {
		return st
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var page []byte
	switch g.LID {
	case nvme.LogErrorInfo:
		page = c.errorLog()
	case nvme.LogSMART:
		var st nvme.Status
		if page, st = c.smartLog(g.NSID); st != nvme.StatusSuccess {
			return st
		}
	case nvme.LogFirmwareSlot:
		page = c.scratch(512)
		page[0] = 1 // active slot 1
		_ = nvme.SetASCII(page[8:16], c.t.cfg.FirmwareRevision)
	case nvme.LogChangedNSList:
		page = c.changedNSLog()
	case nvme.LogCommandsEffects:
		if g.CSI != nvme.CSINVM {
			return nvme.StatusInvalidField.WithDNR()
		}
		page = c.effectsLog()
	case nvme.LogANA:
		if !c.s.ana {
			return nvme.StatusInvalidField.WithDNR()
		}
		page = c.anaLog(g.LSP&nvme.ANALogRGO != 0)
	default:
		return nvme.StatusInvalidField.WithDNR()
	}
	if !copyWindow(data, page, g.LPO) {
		return nvme.StatusInvalidField.WithDNR()
	}
	// Reading a log clears what it reports, unless the host asked to
	// Retain the Asynchronous Event.
	if g.LID == nvme.LogChangedNSList && !g.RAE {
		c.changed = c.changed[:0]
		c.changedMax = false
		c.masked &^= nvme.AENNSAttr
	}
	if g.LID == nvme.LogANA && !g.RAE {
		c.masked &^= nvme.AENANAChange
	}
	return nvme.StatusSuccess
}

// copyWindow copies page[off:] into dst and zero-fills the rest of dst.
// An offset past the end of the page is refused.
func copyWindow(dst, page []byte, off uint64) bool {
	if off > uint64(len(page)) {
		return false
	}
	n := copy(dst, page[off:])
	clear(dst[n:])
	return true
}

// scratch returns the controller's log buffer, n bytes, zeroed. Requires
// c.mu.
func (c *ctrl) scratch(n int) []byte {
	if cap(c.logBuf) < n {
		c.logBuf = make([]byte, n)
	}
	b := c.logBuf[:n]
	clear(b)
	return b
}

// errorLog builds the Error Information log, newest entry first. Requires
// c.mu.
func (c *ctrl) errorLog() []byte {
	n := len(c.errs)
	page := c.scratch(n * nvme.ErrorLogEntrySize)
	count := min(c.errCount, uint64(n))
	for i := range count {
		e := &c.errs[(c.errCount-1-i)%uint64(n)]
		e.Marshal((*[nvme.ErrorLogEntrySize]byte)(page[int(i)*nvme.ErrorLogEntrySize:]))
	}
	return page
}

// smartLog builds the SMART / Health log for one namespace, or for all
// (NSID 0 or 0xFFFFFFFF). Requires c.mu.
func (c *ctrl) smartLog(nsid uint32) ([]byte, nvme.Status) {
	var readBytes, writeBytes, reads, writes uint64
	add := func(ns *namespace) {
		readBytes += ns.c.readBytes.Load()
		writeBytes += ns.c.writeBytes.Load()
		reads += ns.c.reads.Load() + ns.c.compares.Load()
		writes += ns.c.writes.Load()
	}
	if nsid == 0 || nsid == nvme.NSIDAll {
		for _, ns := range c.s.table().list {
			add(ns)
		}
	} else {
		ns := c.s.table().find(nsid)
		if ns == nil {
			return nil, nvme.StatusInvalidNamespace.WithDNR()
		}
		add(ns)
	}
	hours := uint64(c.t.clock.Now().Sub(c.t.start) / time.Hour)
	s := nvme.SMARTLog{
		Temperature:      smartTemperature,
		AvailSpare:       100,
		SpareThresh:      10,
		DataUnitsRead:    nvme.Uint128{Lo: nvme.DataUnits(readBytes)},
		DataUnitsWritten: nvme.Uint128{Lo: nvme.DataUnits(writeBytes)},
		HostReads:        nvme.Uint128{Lo: reads},
		HostWrites:       nvme.Uint128{Lo: writes},
		PowerCycles:      nvme.Uint128{Lo: 1},
		PowerOnHours:     nvme.Uint128{Lo: hours},
		NumErrLogEntries: nvme.Uint128{Lo: c.errCount},
	}
	if c.feat.tempWarning() {
		// A host set a threshold the composite temperature crosses.
		s.CriticalWarning |= nvme.SMARTCritTemperature
	}
	page := c.scratch(nvme.SMARTLogSize)
	s.Marshal((*[nvme.SMARTLogSize]byte)(page))
	return page, nvme.StatusSuccess
}

// changedNSLog builds the Changed Namespace List. Requires c.mu.
func (c *ctrl) changedNSLog() []byte {
	page := c.scratch(nvme.ChangedNSListSize)
	for i, id := range c.changed {
		binary.LittleEndian.PutUint32(page[4*i:], id)
	}
	return page
}

// effectsLog builds the Commands Supported and Effects log: the commands
// this controller executes, each marked supported, and LBCC (logical
// block content change) on the ones that change what a read returns:
// Write, Write Zeroes and Dataset Management (a deallocation reads as
// zeros). The Linux host lets a process that opened a namespace's
// character device read-only send a passthrough command that moves no
// data to the controller unless its effects have LBCC (nvme_cmd_allowed),
// so without it a reader could zero blocks. Flush changes no block's
// content: CSUPP only (nvmf_tgt marks it LBCC). No command changes a
// namespace's capability or inventory or the controller's capability.
// The reservation opcodes are supported exactly when ONCS says so.
// Requires c.mu.
func (c *ctrl) effectsLog() []byte {
	var l nvme.CommandEffectsLog
	for _, op := range []nvme.AdminOpcode{nvme.AdminGetLogPage, nvme.AdminIdentify, nvme.AdminAbort,
		nvme.AdminSetFeatures, nvme.AdminGetFeatures, nvme.AdminAsyncEvent, nvme.AdminKeepAlive} {
		l.ACS[op] = nvme.EffectsCSUPP
	}
	for _, op := range []nvme.IOOpcode{nvme.IOFlush, nvme.IORead, nvme.IOCompare} {
		l.IOCS[op] = nvme.EffectsCSUPP
	}
	for _, op := range []nvme.IOOpcode{nvme.IOWrite, nvme.IOWriteZeroes, nvme.IODatasetManagement} {
		l.IOCS[op] = nvme.EffectsCSUPP | nvme.EffectsLBCC
	}
	c.resvEffects(&l) // resv_cmd.go: the four reservation opcodes when served
	page := c.scratch(nvme.CommandEffectsLogSize)
	l.Marshal((*[nvme.CommandEffectsLogSize]byte)(page))
	return page
}

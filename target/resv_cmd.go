package target

import (
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
)

// The reservation commands (docs/reservations.md §1.5, §1.7, §1.8,
// §1.10): Register, Acquire and Release, checked here and executed by the
// namespace's keeper as an asynchronous IO (the request waits in state
// reqKeeper); Report, answered on the poll group from the published
// state; log page 80h and its event; features 81h, 82h and 83h. A
// namespace without a keeper answers the four opcodes with Invalid
// Opcode, as before reservations existed.

// Controller reservation limits.
const (
	// resvLogLimit is the entries of a controller's Reservation
	// Notification log (nvmet keeps 64): a notice is rare (a preempt, a
	// release of a shared type, a clear), and an entry lost to a full
	// ring shows as a jump in the Log Page Count.
	resvLogLimit = 16
	// aenResvLog is the internal bit of ctrl.masked for the Reservation
	// Log Page Available event. It is not an OAES bit (the event is
	// gated by the mask feature, not by Asynchronous Event
	// Configuration): bit 30 is reserved in OAES and never set there.
	aenResvLog uint32 = 1 << 30
	// resvLogInfo is the event's information: Reservation Log Page
	// Available (type 6h, I/O command specific).
	resvLogInfo uint8 = 0
)

// ResvOp is a reservation command, for Stats.ReservationCommands.
type ResvOp uint8

// The reservation commands counted.
const (
	ResvRegister ResvOp = iota
	ResvAcquire
	ResvRelease
	ResvReport
	NumResvOps
)

var resvOpNames = [NumResvOps]string{ResvRegister: "register", ResvAcquire: "acquire",
	ResvRelease: "release", ResvReport: "report"}

// String returns the command's name: register, acquire, release, report.
func (o ResvOp) String() string {
	if o < NumResvOps {
		return resvOpNames[o]
	}
	return "unknown"
}

// isResvOpcode reports whether op is one of the four reservation
// commands.
func isResvOpcode(op nvme.IOOpcode) bool {
	switch op {
	case nvme.IOReservationRegister, nvme.IOReservationAcquire, nvme.IOReservationRelease, nvme.IOReservationReport:
		return true
	}
	return false
}

// ctrlResv is a controller's reservation state (ctrl.resv), under c.mu.
type ctrlResv struct {
	// mask is the Reservation Notification Mask (feature 82h): REGPRE,
	// RESREL, RESPRE bits; per controller (one namespace per subsystem).
	mask uint32
	// log is the Reservation Notification log: a ring of resvLogLimit
	// entries, head the oldest, n of them used; count the Log Page
	// Count of the last entry (64 bits, skipping 0).
	log   [resvLogLimit]nvme.ResvNotifLog
	head  int
	n     int
	count uint64
}

// reservation serves Register (0Dh), Acquire (11h), Release (15h) and
// Report (0Eh) on an I/O queue.
func (q *Queue) reservation(c *ctrl, r *Request) {
	op := nvme.IOOpcode(r.Cmd.Opcode)
	q.t.stats.resvCmds[resvOpOf(op)].Add(1)
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	k := ns.keeper()
	if k == nil {
		q.finish(ns, r, nvme.StatusInvalidOpcode.WithDNR())
		return
	}
	if op == nvme.IOReservationReport {
		q.finish(ns, r, ns.report(r))
		return
	}
	if st := decodeResv(c, r, op); st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	q.submitKeeper(ns, k, r)
}

// resvOpOf is op's index in Stats.ReservationCommands.
func resvOpOf(op nvme.IOOpcode) ResvOp {
	switch op {
	case nvme.IOReservationRegister:
		return ResvRegister
	case nvme.IOReservationAcquire:
		return ResvAcquire
	case nvme.IOReservationRelease:
		return ResvRelease
	}
	return ResvReport
}

// decodeResv checks Register, Acquire or Release and decodes it into
// r.io.Resv: the data (16 bytes, 8 for Release; a longer buffer is read
// from its start, as Linux sends 16 for Release), no dispersed namespace
// registration (not served), then the model's Command.Check: action,
// RTYPE and CPTPL in range (Invalid Field), a non-zero host identifier
// (Command Sequence Error: the zero identifier cannot tell hosts apart,
// §1.8). The rules themselves are the model's, at the keeper.
func decodeResv(c *ctrl, r *Request, op nvme.IOOpcode) nvme.Status {
	cmd := &r.Cmd
	need, rop := uint32(nvme.ResvDataSize), resv.Register
	switch op {
	case nvme.IOReservationAcquire:
		rop = resv.Acquire
	case nvme.IOReservationRelease:
		need, rop = nvme.ResvReleaseDataSize, resv.Release
	}
	data := r.data()
	if r.Len < need || data == nil {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	if cmd.CDW10&nvme.ResvDISNSRS != 0 {
		return nvme.StatusInvalidField.WithDNR()
	}
	var keys nvme.ResvKeys
	_ = keys.Unmarshal(data[:need])
	rc := &r.io.Resv
	*rc = resv.Command{Op: rop, Action: cmd.ResvAction(), IEKEY: cmd.ResvIEKEY(), CRKEY: keys.CRKEY,
		NRKEY: keys.Key2, Host: resv.HostID(c.hostID), NQN: c.hostNQN}
	if op == nvme.IOReservationRegister {
		rc.CPTPL = cmd.ResvCPTPL()
	} else {
		rc.Type = resv.Type(cmd.ResvType())
	}
	return resv.StatusOf(rc.Check())
}

// report answers Reservation Report from the published state: the
// extended data structure only (EDS 0 is Host Identifier Inconsistent
// Format, §1.8), NUMD's length exactly, truncated to it.
func (ns *namespace) report(r *Request) nvme.Status {
	data := r.data()
	if uint64(r.Len) != r.Cmd.ResvReportLength() || data == nil {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	if !r.Cmd.ResvReportEDS() {
		return nvme.StatusHostIDInconsistent.WithDNR()
	}
	st := ns.resv.state.Load()
	if st == nil {
		return nvme.StatusNamespaceNotReady
	}
	return st.Report(true, data)
}

// submitKeeper hands r.io (OpReservation) to the namespace's keeper; the
// request waits in reqKeeper, counted in its queue's in-flight requests
// like one at the backend, so a teardown meanwhile waits for it and it
// completes exactly once (with Abort SQ Deleted if its controller went).
func (q *Queue) submitKeeper(ns *namespace, k ReservationKeeper, r *Request) {
	io := &r.io
	io.Op = OpReservation
	io.LBA, io.Blocks, io.Data, io.FUA = 0, 0, nil, false
	io.r = r
	io.err = nil
	io.ResvStatus = nvme.StatusSuccess
	r.ns = ns
	q.t.enter(r, reqKeeper)
	if io.submit(k, "target: reservation IO completed twice") {
		q.keeperDone(r)
	}
}

// keeperDone answers a command the keeper completed (ioDone calls it for
// an OpReservation IO): the keeper's error's status, else its
// ResvStatus.
func (q *Queue) keeperDone(r *Request) {
	io := &r.io
	ns := r.ns
	st := io.ResvStatus
	if io.err != nil {
		st = statusOf(io.err)
	}
	io.err = nil
	io.sync = false
	io.Op = 0
	io.Resv.NQN = ""
	r.ns = nil
	q.finish(ns, r, st)
}

// resvNotice records one notice of kind (a Reservation Notification log
// page type) for namespace nsid, unless the mask hides it, and sends the
// event unless one is outstanding.
func (c *ctrl) resvNotice(nsid uint32, kind uint8) {
	if kind < nvme.ResvNotifRegistrationPreempted || kind > nvme.ResvNotifReservationPreempted {
		return
	}
	c.mu.Lock()
	if c.state != ctrlLive || c.resv.mask&(1<<kind) != 0 {
		c.mu.Unlock()
		return
	}
	l := &c.resv
	l.count++
	if l.count == 0 {
		l.count = 1 // the count skips 0, which means an empty log
	}
	if l.n == resvLogLimit {
		// Full: the oldest goes; the host sees a jump in the count.
		l.head = (l.head + 1) % resvLogLimit
		l.n--
	}
	l.log[(l.head+l.n)%resvLogLimit] = nvme.ResvNotifLog{Count: l.count, Type: kind, NSID: nsid}
	l.n++
	var r *Request
	if c.masked&aenResvLog == 0 {
		c.masked |= aenResvLog
		r = c.postEvent(nvme.AsyncEventResult(nvme.AERTypeCmdSet, resvLogInfo, nvme.LogResvNotification))
	}
	c.mu.Unlock()
	if r != nil {
		r.q.complete(r, nvme.StatusSuccess)
	}
}

// execResvAdmin serves the admin commands of reservations: Get Log Page
// 80h, Get and Set Features 81h, 82h and 83h. It returns false for any
// other command (or one the controller does not serve), which
// execAdmin then serves as before.
func (q *Queue) execResvAdmin(c *ctrl, r *Request) bool {
	switch nvme.AdminOpcode(r.Cmd.Opcode) {
	case nvme.AdminGetLogPage:
		if uint8(r.Cmd.CDW10) != nvme.LogResvNotification || !c.s.reservationsServed() {
			return false
		}
		q.complete(r, c.resvLogPage(r))
		return true
	case nvme.AdminGetFeatures, nvme.AdminSetFeatures:
		var f nvme.FeatureCommand
		f.Decode(&r.Cmd)
		if f.FID != nvme.FeatureHostID && f.FID != nvme.FeatureResvMask && f.FID != nvme.FeatureResvPersist {
			return false
		}
		if !c.featureServed(f.FID) {
			return false
		}
		if nvme.AdminOpcode(r.Cmd.Opcode) == nvme.AdminGetFeatures {
			q.complete(r, c.getResvFeature(r, &f))
		} else {
			q.setResvFeature(c, r, &f)
		}
		return true
	}
	return false
}

// resvLogPage returns the oldest entry of the Reservation Notification
// log (all zeros when empty) with the number of entries left, and
// removes it; read without RAE it re-arms the event.
func (c *ctrl) resvLogPage(r *Request) nvme.Status {
	g, data, st := logPageArgs(r)
	if st != nvme.StatusSuccess {
		return st
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := &c.resv
	page := c.scratch(nvme.ResvNotifLogSize)
	if l.n > 0 {
		e := l.log[l.head]
		e.Available = uint8(min(l.n-1, 255))
		e.Marshal((*[nvme.ResvNotifLogSize]byte)(page))
	}
	if !copyWindow(data, page, g.LPO) {
		return nvme.StatusInvalidField.WithDNR()
	}
	if l.n > 0 {
		l.head = (l.head + 1) % resvLogLimit
		l.n--
	}
	if !g.RAE {
		c.masked &^= aenResvLog
	}
	return nvme.StatusSuccess
}

// resvFeatureNS checks the NSID of feature 82h or 83h: a namespace with
// a keeper (82h also takes 0xFFFFFFFF, all of them), served on this path
// (a path whose ANA state serves no I/O answers that state's status: a
// standby has no current view).
func (c *ctrl) resvFeatureNS(nsid uint32, all bool) (*namespace, nvme.Status) {
	if st := nvme.Status(c.s.anaIO.Load()); st != nvme.StatusSuccess {
		return nil, st
	}
	if all && nsid == nvme.NSIDAll {
		return nil, nvme.StatusSuccess
	}
	ns := c.s.table().find(nsid)
	if ns == nil {
		return nil, nvme.StatusInvalidNamespace.WithDNR()
	}
	if ns.keeper() == nil {
		return nil, nvme.StatusInvalidField.WithDNR()
	}
	return ns, nvme.StatusSuccess
}

// getResvFeature serves Get Features 81h (the host identifier, 16 bytes
// of data, EXHID 1 only: there is no 64-bit one), 82h (the mask) and 83h
// (PTPL, from the published state).
func (c *ctrl) getResvFeature(r *Request, f *nvme.FeatureCommand) nvme.Status {
	if f.SEL > nvme.FeatureSelSupported {
		return nvme.StatusInvalidField.WithDNR()
	}
	switch f.FID {
	case nvme.FeatureHostID:
		if f.CDW11&1 == 0 {
			return nvme.StatusInvalidField.WithDNR()
		}
		data := r.data()
		if r.Len != 16 || data == nil {
			return nvme.StatusSGLInvalidDataLength.WithDNR()
		}
		if f.SEL == nvme.FeatureSelSupported {
			clear(data)
			return nvme.StatusSuccess
		}
		copy(data, c.hostID[:])
		return nvme.StatusSuccess
	}
	if r.Len != 0 {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	ns, st := c.resvFeatureNS(r.Cmd.NSID, f.FID == nvme.FeatureResvMask)
	if st != nvme.StatusSuccess {
		return st
	}
	def := f.SEL != nvme.FeatureSelCurrent
	switch {
	case f.SEL == nvme.FeatureSelSupported:
		r.Rsp.DW0 = nvme.FeatureCapChangeable | nvme.FeatureCapNSSpecific
	case f.FID == nvme.FeatureResvMask:
		if !def {
			c.mu.Lock()
			r.Rsp.DW0 = c.resv.mask
			c.mu.Unlock()
		}
	default: // 83h
		if def {
			return nvme.StatusSuccess
		}
		s := ns.resv.state.Load()
		if s == nil {
			return nvme.StatusNamespaceNotReady
		}
		if s.PTPL {
			r.Rsp.DW0 = 1
		}
	}
	return nvme.StatusSuccess
}

// setResvFeature serves Set Features 81h (Command Sequence Error: over
// fabrics the identifier comes from Connect), 82h (the mask, per
// controller) and 83h (PTPL: a command of the keeper, like a Register's
// CPTPL, completed when it completes).
func (q *Queue) setResvFeature(c *ctrl, r *Request, f *nvme.FeatureCommand) {
	st := nvme.StatusSuccess
	switch {
	case f.FID == nvme.FeatureHostID:
		st = nvme.StatusCommandSequenceError.WithDNR()
	case r.Len != 0:
		st = nvme.StatusSGLInvalidDataLength.WithDNR()
	case f.SV:
		st = nvme.StatusFeatureNotSaveable.WithDNR()
	}
	if st != nvme.StatusSuccess {
		q.complete(r, st)
		return
	}
	ns, st := c.resvFeatureNS(r.Cmd.NSID, f.FID == nvme.FeatureResvMask)
	if st != nvme.StatusSuccess {
		q.complete(r, st)
		return
	}
	if f.FID == nvme.FeatureResvMask {
		c.mu.Lock()
		c.resv.mask = f.CDW11 & (nvme.ResvMaskRegPreempted | nvme.ResvMaskResvReleased | nvme.ResvMaskResvPreempted)
		c.mu.Unlock()
		q.complete(r, nvme.StatusSuccess)
		return
	}
	if c.hostID == [16]byte{} {
		q.complete(r, nvme.StatusCommandSequenceError.WithDNR())
		return
	}
	if !ns.acquire() {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	k := ns.keeper()
	if k == nil {
		q.finish(ns, r, nvme.StatusInvalidField.WithDNR())
		return
	}
	cptpl := nvme.CPTPLClear
	if f.CDW11&1 != 0 {
		cptpl = nvme.CPTPLSet
	}
	r.io.Resv = resv.Command{Op: resv.SetPTPL, CPTPL: cptpl, Host: resv.HostID(c.hostID), NQN: c.hostNQN}
	q.submitKeeper(ns, k, r)
}

// resvEffects marks the reservation commands supported in the Commands
// Supported and Effects log when a namespace serves them (they change
// no LBA content). Requires c.mu (the log's).
func (c *ctrl) resvEffects(l *nvme.CommandEffectsLog) {
	if !c.s.reservationsServed() {
		return
	}
	for _, op := range []nvme.IOOpcode{nvme.IOReservationRegister, nvme.IOReservationReport,
		nvme.IOReservationAcquire, nvme.IOReservationRelease} {
		l.IOCS[op] = nvme.EffectsCSUPP
	}
}

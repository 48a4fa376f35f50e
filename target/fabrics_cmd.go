package target

import (
	"github.com/blk-project/blk/nvme"
)

// Connect IPO values: byte offsets of the field a Connect Invalid
// Parameters status points at (IATTR says SQE or data).
const (
	ipoQID    = 42  // SQE: QID
	ipoSQSize = 44  // SQE: SQSIZE
	ipoHostID = 0   // data: HOSTID
	ipoCNTLID = 16  // data: CNTLID
	ipoSubNQN = 256 // data: SUBNQN
	ipoHost   = 512 // data: HOSTNQN
)

// connect runs a Connect on an unconnected queue.
func (q *Queue) connect(r *Request) {
	if !q.state.CompareAndSwap(queueNew, queueConnecting) {
		// A Connect on a queue that is already being connected.
		q.logRefused(r, nvme.StatusConnectControllerBusy, 0, "a Connect on this queue is in progress")
		q.complete(r, nvme.StatusConnectControllerBusy.WithDNR())
		return
	}
	q.refusal = ""
	s, dw0 := q.doConnect(r)
	if s != nvme.StatusSuccess {
		q.t.stats.connectRefused.Add(1)
		q.state.CompareAndSwap(queueConnecting, queueNew)
		q.logRefused(r, s, dw0, q.refusal)
	} else {
		q.connTimer.Stop()
	}
	r.Rsp.DW0 = dw0
	q.complete(r, s)
}

// doConnect checks a Connect in the order nvmet does (shared/docs
// §2.1) and installs the queue. On failure DW0 holds IPO/IATTR where the
// status is Connect Invalid Parameters or Invalid Host.
func (q *Queue) doConnect(r *Request) (nvme.Status, uint32) {
	var cc nvme.ConnectCommand
	_ = cc.Decode(&r.Cmd) // the caller checked opcode and FCTYPE
	// 1. The data is exactly the 1024-byte Connect data.
	data := r.data()
	if r.Len != nvme.ConnectDataSize || data == nil {
		return nvme.StatusSGLInvalidDataLength.WithDNR(), 0
	}
	// 2. Record format 0.
	if cc.RecFmt != 0 {
		return nvme.StatusConnectIncompatibleFormat.WithDNR(), 0
	}
	var d nvme.ConnectData
	_ = d.Unmarshal(data)
	// The QID must be the one the transport connection was made for.
	if cc.QID != q.params.QID {
		return nvme.StatusConnectInvalidParameters.WithDNR(), nvme.ConnectInvalidParamDW0(ipoQID, false)
	}
	if cc.QID == 0 {
		return q.connectAdmin(&cc, &d)
	}
	return q.connectIO(&cc, &d)
}

// invalidParam is a Connect Invalid Parameters status pointing at a field.
func invalidParam(ipo uint16, inData bool) (nvme.Status, uint32) {
	return nvme.StatusConnectInvalidParameters.WithDNR(), nvme.ConnectInvalidParamDW0(ipo, inData)
}

// checkSQSize checks SQSIZE: not 0, what the transport announced, at most
// max entries (0's based max-1).
func (q *Queue) checkSQSize(cc *nvme.ConnectCommand, max uint32) (nvme.Status, uint32, bool) {
	if cc.SQSize == 0 || cc.SQSize != q.params.SQSize || uint32(cc.SQSize) >= max {
		s, dw0 := invalidParam(ipoSQSize, false)
		return s, dw0, false
	}
	return nvme.StatusSuccess, 0, true
}

// connectAdmin creates a controller for an admin queue Connect.
func (q *Queue) connectAdmin(cc *nvme.ConnectCommand, d *nvme.ConnectData) (nvme.Status, uint32) {
	t := q.t
	// 3. Dynamic controller model: CNTLID 0xFFFF.
	if d.CNTLID != nvme.CNTLIDDynamic {
		return invalidParam(ipoCNTLID, true)
	}
	// 4. The subsystem exists (every subsystem is on every port).
	if !d.SubNQN.Terminated() {
		return invalidParam(ipoSubNQN, true)
	}
	s := t.lookupSubsystem(d.SubNQN.Bytes())
	if s == nil {
		return invalidParam(ipoSubNQN, true)
	}
	if s != t.disc && t.discoveryOnlyPort(q.params) {
		q.refusal = "the port serves discovery only"
		return invalidParam(ipoSubNQN, true)
	}
	// 5. The host may use it.
	if !d.HostNQN.Terminated() || len(d.HostNQN.Bytes()) == 0 {
		return invalidParam(ipoHost, true)
	}
	// With Admit (fence.go), Admit decides instead of the host list;
	// gen tells whether an EvictAndDrain ran since it did.
	host := string(d.HostNQN.Bytes())
	gen := s.evictGen.Load()
	if st, ok := q.admitHost(s, host); !ok {
		return st, nvme.ConnectInvalidParamDW0(ipoHost, true)
	}
	// 6. A controller ID is free within the budget (budget.go). nvmet
	// answers a full target with DNR; here a full budget is temporary,
	// and a Linux host that gets DNR never reconnects: no DNR.
	disc := s == t.disc
	cntlid, why := t.allocCNTLID(disc, q.source)
	if why != busyNone {
		t.stats.busy[why].Add(1)
		q.refusal = t.busyRefusal(why, q.source)
		return nvme.StatusConnectControllerBusy, 0
	}
	// 7, 8. SQSIZE.
	if st, dw0, ok := q.checkSQSize(cc, q.lim.AdminQueueEntries); !ok {
		t.freeCNTLID(cntlid, true, disc, q.source)
		return st, dw0
	}
	c := newCtrl(t, s, cntlid, q, d)
	if !c.disc {
		q.auth = q.authFor(s, c.hostNQN)
	}
	kato := cc.KATO
	if c.disc && kato == 0 {
		kato = uint32(t.cfg.DiscoveryKATO.Milliseconds())
	}
	q.depth = int(cc.SQSize) + 1
	q.sqFlowOff = cc.CAttr&nvme.ConnectAttrDisableSQFlow != 0
	q.ctrl.Store(c)
	c.mu.Lock()
	c.setKATO(kato)
	c.mu.Unlock()
	if !s.addCtrl(c) {
		// The subsystem was removed meanwhile.
		q.ctrl.Store(nil)
		c.abandon()
		return invalidParam(ipoSubNQN, true)
	}
	if s.evictGen.Load() != gen {
		// An eviction or a Refuse ran since the host was admitted, and
		// may not have seen this controller: ask again, under what the
		// fence says now.
		if err := s.readmit(host); err != nil {
			s.removeCtrl(c)
			q.ctrl.Store(nil)
			c.abandon()
			q.refusal = "not admitted (asked again after an eviction or a Refuse): " + err.Error()
			return admitStatus(err), nvme.ConnectInvalidParamDW0(ipoHost, true)
		}
	}
	t.stats.ctrlCreated.Add(1)
	if t.isClosed() {
		// Close ran between the CNTLID and the registration and may not
		// have seen this controller.
		c.teardown(errTargetClosed)
		return nvme.StatusAbortSQDeleted, 0
	}
	if !q.state.CompareAndSwap(queueConnecting, queueConnected) {
		// Closed while connecting: Close saw no controller, or tore
		// this one down; either way it must not live on.
		c.teardown(ErrAdminQueueClosed)
		return nvme.StatusAbortSQDeleted, 0
	}
	q.logCreated(c)
	return nvme.StatusSuccess, nvme.ConnectResponseDW0(cntlid, q.authReq())
}

// connectIO adds an I/O queue to a live controller.
func (q *Queue) connectIO(cc *nvme.ConnectCommand, d *nvme.ConnectData) (nvme.Status, uint32) {
	t := q.t
	if !d.SubNQN.Terminated() {
		return invalidParam(ipoSubNQN, true)
	}
	s := t.lookupSubsystem(d.SubNQN.Bytes())
	if s == nil {
		return invalidParam(ipoSubNQN, true)
	}
	if t.discoveryOnlyPort(q.params) {
		q.refusal = "the port serves discovery only"
		return invalidParam(ipoSubNQN, true)
	}
	// The controller must be live and belong to this host.
	if !d.HostNQN.Terminated() {
		return invalidParam(ipoHost, true)
	}
	c := s.findCtrl(d.CNTLID, d.HostNQN.Bytes())
	if c == nil {
		return invalidParam(ipoCNTLID, true)
	}
	// HOSTID must be the same on every queue of the association.
	if c.hostID != d.HostID {
		return invalidParam(ipoHostID, true)
	}
	// Every queue of a controller comes through a port with the same
	// limits as its admin queue's (nvmet goes further and wants the same
	// port): a controller reports one MDTS, IOCCSZ and MQES, and each
	// binding sizes a queue's buffers by its own port's limits. As seen from a port with
	// other limits the controller does not exist, so the status is the
	// one for an unknown controller: Invalid Parameters at CNTLID.
	if q.lim != c.lim {
		q.refusal = "the controller's admin queue came through a port with other limits (another transport?)"
		return invalidParam(ipoCNTLID, true)
	}
	// The host's secrets, read before c.mu: Subsystem.mu comes first in
	// the lock order.
	qa := q.authFor(s, c.hostNQN)
	c.mu.Lock()
	if c.state != ctrlLive {
		c.mu.Unlock()
		return invalidParam(ipoCNTLID, true)
	}
	// The QID is within what Set Features Number of Queues granted (a
	// discovery controller has none).
	if uint32(cc.QID) > c.maxQID() {
		c.mu.Unlock()
		return invalidParam(ipoQID, false)
	}
	if st, dw0, ok := q.checkSQSize(cc, c.lim.MaxQueueEntries); !ok {
		c.mu.Unlock()
		return st, dw0
	}
	if c.queues[cc.QID] != nil {
		c.mu.Unlock()
		return nvme.StatusCommandSequenceError.WithDNR(), 0
	}
	q.auth = qa
	s.trackIO(q, c.hostNQN)
	c.queues[cc.QID] = q
	c.nioq++
	q.depth = int(cc.SQSize) + 1
	q.initFused(q.depth)
	q.sqFlowOff = cc.CAttr&nvme.ConnectAttrDisableSQFlow != 0
	q.ctrl.Store(c)
	c.mu.Unlock()
	if !q.state.CompareAndSwap(queueConnecting, queueConnected) {
		c.removeQueue(q)
		return nvme.StatusAbortSQDeleted, 0
	}
	return nvme.StatusSuccess, nvme.ConnectResponseDW0(c.cntlid, q.authReq())
}

// execFabrics serves a fabrics command on a connected queue: Property
// Get/Set on the admin queue; a second Connect is refused; everything
// AUTH_SEND/AUTH_RECEIVE run the queue's authentication (auth.go);
// everything else (Disconnect, unknown types) is Invalid Opcode, as nvmet.
func (q *Queue) execFabrics(c *ctrl, r *Request) {
	st := nvme.StatusInvalidOpcode.WithDNR()
	switch nvme.FabricsType(uint8(r.Cmd.NSID)) {
	case nvme.FabricsConnect:
		st = nvme.StatusConnectControllerBusy.WithDNR()
	case nvme.FabricsPropertyGet:
		if q.qid == 0 {
			st = c.propertyGet(r)
		}
	case nvme.FabricsPropertySet:
		if q.qid == 0 {
			st = c.propertySet(r)
		}
	case nvme.FabricsAuthSend, nvme.FabricsAuthRecv:
		q.execAuth(r)
		return
	}
	q.complete(r, st)
}

// propertyGet reads a controller property. nvmet serves CAP as 8 bytes
// and VS, CC, CSTS (and CRTO) as 4 bytes; anything else is Invalid Field.
func (c *ctrl) propertyGet(r *Request) nvme.Status {
	if r.Len != 0 {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	size, ok := nvme.PropertySize(&r.Cmd)
	if !ok {
		return nvme.StatusInvalidField.WithDNR()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch off := r.Cmd.CDW11; {
	case size == 8 && off == nvme.PropCAP:
		r.Rsp.SetResult64(uint64(c.cap))
	case size == 4 && off == nvme.PropVS:
		r.Rsp.DW0 = uint32(targetVersion)
	case size == 4 && off == nvme.PropCC:
		r.Rsp.DW0 = uint32(c.cc)
	case size == 4 && off == nvme.PropCSTS:
		r.Rsp.DW0 = uint32(c.csts)
	case size == 4 && off == nvme.PropCRTO:
		// CRWMT and CRIMT in 500 ms units, both CAP.TO: the host reads
		// it only if CAP.CRWMS, which is clear.
		r.Rsp.DW0 = capTimeout | capTimeout<<16
	default:
		return nvme.StatusInvalidField.WithDNR()
	}
	return nvme.StatusSuccess
}

// propertySet writes a controller property: only CC, 4 bytes, is
// writable.
func (c *ctrl) propertySet(r *Request) nvme.Status {
	if r.Len != 0 {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	size, ok := nvme.PropertySize(&r.Cmd)
	if !ok || size != 4 || r.Cmd.CDW11 != nvme.PropCC {
		return nvme.StatusInvalidField.WithDNR()
	}
	c.mu.Lock()
	c.setCC(nvme.CC(r.Cmd.CDW12))
	c.mu.Unlock()
	return nvme.StatusSuccess
}

// authReq is the AUTHREQ of a successful Connect: ATR when the host must
// authenticate the queue, whose deadline then starts.
func (q *Queue) authReq() uint32 {
	if q.auth == nil {
		return 0
	}
	q.startAuth()
	return nvme.ConnectAuthReqATR
}

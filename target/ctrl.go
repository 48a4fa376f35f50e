package target

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
)

// Controller limits.
const (
	// aerLimit is the number of Asynchronous Event Requests a controller
	// holds (AERL+1), as nvmet. The Linux host keeps one outstanding.
	aerLimit = 4
	// eventLimit bounds the events waiting for an AER. Each kind is
	// masked until its log page is read, so at most two (namespace change,
	// discovery change) can wait at once; the rest is headroom.
	eventLimit = 8
	// kasUnits is Identify Controller KAS, the keep-alive granularity in
	// 100 ms units: KATO is rounded up to whole seconds, as nvmet.
	kasUnits = 10
)

// Controller states. teardown is the only transition out of live.
const (
	ctrlLive uint8 = iota
	ctrlDead
)

// ctrl is one controller: the association of a host with a subsystem,
// created by an admin queue Connect and torn down when its admin queue
// closes, its keep-alive expires, or the target removes it.
type ctrl struct {
	t       *Target
	s       *Subsystem
	cntlid  uint16
	hostNQN string
	hostID  [16]byte
	created time.Time
	disc    bool
	admin   *Queue
	// lim are the limits of the port the admin queue came through, and
	// cap the CAP property they make (MQES). Set at the admin Connect
	// and never changed: the I/O path reads them without a lock.
	lim Limits
	cap nvme.CAP

	// ready mirrors CSTS.RDY and dead the dead state, for the I/O path.
	ready atomic.Bool
	dead  atomic.Bool
	// traffic says a command was executed on one of the controller's
	// queues since the keep-alive timer last looked (traffic-based
	// keep-alive, CTRATT.TBKAS): set by every queue (sawCommand), cleared
	// by the timer and by Keep Alive. It is written once per keep-alive
	// period, not per command, so the cache line it shares with ready
	// and dead stays shared between the cores reading it.
	traffic atomic.Bool

	mu    sync.Mutex // guards below; ordered after Subsystem.mu
	state uint8
	cc    nvme.CC
	csts  nvme.CSTS

	kato time.Duration // keep-alive timeout, whole seconds; 0 = none
	// quiet: a discovery controller that has executed no command since
	// its Connect; its keep-alive deadline is then at most
	// Config.DiscoveryIdleTimeout away (budget.go).
	quiet      bool
	kaDeadline time.Time
	kaTimer    Timer
	kaGen      uint64 // invalidates a timer that fires after a re-arm

	queues []*Queue // by QID; [0] is the admin queue
	nioq   int      // connected I/O queues
	nsqa   uint32   // granted I/O submission queues (1's based)
	ncqa   uint32   // granted I/O completion queues (1's based)

	aec        uint32 // Asynchronous Event Configuration
	masked     uint32 // AEN bits sent and not yet cleared by reading their log
	coalescing uint32 // Interrupt Coalescing feature value

	feat ctrlFeatures // features 01h, 02h, 04h, 05h (features_ctrl.go)

	aers    [aerLimit]*Request // held AERs, oldest first
	naers   int
	events  [eventLimit]uint32 // pending event DW0s, oldest first
	nevents int

	changed    []uint32 // Changed Namespace List; overflow: [NSIDAll]
	changedMax bool

	errs     []nvme.ErrorLogEntry // ring, errCount%len is the next slot
	errCount uint64

	logBuf []byte // scratch for building log pages

	resv ctrlResv // the reservation notification log and mask (resv_cmd.go)
}

func newCtrl(t *Target, s *Subsystem, cntlid uint16, admin *Queue, d *nvme.ConnectData) *ctrl {
	lim := admin.lim
	c := &ctrl{t: t, s: s, cntlid: cntlid, hostNQN: d.HostNQN.String(), hostID: d.HostID,
		created: t.clock.Now(), disc: s.discovery, admin: admin, lim: lim, cap: makeCAP(&lim),
		// The admin queue and every I/O queue the port allows, by QID.
		queues: make([]*Queue, int(lim.MaxIOQueues)+1),
		nsqa:   uint32(lim.MaxIOQueues), ncqa: uint32(lim.MaxIOQueues),
		errs: make([]nvme.ErrorLogEntry, t.cfg.ErrorLogEntries),
		feat: newCtrlFeatures(),
	}
	if c.disc {
		c.queues = c.queues[:1]
		c.nsqa, c.ncqa = 0, 0
		c.quiet = true
	}
	c.aec = newCtrlAEC(c.disc, s.ana)
	c.queues[0] = admin
	return c
}

// oaes is what the controller reports in OAES and accepts in the Async
// Event Configuration feature.
func (c *ctrl) oaes() uint32 {
	if c.disc {
		return nvme.AENDiscoveryLogs
	}
	if c.s.ana {
		return nvme.AENNSAttr | nvme.AENANAChange
	}
	return nvme.AENNSAttr
}

// maxQID is the largest I/O QID the host may connect. Requires c.mu.
func (c *ctrl) maxQID() uint32 { return min(c.nsqa, c.ncqa) }

// setKATO sets the keep-alive timeout from a KATO in milliseconds,
// rounded up to whole seconds as nvmet does, and restarts the timer.
// Requires c.mu.
func (c *ctrl) setKATO(ms uint32) {
	c.kato = time.Duration((uint64(ms)+999)/1000) * time.Second
	c.armKeepAlive()
}

// armKeepAlive restarts the keep-alive timer from now (or stops it for
// KATO 0). Requires c.mu.
func (c *ctrl) armKeepAlive() {
	c.kaGen++
	if c.kaTimer != nil {
		c.kaTimer.Stop()
		c.kaTimer = nil
	}
	if c.kato == 0 || c.state != ctrlLive {
		return
	}
	// Commands before now are covered by the deadline set below.
	c.traffic.Store(false)
	d := c.kato
	if c.quiet {
		d = min(d, c.t.cfg.DiscoveryIdleTimeout)
	}
	c.kaDeadline = c.t.clock.Now().Add(d)
	gen := c.kaGen
	c.kaTimer = c.t.clock.AfterFunc(d, func() { c.keepAliveFired(gen) })
}

// spoke records a command (other than Connect) on a discovery
// controller's admin queue: the first one ends its quiet time and gives
// it its whole KATO from now. The timer, armed for the idle timeout,
// re-arms itself for what is left when it fires. Discovery controllers
// have no I/O queues: this is never on the I/O path.
func (c *ctrl) spoke() {
	c.mu.Lock()
	if c.quiet {
		c.quiet = false
		c.kaDeadline = c.t.clock.Now().Add(c.kato)
	}
	c.mu.Unlock()
}

// keepAlive pushes the deadline back by one KATO. Requires c.mu. The
// timer is not re-armed: when it fires early it re-arms itself for what
// is left, so a Keep Alive costs no timer operation. The traffic flag is
// cleared before the clock is read: every command that set it is then
// older than the new deadline's start, so a Keep Alive restarts the
// timer exactly, and traffic seen before it does not extend it further.
func (c *ctrl) keepAlive() {
	c.traffic.Store(false)
	c.kaDeadline = c.t.clock.Now().Add(c.kato)
}

// sawCommand records that a command was executed on one of the
// controller's queues, for traffic-based keep-alive. It runs on every
// command of every queue: one atomic load, and a store only for the
// first command after the timer last cleared the flag. No lock.
func (c *ctrl) sawCommand() {
	if !c.traffic.Load() {
		c.traffic.Store(true)
	}
}

// keepAliveFired runs when the timer armed as generation gen fires. Before
// the deadline (a Keep Alive pushed it) it re-arms for what is left. At
// the deadline, traffic-based keep-alive (TBKAS, NVMe 2.0 §3.9.4): if any
// command was executed since the timer last looked, that command restarts
// the timer, which re-arms for a whole KATO from now; else the controller
// is torn down. Only I/O controllers advertise TBKAS: a discovery
// controller's host keeps it alive with Keep Alive alone. As nvmet (reset_tbkas), the command is not timed exactly:
// the controller expires between KATO and 2 × KATO after its last command,
// never before (the flag is cleared only here and by Keep Alive, which
// restarts the timer itself). A discovery controller still quiet at its
// deadline sent nothing after its Connect within DiscoveryIdleTimeout:
// it is torn down as idle (ErrDiscoveryIdle).
func (c *ctrl) keepAliveFired(gen uint64) {
	c.mu.Lock()
	if gen != c.kaGen || c.state != ctrlLive || c.kato == 0 {
		c.mu.Unlock()
		return
	}
	now := c.t.clock.Now()
	if left := c.kaDeadline.Sub(now); left > 0 {
		c.kaTimer = c.t.clock.AfterFunc(left, func() { c.keepAliveFired(gen) })
		c.mu.Unlock()
		return
	}
	if c.quiet {
		c.mu.Unlock()
		c.t.stats.discoveryIdle.Add(1)
		c.logDiscoveryIdle()
		c.teardown(ErrDiscoveryIdle)
		return
	}
	if !c.disc && c.traffic.Swap(false) {
		c.kaDeadline = now.Add(c.kato)
		c.kaTimer = c.t.clock.AfterFunc(c.kato, func() { c.keepAliveFired(gen) })
		c.mu.Unlock()
		c.t.stats.keepAliveTraffic.Add(1)
		return
	}
	c.mu.Unlock()
	c.t.stats.keepAliveExpired.Add(1)
	c.logKeepAliveExpired()
	c.teardown(ErrKeepAliveExpired)
}

// teardown ends the controller: it stops the keep-alive timer, completes
// held AERs with Abort SQ Deleted, frees the CNTLID and asks the binding
// to drop every queue's connection. It may be called any number of times
// from any goroutine holding no lock; only the first acts.
func (c *ctrl) teardown(reason error) {
	c.mu.Lock()
	if c.state != ctrlLive {
		c.mu.Unlock()
		return
	}
	c.state = ctrlDead
	c.dead.Store(true)
	c.ready.Store(false)
	c.kaGen++
	if c.kaTimer != nil {
		c.kaTimer.Stop()
		c.kaTimer = nil
	}
	var aers [aerLimit]*Request
	n := copy(aers[:], c.aers[:c.naers])
	c.naers = 0
	nio := c.nioq
	queues := make([]*Queue, 0, c.nioq+1)
	for _, q := range c.queues {
		// A queue the binding closed already needs no Disconnect.
		if q != nil && q.state.Load() != queueClosed {
			queues = append(queues, q)
		}
	}
	c.mu.Unlock()

	c.s.removeCtrl(c)
	c.t.freeCNTLID(c.cntlid, false, c.disc, c.admin.source)
	c.t.stats.ctrlTornDown.Add(1)
	c.logDestroyed(reason, nio)
	for _, r := range aers[:n] {
		r.q.complete(r, nvme.StatusAbortSQDeleted)
	}
	for _, q := range queues {
		q.resp.Disconnect(reason)
	}
}

// abandon ends a controller whose Connect failed before it was
// registered: no queue to disconnect, no AER to complete.
func (c *ctrl) abandon() {
	c.mu.Lock()
	c.state = ctrlDead
	c.dead.Store(true)
	c.kaGen++
	if c.kaTimer != nil {
		c.kaTimer.Stop()
		c.kaTimer = nil
	}
	c.mu.Unlock()
	c.t.freeCNTLID(c.cntlid, true, c.disc, c.admin.source)
}

// removeQueue forgets a closed I/O queue.
func (c *ctrl) removeQueue(q *Queue) {
	c.mu.Lock()
	if int(q.qid) < len(c.queues) && c.queues[q.qid] == q {
		c.queues[q.qid] = nil
		c.nioq--
	}
	c.mu.Unlock()
}

// setCC applies a Property Set of CC, as nvmet_update_cc: EN 0→1 checks
// the configuration and sets RDY (or CFS); EN 1→0 clears RDY; SHN set
// starts a shutdown, which flushes every namespace on a worker goroutine
// and then reports SHST complete. Requires c.mu.
func (c *ctrl) setCC(v nvme.CC) {
	old := c.cc
	c.cc = v
	if v.EN() && !old.EN() {
		c.enable()
	}
	if !v.EN() && old.EN() {
		c.csts &^= nvme.CSTSReady
		c.ready.Store(false)
	}
	if v.SHN() != nvme.ShutdownNone && old.SHN() == nvme.ShutdownNone && c.state == ctrlLive {
		c.csts &^= nvme.CSTSReady
		c.ready.Store(false)
		c.csts = c.csts.WithSHST(nvme.ShutdownStatusOccurring)
		c.shutdown()
	}
	if v.SHN() == nvme.ShutdownNone && old.SHN() != nvme.ShutdownNone {
		c.csts = c.csts.WithSHST(nvme.ShutdownStatusNormal)
	}
}

// enable is the EN 0→1 edge: the checks nvmet_start_ctrl makes. Requires
// c.mu.
func (c *ctrl) enable() {
	cc := c.cc
	ok := cc.MPS() == 0 && cc.AMS() == 0 && (cc.CSS() == nvme.CCCSSNVM || cc.CSS() == nvme.CCCSSCSI)
	// A discovery controller has no I/O queues: nvmet does not check
	// their entry sizes there.
	if !c.disc && (cc.IOSQES() != 6 || cc.IOCQES() != 4) {
		ok = false
	}
	if !ok {
		c.csts = nvme.CSTSCFS
		c.t.logf("target: controller %d: CC %#08x refused: controller fatal status", c.cntlid, uint32(cc))
		return
	}
	c.csts = nvme.CSTSReady
	c.ready.Store(true)
	// As nvmet: restart the keep-alive timer on enable, so the time a
	// host took to enable is not held against it.
	c.armKeepAlive()
}

// shutdown flushes every namespace on a goroutine of its own (the caller
// is a binding's notification goroutine and must not wait for a sync),
// then reports SHST complete unless the host cleared SHN meanwhile.
// Requires c.mu.
func (c *ctrl) shutdown() {
	c.t.bg.Add(1)
	go func() {
		defer c.t.bg.Done()
		if !c.disc {
			for _, ns := range c.s.table().list {
				if !ns.acquire() {
					continue
				}
				if err := ns.flushWait(); err != nil {
					c.t.logf("target: controller %d: shutdown flush of NSID %d: %v", c.cntlid, ns.nsid, err)
				} else {
					ns.c.flushes.Add(1)
				}
				ns.release()
			}
		}
		c.mu.Lock()
		if c.cc.SHN() != nvme.ShutdownNone && c.csts.SHST() == nvme.ShutdownStatusOccurring {
			c.csts = c.csts.WithSHST(nvme.ShutdownStatusComplete)
		}
		c.mu.Unlock()
	}()
}

// postEvent queues an asynchronous event, or hands it to a held AER,
// which the caller completes once it has released c.mu. Requires c.mu.
func (c *ctrl) postEvent(dw0 uint32) *Request {
	if c.naers > 0 {
		r := c.aers[0]
		copy(c.aers[:], c.aers[1:c.naers])
		c.naers--
		c.aers[c.naers] = nil
		r.Rsp.DW0 = dw0
		return r
	}
	if c.nevents == len(c.events) {
		c.t.stats.eventsDropped.Add(1)
		return nil
	}
	c.events[c.nevents] = dw0
	c.nevents++
	return nil
}

// nsChanged records a namespace change: the NSID goes into the Changed
// Namespace List, and a namespace attribute notice is sent if the host
// enabled it and has read the log since the last one (nvmet's masking).
func (c *ctrl) nsChanged(nsid uint32) {
	if c.disc {
		return
	}
	c.mu.Lock()
	if c.state != ctrlLive {
		c.mu.Unlock()
		return
	}
	if !c.changedMax && !slices.Contains(c.changed, nsid) {
		if len(c.changed) == nvme.MaxChangedNamespaces {
			// More than the log holds: its first entry says so.
			c.changed = append(c.changed[:0], nvme.NSIDAll)
			c.changedMax = true
		} else {
			c.changed = append(c.changed, nsid)
		}
	}
	r := c.noticeLocked(nvme.AENNSAttr, nvme.AERNoticeNS, nvme.LogChangedNSList)
	c.mu.Unlock()
	if r != nil {
		r.q.complete(r, nvme.StatusSuccess)
	}
}

// noticeLocked posts the notice (AER information info, log page lid) of
// event aen if the host enabled it and has read that log since the last
// one (nvmet's masking), and masks it; it returns the AER request to
// complete once c.mu is released (nil: none sent). The caller holds c.mu.
func (c *ctrl) noticeLocked(aen uint32, info, lid uint8) *Request {
	if c.aec&aen == 0 || c.masked&aen != 0 {
		return nil
	}
	c.masked |= aen
	return c.postEvent(nvme.AsyncEventResult(nvme.AERTypeNotice, info, lid))
}

// notice sends, to a live controller, the notice of event aen as
// noticeLocked does.
func (c *ctrl) notice(aen uint32, info, lid uint8) {
	c.mu.Lock()
	var r *Request
	if c.state == ctrlLive {
		r = c.noticeLocked(aen, info, lid)
	}
	c.mu.Unlock()
	if r != nil {
		r.q.complete(r, nvme.StatusSuccess)
	}
}

// discChanged sends a discovery log change notice to a discovery
// controller that enabled it and has read the log since the last one.
func (c *ctrl) discChanged() { c.notice(nvme.AENDiscoveryLogs, nvme.AERNoticeDisc, nvme.LogDiscovery) }

// discoveryChanged notifies every discovery controller that the log's
// generation changed. Call it holding no lock.
func (t *Target) discoveryChanged() {
	for _, c := range t.disc.controllers() {
		c.discChanged()
	}
}

// recordError adds a failed command to the Error Information log.
func (c *ctrl) recordError(q *Queue, r *Request, s nvme.Status) {
	e := nvme.ErrorLogEntry{SQID: q.qid, CID: r.Cmd.CID, Status: s, ParamLoc: nvme.ParamLocNone, NSID: r.Cmd.NSID}
	if q.qid != 0 && !r.Cmd.IsFabrics() {
		switch nvme.IOOpcode(r.Cmd.Opcode) {
		case nvme.IORead, nvme.IOWrite, nvme.IOCompare, nvme.IOWriteZeroes:
			e.LBA = r.Cmd.SLBA()
		}
	}
	c.mu.Lock()
	if c.state == ctrlLive {
		c.errCount++
		e.ErrorCount = c.errCount
		c.errs[(c.errCount-1)%uint64(len(c.errs))] = e
	}
	c.mu.Unlock()
}

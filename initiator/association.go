package initiator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/auth"
)

// Connect answers. A queue's Fabrics Connect is the first message on its
// fresh RDMA connection, and a peer may lose it without a word: Linux siw
// as responder does not process an FPDU that arrives right after its MPA
// reply until more data comes (shared/docs/vm-notes.md), and nothing more
// comes, since the host waits for the answer. A pause before the first
// FPDU (the soft provider's FirstFPDUDelay) only narrows that window. So a
// Connect gets connectAnswerTimeout for its answer, doubling on each new
// attempt up to Config.ConnectTimeout; when it passes unanswered, the
// association is torn down (the target may hold a half-made controller;
// closing its admin queue ends it) and made anew, at most
// connectAttempts times within the caller's context.
const (
	// connectAnswerTimeout: 2 s, hundreds of times what a Linux or blk
	// target takes to answer a Connect, even under emulation (tens of
	// ms measured in e2e/), so that a slow target is not retried, and
	// short enough that a lost Connect costs little.
	connectAnswerTimeout = 2 * time.Second
	// connectAttempts: 5 attempts (2+4+8+16+... s capped by
	// ConnectTimeout); a peer that loses five Connects in a row is not
	// going to answer.
	connectAttempts = 5
)

// errConnectUnanswered is the cause of an association abandoned because a
// Fabrics Connect got no answer within its answer timeout.
var errConnectUnanswered = errors.New("Fabrics Connect unanswered")

// establish builds a new association, anew when a Connect goes
// unanswered (above).
func (c *Controller) establish(ctx context.Context) (*association, error) {
	answer := min(connectAnswerTimeout, c.cfg.ConnectTimeout)
	for attempt := 1; ; attempt++ {
		a, err := c.establishOnce(ctx, answer)
		if err == nil || !errors.Is(err, errConnectUnanswered) || attempt >= connectAttempts || ctx.Err() != nil {
			return a, err
		}
		c.st.connectRetries.Add(1)
		c.logf("%v; new association (attempt %d of %d)", err, attempt+1, connectAttempts)
		answer = min(2*answer, c.cfg.ConnectTimeout)
	}
}

// establishOnce builds a new association: the Linux host's sequence (§8).
// Each queue's Connect gets answer for its answer.
func (c *Controller) establishOnce(ctx context.Context, answer time.Duration) (a *association, err error) {
	a = newAssociation(c)
	a.connectAnswer = answer
	defer func() {
		if err != nil {
			a.fail(err)
			c.teardown(a)
		}
	}()
	a.wg.Add(1)
	go a.monitor()

	kato := c.cfg.katoMillis()
	if c.discovery && c.discNotice == nil {
		kato = 0 // non-persistent discovery connect, as nvme discover
	}
	a.admin, err = a.newQueue(ctx, 0, adminDepth, adminBufSize, c.adminInCapsule(), 0)
	if err != nil {
		return a, err
	}
	if err = a.enable(ctx); err != nil {
		return a, err
	}
	if err = a.identify(ctx); err != nil {
		return a, err
	}
	a.kaOn.Store(kato != 0)
	if c.discovery {
		if c.discNotice != nil {
			err = a.watchDiscovery(ctx)
		}
		return a, err
	}

	if a.maxXfer, err = maxTransfer(c.cfg.MaxTransfer, &a.id, c.info); err != nil {
		return a, err
	}
	if a.depth, err = ioQueueDepth(c.cfg.QueueDepth, a.cap, a.id.MaxCmd); err != nil {
		return a, err
	}
	a.inCapsule = min(a.id.ioInCapsule(c.tcp), a.maxXfer)
	var cmd nvme.Command
	setFeaturesCmd(&cmd, nvme.FeatureNumQueues, numQueuesValue(c.cfg.Queues))
	cqe, err := a.admin.exec(ctx, &cmd, nil, nil, c.cfg.AdminTimeout)
	if err != nil {
		return a, fmt.Errorf("initiator: Number of Queues: %w", err)
	}
	n := min(c.cfg.Queues, grantedQueues(cqe.DW0))
	for i := 1; i <= n; i++ {
		q, err := a.newQueue(ctx, uint16(i), a.depth, a.maxXfer, a.inCapsule, c.cfg.IOTimeout)
		if err != nil {
			return a, err
		}
		a.io = append(a.io, q)
	}
	if a.id.OAES&oaesNSAttr != 0 {
		// Only the notice the host acts on (Linux asks for OAES &
		// its supported set).
		setFeaturesCmd(&cmd, nvme.FeatureAsyncEventConfig, oaesNSAttr)
		if _, err := a.admin.exec(ctx, &cmd, nil, nil, c.cfg.AdminTimeout); err != nil {
			if !errors.As(err, new(*StatusError)) {
				return a, err
			}
			c.logf("Async Event Configuration refused: %v", err)
		} else {
			a.armAER()
		}
	}
	found, err := a.scan(ctx)
	if err != nil {
		return a, err
	}
	c.applyScan(found)
	c.logf("connected: CNTLID %#x, %d I/O queues × %d entries, max transfer %d, in-capsule %d, %d namespaces",
		a.cntlid, len(a.io), a.depth, a.maxXfer, a.inCapsule, len(found))
	return a, nil
}

// newQueue creates queue qid: its slots and wire (an RDMA QP and its RDMA
// CM connection, or a TCP connection and its ICReq/ICResp), then the
// Fabrics Connect. The admin queue's Connect returns the CNTLID.
func (a *association) newQueue(ctx context.Context, qid uint16, depth, bufSize, inCapsule int, timeout time.Duration) (*queue, error) {
	c := a.c
	q := &queue{a: a, qid: qid, depth: depth, bufSize: bufSize, inCapsule: inCapsule, timeout: timeout}
	// The slots exist before the queue is published: the monitor walks
	// the slots of every queue in a.queues.
	var rw *rdmaWire
	var tw *tcpWire
	if c.tcp {
		tw = newTCPWire(q, c.cfg.tcpDigests())
	} else {
		var err error
		if rw, err = newRDMAWire(q, c.pd, c.eng); err != nil {
			return nil, fmt.Errorf("initiator: %w", err)
		}
	}
	a.mu.Lock()
	if a.failed.Load() {
		a.mu.Unlock()
		q.w.release()
		return nil, a.lostErr()
	}
	a.queues = append(a.queues, q)
	a.mu.Unlock()
	if tw != nil {
		if err := a.connectTCP(ctx, q, tw); err != nil {
			return nil, err
		}
	} else if err := a.connectRDMA(ctx, q, rw); err != nil {
		return nil, err
	}

	// Fabrics Connect. RDMA: the admin queue sends its data keyed
	// (inCapsule 0: the target RDMA-READs the 1024 bytes, as from
	// Linux); I/O queues send it in the capsule when the controller
	// takes 1024 bytes of in-capsule data (SGLS bit 20 and IOCCSZ). TCP:
	// always in the capsule (fabrics commands take 8192 bytes).
	var cmd nvme.Command
	katoMs := uint32(0)
	cntlid := a.cntlid
	if qid == 0 {
		if !c.discovery {
			katoMs = c.cfg.katoMillis()
		}
		cntlid = nvme.CNTLIDDynamic
	}
	connectCmd(&cmd, qid, depth, katoMs)
	var data [nvme.ConnectDataSize]byte
	if err := connectData(&data, c.cfg.HostID, cntlid, c.subNQN, c.cfg.HostNQN); err != nil {
		return nil, fmt.Errorf("%w: connect data: %v", ErrInvalidConfig, err)
	}
	actx, acancel := context.WithTimeoutCause(ctx, a.connectAnswer, errConnectUnanswered)
	cqe, err := q.exec(actx, &cmd, data[:], nil, c.cfg.ConnectTimeout)
	acancel()
	if err != nil {
		return nil, fmt.Errorf("initiator: connect queue %d to %s: %w", qid, c.subNQN, err)
	}
	if qid == 0 {
		a.cntlid = nvme.ConnectResponseCNTLID(cqe.DW0)
		if a.cntlid < nvme.CNTLIDMin || a.cntlid > nvme.CNTLIDMax {
			return nil, fmt.Errorf("%w: Connect returned CNTLID %#x", ErrProtocol, a.cntlid)
		}
	}
	if cqe.DW0&nvme.ConnectAuthReqASCR != 0 {
		return nil, fmt.Errorf("%w: controller requires a secure channel (AUTHREQ %#x)", ErrNotSupported, cqe.DW0>>16)
	}
	if cqe.DW0&nvme.ConnectAuthReqATR != 0 {
		if err := q.authenticate(ctx); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// authenticate runs DH-HMAC-CHAP on a queue whose Connect asked for it
// (ATR): the queue is usable only once it succeeds.
func (q *queue) authenticate(ctx context.Context) error {
	c := q.a.c
	hc, err := c.cfg.authConfig(c.subNQN)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if hc == nil {
		return fmt.Errorf("%w: controller requires DH-HMAC-CHAP authentication of host %s (queue %d): set Config.DHCHAPSecret (blkctl attach --dhchap-secret)", ErrAuthRequired, c.cfg.HostNQN, q.qid)
	}
	tid := uint16(c.authTID.Add(1))
	hash, group, err := auth.Authenticate(*hc, tid, authQueue{q: q, ctx: ctx})
	if err != nil {
		return fmt.Errorf("%w: queue %d: %w", ErrAuthRequired, q.qid, err)
	}
	if q.qid == 0 {
		c.logf("authenticated to %s (%v, %v, bidirectional %v)", c.subNQN, hash, group, hc.CtrlKey != nil)
	}
	return nil
}

// authQueue carries AUTH_SEND / AUTH_RECEIVE on one queue.
type authQueue struct {
	q   *queue
	ctx context.Context
}

func authCmd(ft nvme.FabricsType, length uint32) nvme.Command {
	c := nvme.Command{Opcode: nvme.OpcodeFabrics, Flags: cmdFlags, NSID: uint32(ft)}
	c.CDW10 = uint32(auth.SECP)<<24 | uint32(auth.SPSP1)<<16 | uint32(auth.SPSP0)<<8
	c.CDW11 = length
	return c
}

func (t authQueue) AuthSend(b []byte) error {
	cmd := authCmd(nvme.FabricsAuthSend, uint32(len(b)))
	_, err := t.q.exec(t.ctx, &cmd, b, nil, t.q.a.c.cfg.AdminTimeout)
	return err
}

func (t authQueue) AuthReceive(al int) ([]byte, error) {
	al = min(al, t.q.bufSize)
	buf := make([]byte, al)
	cmd := authCmd(nvme.FabricsAuthRecv, uint32(al))
	_, err := t.q.exec(t.ctx, &cmd, nil, buf, t.q.a.c.cfg.AdminTimeout)
	return buf, err
}

// Property access on the admin queue.
func (a *association) propGet(ctx context.Context, off uint32, size8 bool) (uint64, error) {
	var cmd nvme.Command
	propertyGetCmd(&cmd, off, size8)
	cqe, err := a.admin.exec(ctx, &cmd, nil, nil, a.c.cfg.AdminTimeout)
	if err != nil {
		return 0, fmt.Errorf("initiator: Property Get %#x: %w", off, err)
	}
	if size8 {
		return cqe.Result64(), nil
	}
	return uint64(cqe.DW0), nil
}

func (a *association) propSet(ctx context.Context, off uint32, v uint64) error {
	var cmd nvme.Command
	propertySetCmd(&cmd, off, v)
	if _, err := a.admin.exec(ctx, &cmd, nil, nil, a.c.cfg.AdminTimeout); err != nil {
		return fmt.Errorf("initiator: Property Set %#x = %#x: %w", off, v, err)
	}
	return nil
}

// pollInterval is the CSTS polling period (Linux: 1–2 ms).
const pollInterval = time.Millisecond

// enable is the enable handshake of a current Linux host (§2.2): CAP, CC
// with EN = 0, CAP again (CRTO if CAP.CRWMS), CC with EN = 1, CSTS polled
// until RDY within the ready timeout, then VS.
func (a *association) enable(ctx context.Context) error {
	v, err := a.propGet(ctx, nvme.PropCAP, true)
	if err != nil {
		return err
	}
	a.cap = nvme.CAP(v)
	if a.cap.MPSMIN() != 0 {
		return fmt.Errorf("%w: minimum page size 2^%d too large (CAP.MPSMIN must be 0)", ErrProtocol, 12+int(a.cap.MPSMIN()))
	}
	css := nvme.CCCSSNVM
	if a.cap.CSS()&nvme.CAPCSSIOCS != 0 {
		css = nvme.CCCSSCSI
	}
	a.cc = nvme.MakeCC(nvme.CCFields{CSS: css, IOSQES: 6, IOCQES: 4})
	if err := a.propSet(ctx, nvme.PropCC, uint64(a.cc)); err != nil {
		return err
	}
	if v, err = a.propGet(ctx, nvme.PropCAP, true); err != nil {
		return err
	}
	a.cap = nvme.CAP(v)
	// The ready timeout: (CAP.TO + 1) × 500 ms, as Linux waits, or
	// CRTO.CRWMT when the controller reports it and it is larger.
	timeout := time.Duration(a.cap.TO()+1) * 500 * time.Millisecond
	if a.cap.CRWMS() {
		crto, err := a.propGet(ctx, nvme.PropCRTO, false)
		if err != nil {
			return err
		}
		timeout = max(timeout, time.Duration(uint16(crto))*500*time.Millisecond)
	}
	a.cc |= nvme.CCEnable
	if err := a.propSet(ctx, nvme.PropCC, uint64(a.cc)); err != nil {
		return err
	}
	if err := a.waitCSTS(ctx, timeout, "ready", func(s nvme.CSTS) bool { return s.RDY() }); err != nil {
		return err
	}
	vs, err := a.propGet(ctx, nvme.PropVS, false)
	if err != nil {
		return err
	}
	a.vs = nvme.Version(vs)
	return nil
}

// waitCSTS polls CSTS until ok or timeout.
func (a *association) waitCSTS(ctx context.Context, timeout time.Duration, what string, ok func(nvme.CSTS) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		v, err := a.propGet(ctx, nvme.PropCSTS, false)
		if err != nil {
			return err
		}
		csts := nvme.CSTS(v)
		if csts == 0xFFFFFFFF {
			return fmt.Errorf("%w: CSTS reads all ones", ErrProtocol)
		}
		if ok(csts) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: controller not %s after %v (CSTS %#x)", ErrTimeout, what, timeout, uint32(csts))
		}
		t := time.NewTimer(pollInterval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-a.done:
			t.Stop()
			return a.lostErr()
		}
	}
}

// identify reads Identify Controller and applies the host's checks.
func (a *association) identify(ctx context.Context) error {
	buf := make([]byte, identifySize)
	if err := a.identifyCNS(ctx, nvme.CNSController, 0, buf); err != nil {
		return err
	}
	id, err := parseIdentifyController(buf)
	if err != nil {
		return err
	}
	a.id = id
	if a.c.discovery {
		if id.CntrlType != cntrlTypeDisc && id.SubNQN != nvme.DiscoveryNQN {
			return fmt.Errorf("%w: %s is not a discovery controller (CNTRLTYPE %d, SUBNQN %q)", ErrProtocol, a.c.addr, id.CntrlType, id.SubNQN)
		}
		return id.checkTransport(a.c.tcp)
	}
	return id.checkIO(a.cntlid, a.c.tcp)
}

func (a *association) identifyCNS(ctx context.Context, cns uint8, nsid uint32, buf []byte) error {
	var cmd nvme.Command
	identifyCmd(&cmd, cns, nsid, 0)
	if _, err := a.admin.exec(ctx, &cmd, nil, buf, a.c.cfg.AdminTimeout); err != nil {
		return fmt.Errorf("initiator: Identify CNS %#02x NSID %d: %w", cns, nsid, err)
	}
	return nil
}

// scanned is one namespace found by a scan.
type scanned struct {
	nsid  uint32
	ident nsIdentity
}

// scan lists the active namespaces and identifies each (§8 step 18):
// CNS 0x02 from NSID 0 (again from the last NSID while pages are full),
// then per NSID CNS 0x03 when VER ≥ 1.3 (an error skips the namespace) and
// CNS 0x00 (NCAP 0 skips it). A namespace the host cannot use (metadata
// formats, blocks larger than the largest transfer) is skipped with a
// log. Only transport failures fail the scan.
func (a *association) scan(ctx context.Context) ([]scanned, error) {
	c := a.c
	buf := make([]byte, identifySize)
	var ids []uint32
	listed := a.vs >= nvme.MakeVersion(1, 1, 0) || a.id.Version >= nvme.MakeVersion(1, 1, 0)
	for from := uint32(0); listed; {
		if err := a.identifyCNS(ctx, nvme.CNSActiveNSList, from, buf); err != nil {
			if !errors.As(err, new(*StatusError)) {
				return nil, err
			}
			c.logf("active namespace list refused (%v); scanning 1..NN", err)
			listed, ids = false, nil
			break
		}
		var full bool
		ids, full = parseNSList(buf, ids)
		if !full || len(ids) == 0 {
			break
		}
		from = ids[len(ids)-1]
		if from >= 0xFFFFFFFE {
			break
		}
	}
	if !listed {
		for id := uint32(1); id <= min(a.id.NN, 1024); id++ {
			ids = append(ids, id)
		}
	}
	ver := max(a.vs, a.id.Version)
	var out []scanned
	for _, nsid := range ids {
		if ver >= nvme.MakeVersion(1, 3, 0) {
			if err := a.identifyCNS(ctx, nvme.CNSNSDescriptorList, nsid, buf); err != nil {
				if !errors.As(err, new(*StatusError)) {
					return nil, err
				}
				c.logf("namespace %d skipped: %v", nsid, err)
				continue
			}
			d, err := parseNSDescriptors(buf)
			if err != nil {
				c.logf("namespace %d skipped: %v", nsid, err)
				continue
			}
			if a.cc.CSS() == nvme.CCCSSCSI && (!d.HasCSI || d.CSI != 0) {
				c.logf("namespace %d skipped: not an NVM command set namespace", nsid)
				continue
			}
		}
		if err := a.identifyCNS(ctx, nvme.CNSNamespace, nsid, buf); err != nil {
			if !errors.As(err, new(*StatusError)) {
				return nil, err
			}
			c.logf("namespace %d skipped: %v", nsid, err)
			continue
		}
		ident, err := parseIdentifyNamespace(buf)
		switch {
		case err != nil:
			c.logf("namespace %d skipped: %v", nsid, err)
			continue
		case ident.Capacity == 0:
			continue // not allocated (NCAP 0), as Linux
		case ident.Metadata != 0:
			c.logf("namespace %d skipped: format with %d metadata bytes", nsid, ident.Metadata)
			continue
		case ident.BlockSize > a.maxXfer:
			c.logf("namespace %d skipped: block size %d above the largest transfer %d", nsid, ident.BlockSize, a.maxXfer)
			continue
		}
		out = append(out, scanned{nsid: nsid, ident: ident})
	}
	return out, nil
}

// shutdownTimeout is the bound of the shutdown wait: ShutdownTimeout, or
// RTD3E when the controller reports more, at most 60 s (Linux).
func (c *Controller) shutdownTimeout(a *association) time.Duration {
	t := c.cfg.ShutdownTimeout
	if r := time.Duration(a.id.RTD3E) * time.Microsecond; r > t {
		t = min(r, 60*time.Second)
	}
	return t
}

// shutdown is the normal shutdown of nvme disconnect: CC.SHN = 01 with EN
// kept, then CSTS polled until SHST = complete. No Disconnect command is
// sent; the QPs are simply closed afterwards.
func (a *association) shutdown(ctx context.Context) error {
	a.kaOn.Store(false)
	cc := a.cc&^(3<<14) | nvme.CC(nvme.ShutdownNormal)<<14
	if err := a.propSet(ctx, nvme.PropCC, uint64(cc)); err != nil {
		return err
	}
	return a.waitCSTS(ctx, a.c.shutdownTimeout(a), "shut down", func(s nvme.CSTS) bool {
		return s.SHST() == nvme.ShutdownStatusComplete
	})
}

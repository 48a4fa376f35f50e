package initiator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

// fakeTarget is a minimal NVMe-oF RDMA target for the tests, on its own
// soft adapter: just enough of nvmet-rdma's behaviour to drive the host —
// CM private data, Connect (data fetched by RDMA READ when keyed, taken
// from the capsule otherwise), Property Get/Set with the enable and
// shutdown edges, Identify (controller, namespace, list, descriptors), Set
// Features, Get Log Page (discovery, changed namespaces), Keep Alive, AER,
// and Read/Write/Flush/Write Zeroes/DSM against byte slices. One goroutine
// per queue handles one command at a time and waits for its RDMA transfer
// before the next, so one scratch buffer per queue suffices. Its steady
// state allocates nothing, so the host's allocation guard can run against
// it. Knobs make it mute, refuse, disconnect or misbehave.
type fakeTarget struct {
	t      testing.TB
	a      *soft.Adapter
	ln     transport.Listener
	addr   string
	subNQN string
	disc   bool

	// Set before start.
	mqes      uint16
	maxcmd    uint16
	mdts      uint8
	ioccsz    uint32
	sgls      uint32
	oaes      uint32
	oncs      uint16
	maxQueues int
	entries   []nvme.DiscoveryLogEntry

	mu       sync.Mutex
	ns       map[uint32][]byte // 512-byte blocks
	ctrls    map[uint16]*fakeCtrl
	nextID   uint16
	conns    map[*fakeConn]struct{}
	admin    []string // transcript of admin commands, all controllers
	cmReqs   [][]byte
	sqes     [][]byte // raw Connect SQEs
	connData [][]byte
	aers     []fakeAER
	genctr   uint64
	bumpGen  int // change GENCTR at this discovery log read (1-based)
	logReads int

	mute       atomic.Bool // answer nothing
	muteKA     atomic.Bool // answer no Keep Alive
	refuseCM   atomic.Bool // reject RDMA CM connects
	refuseDNR  atomic.Bool // answer Connect with Connect Invalid Host + DNR
	invalidate atomic.Bool // answer I/O with Send with Invalidate
	holdIO     atomic.Bool // answer no I/O command
	// Drop (never answer) this many more Connect capsules on admin
	// queues and on I/O queues: a peer that loses a connection's first
	// message, as Linux siw can.
	dropAdminConnects, dropIOConnects atomic.Int64
	kaCount                           atomic.Int64
	shutdowns                         atomic.Int64
	ioCount                           atomic.Int64
	inCapsule                         atomic.Int64 // writes received in the capsule
	keyedIn                           atomic.Int64 // writes fetched by RDMA READ

	quit chan struct{}
	wg   sync.WaitGroup
}

type fakeCtrl struct {
	id   uint16
	cc   nvme.CC
	csts nvme.CSTS
}

type fakeAER struct {
	c   *fakeConn
	cid uint16
}

const fakeBlock = 512

func newFakeTarget(t testing.TB, subNQN string) *fakeTarget {
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeTarget{
		t: t, a: a, subNQN: subNQN, disc: subNQN == nvme.DiscoveryNQN,
		mqes: 127, mdts: 5, ioccsz: (64 + 8192) / 16, sgls: 0x00100005, oaes: 0x100,
		oncs: oncsDSM | oncsWriteZeroes, maxQueues: 8,
		ns:    map[uint32][]byte{1: make([]byte, 2048*fakeBlock)},
		ctrls: map[uint16]*fakeCtrl{}, nextID: 1, conns: map[*fakeConn]struct{}{},
		genctr: 1, quit: make(chan struct{}),
	}
	return f
}

func (f *fakeTarget) start() {
	ln, err := f.a.Listen("127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	f.ln, f.addr = ln, ln.Addr().String()
	f.wg.Add(1)
	go f.acceptLoop()
	f.t.Cleanup(f.stop)
}

func (f *fakeTarget) stop() {
	select {
	case <-f.quit:
		return
	default:
	}
	close(f.quit)
	f.ln.Close()
	f.dropAll()
	f.wg.Wait()
	f.a.Close()
}

// dropAll disconnects every queue (a target crash or network cut).
func (f *fakeTarget) dropAll() {
	f.mu.Lock()
	var cs []*fakeConn
	for c := range f.conns {
		cs = append(cs, c)
	}
	f.mu.Unlock()
	for _, c := range cs {
		c.qp.Disconnect()
	}
}

func (f *fakeTarget) record(s string) {
	f.mu.Lock()
	f.admin = append(f.admin, s)
	f.mu.Unlock()
}

func (f *fakeTarget) transcript() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.admin...)
}

func (f *fakeTarget) acceptLoop() {
	defer f.wg.Done()
	for {
		req, err := f.ln.GetConnectionRequest(context.Background())
		if err != nil {
			return
		}
		f.accept(req)
	}
}

// fakeConn is one queue.
type fakeConn struct {
	f       *fakeTarget
	qp      transport.QP
	rcq     transport.CQ
	icq     transport.CQ
	rnote   chan struct{}
	inote   chan struct{}
	qid     uint16
	depth   int
	ctrl    *fakeCtrl
	bufSize int
	recvMR  transport.MemoryRegion
	recvs   []fakeRecv
	scratch []byte
	scrMR   transport.MemoryRegion
	rsp     []byte
	rspMR   transport.MemoryRegion
	sge     [1]transport.SGE
	rspSGE  [1]transport.SGE
	comps   [16]transport.Completion
	icomp   [1]transport.Completion
	rspMu   sync.Mutex
	sqhd    uint16
}

type fakeRecv struct {
	off int
	sge [1]transport.SGE
}

func notifyChan(ctx any, _ error) {
	select {
	case ctx.(chan struct{}) <- struct{}{}:
	default:
	}
}

func (f *fakeTarget) accept(req transport.ConnRequest) {
	var cm nvme.RDMACMRequest
	priv := append([]byte(nil), req.PrivateData()...)
	f.mu.Lock()
	f.cmReqs = append(f.cmReqs, priv)
	f.mu.Unlock()
	reject := func(st nvme.RDMACMRejectStatus) {
		r := nvme.RDMACMReject{Status: st}
		var b [nvme.RDMACMRejectSize]byte
		r.Marshal(&b)
		req.Reject(b[:])
	}
	if err := cm.Unmarshal(priv); err != nil {
		reject(nvme.RDMACMInvalidLength)
		return
	}
	if f.refuseCM.Load() {
		reject(nvme.RDMACMNoResources)
		return
	}
	depth := int(cm.HSQSize) + 1
	if cm.QID == 0 && depth > 32 || cm.HRQSize < cm.HSQSize+1 {
		reject(nvme.RDMACMInvalidHSQSize)
		return
	}
	c := &fakeConn{f: f, qid: cm.QID, depth: depth, rnote: make(chan struct{}, 1), inote: make(chan struct{}, 1),
		bufSize: int(f.ioccsz) * 16}
	var err error
	fail := func() {
		f.t.Errorf("fake target: set up queue %d: %v", cm.QID, err)
		req.Reject(nil)
	}
	if c.rcq, err = f.a.CreateCQ(transport.CQConfig{Depth: uint32(depth) + 4, Notify: notifyChan, Context: c.rnote, Affinity: -1}); err != nil {
		fail()
		return
	}
	initDepth := uint32(2*depth + 8)
	if c.icq, err = f.a.CreateCQ(transport.CQConfig{Depth: initDepth + 4, Notify: notifyChan, Context: c.inote, Affinity: -1}); err != nil {
		fail()
		return
	}
	pd, _ := f.a.CreatePD()
	c.qp, err = pd.CreateQP(transport.QPConfig{ReceiveCQ: c.rcq, InitiatorCQ: c.icq, Context: c,
		ReceiveQueueDepth: uint32(depth), InitiatorQueueDepth: initDepth,
		MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1, InlineDataSize: 64})
	if err != nil {
		fail()
		return
	}
	mem := make([]byte, depth*c.bufSize)
	c.recvMR, _ = pd.RegisterMemory(mem, transport.AccessLocalWrite)
	c.recvs = make([]fakeRecv, depth)
	for i := range c.recvs {
		r := &c.recvs[i]
		r.off = i * c.bufSize
		r.sge[0] = c.recvMR.SGE(uint32(r.off), uint32(c.bufSize))
		c.qp.PostReceive(r, r.sge[:])
	}
	c.scratch = make([]byte, 4096<<f.mdts)
	c.scrMR, _ = pd.RegisterMemory(c.scratch, transport.AccessRemoteWrite) // RDMA READ sink (iWARP)
	c.rsp = make([]byte, 2*nvme.CQESize)
	c.rspMR, _ = pd.RegisterMemory(c.rsp, 0)
	acc := nvme.RDMACMAccept{CRQSize: uint16(depth)}
	var ab [nvme.RDMACMAcceptSize]byte
	acc.Marshal(&ab)
	if err := req.Accept(context.Background(), c.qp, transport.ConnParams{PrivateData: ab[:]}); err != nil {
		c.qp.Close()
		return
	}
	f.mu.Lock()
	f.conns[c] = struct{}{}
	f.mu.Unlock()
	f.wg.Add(1)
	go c.run(pd)
}

func (c *fakeConn) run(pd transport.PD) {
	defer c.f.wg.Done()
	defer func() {
		c.qp.Close()
		c.f.mu.Lock()
		delete(c.f.conns, c)
		c.f.mu.Unlock()
		c.rcq.Close()
		c.icq.Close()
	}()
	for {
		n := c.rcq.Poll(c.comps[:])
		if n == 0 {
			c.rcq.Arm(transport.NotifyAny)
			if n = c.rcq.Poll(c.comps[:]); n == 0 {
				select {
				case <-c.rnote:
					continue
				case <-c.qp.Done():
					return
				case <-c.f.quit:
					return
				}
			}
		}
		for i := 0; i < n; i++ {
			comp := &c.comps[i]
			if comp.Status != nil {
				return
			}
			r := comp.RequestContext.(*fakeRecv)
			msg := c.recvMR.Bytes()[r.off : r.off+int(comp.Bytes)]
			if err := c.handle(msg); err != nil {
				c.qp.Disconnect()
				return
			}
			if c.qp.PostReceive(r, r.sge[:]) != nil {
				return
			}
		}
	}
}

// waitInit waits for the completion of the one RDMA READ or WRITE in
// flight (responses are silent sends).
func (c *fakeConn) waitInit() error {
	comp := c.icomp[:]
	for {
		if c.icq.Poll(comp) == 1 {
			return comp[0].Status
		}
		c.icq.Arm(transport.NotifyAny)
		if c.icq.Poll(comp) == 1 {
			return comp[0].Status
		}
		select {
		case <-c.inote:
		case <-c.qp.Done():
			return transport.ErrCancelled
		case <-c.f.quit:
			return transport.ErrClosed
		}
	}
}

var errFakeStatus = errors.New("status")

// fetch brings n bytes of host data into scratch: from the capsule, or by
// RDMA READ of the keyed buffer.
func (c *fakeConn) fetch(cmd *nvme.Command, msg []byte, n int) (nvme.Status, error) {
	s := cmd.DPTR
	switch {
	case s.ID == nvme.SGLIDInCapsule:
		if s.Addr != 0 || int(s.Length) < n || len(msg) < nvme.SQESize+int(s.Length) {
			return nvme.StatusSGLInvalidDataLength.WithDNR(), errFakeStatus
		}
		copy(c.scratch, msg[nvme.SQESize:nvme.SQESize+n])
		if cmd.Opcode == uint8(nvme.IOWrite) {
			c.f.inCapsule.Add(1)
		}
	case s.Keyed():
		if int(s.Length) < n || n > len(c.scratch) {
			return nvme.StatusSGLInvalidDataLength.WithDNR(), errFakeStatus
		}
		c.sge[0] = c.scrMR.SGE(0, uint32(n))
		if err := c.qp.Read(nil, c.sge[:], s.Addr, s.Key, 0); err != nil {
			return 0, err
		}
		if err := c.waitInit(); err != nil {
			return 0, err
		}
		if cmd.Opcode == uint8(nvme.IOWrite) {
			c.f.keyedIn.Add(1)
		}
	default:
		return nvme.StatusSGLInvalidType.WithDNR(), errFakeStatus
	}
	return 0, nil
}

// push RDMA-WRITEs scratch[:n] to the command's keyed buffer.
func (c *fakeConn) push(cmd *nvme.Command, n int) (nvme.Status, error) {
	s := cmd.DPTR
	if !s.Keyed() || int(s.Length) != n {
		return nvme.StatusSGLInvalidDataLength.WithDNR(), errFakeStatus
	}
	c.sge[0] = c.scrMR.SGE(0, uint32(n))
	if err := c.qp.Write(nil, c.sge[:], s.Addr, s.Key, 0); err != nil {
		return 0, err
	}
	return 0, c.waitInit()
}

// respond sends a response capsule (from rsp slot i: 0 for the serving
// goroutine, 1 for asynchronous events).
func (c *fakeConn) respond(i int, cmd *nvme.Command, dw0, dw1 uint32, st nvme.Status) error {
	c.rspMu.Lock()
	defer c.rspMu.Unlock()
	cqe := nvme.Completion{DW0: dw0, DW1: dw1, SQHead: c.sqhd, SQID: c.qid, CID: cmd.CID, Status: st}
	c.sqhd = uint16((int(c.sqhd) + 1) % c.depth)
	cqe.Marshal((*[nvme.CQESize]byte)(c.rsp[i*nvme.CQESize:]))
	c.rspSGE[0] = c.rspMR.SGE(uint32(i*nvme.CQESize), nvme.CQESize)
	flags := transport.FlagInline | transport.FlagSilentSuccess
	if cmd.DPTR.ID == nvme.SGLIDKeyedInvalidate || (c.qid != 0 && c.f.invalidate.Load() && cmd.DPTR.Keyed() && cmd.DPTR.Key != 0) {
		return c.qp.SendInvalidate(nil, c.rspSGE[:], cmd.DPTR.Key, flags)
	}
	return c.qp.Send(nil, c.rspSGE[:], flags)
}

func (c *fakeConn) handle(msg []byte) error {
	f := c.f
	var cmd nvme.Command
	if err := cmd.Unmarshal(msg); err != nil {
		return err
	}
	if f.mute.Load() {
		return nil
	}
	if cmd.IsFabrics() && cmd.FCType() == nvme.FabricsConnect {
		drop := &f.dropIOConnects
		if c.qid == 0 {
			drop = &f.dropAdminConnects
		}
		if drop.Add(-1) >= 0 {
			f.record("dropped Connect")
			return nil
		}
		drop.Store(0)
		return c.connect(&cmd, msg)
	}
	if c.ctrl == nil {
		return c.respond(0, &cmd, 0, 0, nvme.StatusCommandSequenceError.WithDNR())
	}
	if c.qid == 0 {
		return c.adminCmd(&cmd, msg)
	}
	return c.ioCmd(&cmd, msg)
}

func (c *fakeConn) connect(cmd *nvme.Command, msg []byte) error {
	f := c.f
	var cc nvme.ConnectCommand
	cc.Decode(cmd)
	if st, err := c.fetch(cmd, msg, nvme.ConnectDataSize); err != nil {
		if err == errFakeStatus {
			return c.respond(0, cmd, 0, 0, st)
		}
		return err
	}
	var d nvme.ConnectData
	d.Unmarshal(c.scratch)
	f.mu.Lock()
	f.sqes = append(f.sqes, append([]byte(nil), msg[:nvme.SQESize]...))
	f.connData = append(f.connData, append([]byte(nil), c.scratch[:nvme.ConnectDataSize]...))
	if cc.QID == 0 {
		f.admin = append(f.admin, "Connect")
	} else {
		f.admin = append(f.admin, fmt.Sprintf("Connect qid %d", cc.QID))
	}
	f.mu.Unlock()
	if f.refuseDNR.Load() {
		return c.respond(0, cmd, 0, 0, nvme.StatusConnectInvalidHost.WithDNR())
	}
	if !d.SubNQN.Equal(f.subNQN) || d.Validate() != nil || int(cc.SQSize)+1 != c.depth {
		return c.respond(0, cmd, nvme.ConnectInvalidParamDW0(256, true), 0, nvme.StatusConnectInvalidParameters.WithDNR())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if cc.QID == 0 {
		if d.CNTLID != nvme.CNTLIDDynamic {
			return c.respond(0, cmd, nvme.ConnectInvalidParamDW0(16, true), 0, nvme.StatusConnectInvalidParameters.WithDNR())
		}
		ctrl := &fakeCtrl{id: f.nextID}
		f.nextID++
		f.ctrls[ctrl.id] = ctrl
		c.ctrl = ctrl
		return c.respond(0, cmd, nvme.ConnectResponseDW0(ctrl.id, 0), 0, 0)
	}
	ctrl := f.ctrls[d.CNTLID]
	if ctrl == nil || int(cc.QID) > f.maxQueues {
		return c.respond(0, cmd, nvme.ConnectInvalidParamDW0(16, true), 0, nvme.StatusConnectInvalidParameters.WithDNR())
	}
	c.ctrl = ctrl
	return c.respond(0, cmd, 0, 0, 0)
}

func (f *fakeTarget) capValue() nvme.CAP {
	return nvme.MakeCAP(nvme.CAPFields{MQES: f.mqes, TO: 4, CSS: nvme.CAPCSSNVM})
}

func (c *fakeConn) adminCmd(cmd *nvme.Command, msg []byte) error {
	f := c.f
	ctrl := c.ctrl
	if cmd.IsFabrics() {
		var p nvme.PropertyCommand
		if err := p.Decode(cmd); err != nil {
			return c.respond(0, cmd, 0, 0, nvme.StatusInvalidOpcode.WithDNR())
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if p.Set {
			f.admin = append(f.admin, fmt.Sprintf("PropSet %#x=%#x", p.Offset, p.Value))
			if p.Offset != nvme.PropCC {
				return c.respond(0, cmd, 0, 0, nvme.StatusInvalidField.WithDNR())
			}
			old, cc := ctrl.cc, nvme.CC(p.Value)
			ctrl.cc = cc
			switch {
			case !cc.EN():
				ctrl.csts = 0
			case !old.EN():
				ctrl.csts = nvme.CSTSReady
			}
			if cc.SHN() == nvme.ShutdownNormal {
				ctrl.csts = ctrl.csts.WithSHST(nvme.ShutdownStatusComplete)
				f.shutdowns.Add(1)
			}
			return c.respond(0, cmd, 0, 0, 0)
		}
		f.admin = append(f.admin, fmt.Sprintf("PropGet %#x", p.Offset))
		var v uint64
		switch p.Offset {
		case nvme.PropCAP:
			v = uint64(f.capValue())
		case nvme.PropVS:
			v = uint64(nvme.MakeVersion(1, 4, 0))
		case nvme.PropCC:
			v = uint64(ctrl.cc)
		case nvme.PropCSTS:
			v = uint64(ctrl.csts)
		default:
			return c.respond(0, cmd, 0, 0, nvme.StatusInvalidField.WithDNR())
		}
		return c.respond(0, cmd, uint32(v), uint32(v>>32), 0)
	}
	op := nvme.AdminOpcode(cmd.Opcode)
	if op == nvme.AdminKeepAlive {
		f.kaCount.Add(1)
		if f.muteKA.Load() {
			return nil
		}
		return c.respond(0, cmd, 0, 0, 0)
	}
	f.mu.Lock()
	ready := ctrl.csts.RDY()
	f.admin = append(f.admin, fmt.Sprintf("%v %#x", op, cmd.CDW10&0xFF))
	f.mu.Unlock()
	if !ready {
		return c.respond(0, cmd, 0, 0, nvme.StatusCommandSequenceError.WithDNR())
	}
	switch op {
	case nvme.AdminIdentify:
		n, st := f.identify(cmd, c.scratch[:identifySize], ctrl.id)
		if st != 0 {
			return c.respond(0, cmd, 0, 0, st)
		}
		if st, err := c.push(cmd, n); err != nil {
			if err == errFakeStatus {
				return c.respond(0, cmd, 0, 0, st)
			}
			return err
		}
		return c.respond(0, cmd, 0, 0, 0)
	case nvme.AdminSetFeatures:
		switch uint8(cmd.CDW10) {
		case nvme.FeatureNumQueues:
			n := min(int(uint16(cmd.CDW11))+1, f.maxQueues)
			return c.respond(0, cmd, uint32(n-1)|uint32(n-1)<<16, 0, 0)
		case nvme.FeatureAsyncEventConfig:
			return c.respond(0, cmd, 0, 0, 0)
		}
		return c.respond(0, cmd, 0, 0, nvme.StatusInvalidField.WithDNR())
	case nvme.AdminAsyncEvent:
		f.mu.Lock()
		f.aers = append(f.aers, fakeAER{c: c, cid: cmd.CID})
		f.mu.Unlock()
		return nil
	case nvme.AdminGetLogPage:
		n := int(cmd.CDW10>>16|(cmd.CDW11&0xFFFF)<<16)*4 + 4
		off := uint64(cmd.CDW12) | uint64(cmd.CDW13)<<32
		page := f.logPage(uint8(cmd.CDW10))
		if page == nil || n > len(c.scratch) {
			return c.respond(0, cmd, 0, 0, nvme.StatusInvalidField.WithDNR())
		}
		clear(c.scratch[:n])
		if off < uint64(len(page)) {
			copy(c.scratch[:n], page[off:])
		}
		if st, err := c.push(cmd, n); err != nil {
			if err == errFakeStatus {
				return c.respond(0, cmd, 0, 0, st)
			}
			return err
		}
		return c.respond(0, cmd, 0, 0, 0)
	}
	return c.respond(0, cmd, 0, 0, nvme.StatusInvalidOpcode.WithDNR())
}

// identify fills b for the command and returns the length to send.
func (f *fakeTarget) identify(cmd *nvme.Command, b []byte, cntlid uint16) (int, nvme.Status) {
	clear(b)
	le := binary.LittleEndian
	f.mu.Lock()
	defer f.mu.Unlock()
	switch uint8(cmd.CDW10) {
	case nvme.CNSController:
		copy(b[idCtrlSN:], "FAKE0001            ")
		copy(b[idCtrlMN:], "blk fake target")
		copy(b[idCtrlFR:], "1.0     ")
		b[idCtrlMDTS] = f.mdts
		if !f.disc {
			le.PutUint16(b[idCtrlCNTLID:], cntlid)
		}
		le.PutUint32(b[idCtrlVER:], uint32(nvme.MakeVersion(1, 4, 0)))
		le.PutUint32(b[idCtrlOAES:], f.oaes)
		b[idCtrlCNTRLTYPE] = cntrlTypeIO
		if f.disc {
			b[idCtrlCNTRLTYPE] = cntrlTypeDisc
		}
		le.PutUint16(b[idCtrlKAS:], 10)
		b[512], b[513] = 0x66, 0x44
		le.PutUint16(b[idCtrlMAXCMD:], f.maxcmd)
		le.PutUint32(b[idCtrlNN:], 1024)
		le.PutUint16(b[idCtrlONCS:], f.oncs)
		b[idCtrlVWC] = vwcPresent
		le.PutUint32(b[idCtrlSGLS:], f.sgls)
		copy(b[idCtrlSUBNQN:], f.subNQN)
		le.PutUint32(b[idCtrlIOCCSZ:], f.ioccsz)
		le.PutUint32(b[idCtrlIORCSZ:], 1)
		b[1803] = 1 // MSDBD
		return identifySize, 0
	case nvme.CNSActiveNSList:
		off := 0
		for id := cmd.NSID + 1; id < 64 && off < identifySize; id++ {
			if f.ns[id] != nil {
				le.PutUint32(b[off:], id)
				off += 4
			}
		}
		return identifySize, 0
	case nvme.CNSNSDescriptorList:
		if f.ns[cmd.NSID] == nil {
			return 0, nvme.StatusInvalidNamespace.WithDNR()
		}
		b[0], b[1] = nidtNGUID, 16
		le.PutUint32(b[4:], cmd.NSID)
		return identifySize, 0
	case nvme.CNSNamespace:
		disk := f.ns[cmd.NSID]
		if disk != nil {
			le.PutUint64(b[idNsNSZE:], uint64(len(disk)/fakeBlock))
			le.PutUint64(b[idNsNCAP:], uint64(len(disk)/fakeBlock))
			le.PutUint32(b[idNsLBAF:], 9<<16)
		}
		return identifySize, 0
	}
	return 0, nvme.StatusInvalidField.WithDNR()
}

// logPage returns the whole log page (f.mu not held).
func (f *fakeTarget) logPage(lid uint8) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch lid {
	case nvme.LogDiscovery:
		if f.logReads++; f.logReads == f.bumpGen {
			f.genctr++
		}
		page := make([]byte, nvme.DiscoveryLogHeaderSize+len(f.entries)*nvme.DiscoveryLogEntrySize)
		h := nvme.DiscoveryLogHeader{GenCtr: f.genctr, NumRec: uint64(len(f.entries))}
		h.Marshal((*[nvme.DiscoveryLogHeaderSize]byte)(page))
		for i := range f.entries {
			f.entries[i].Marshal((*[nvme.DiscoveryLogEntrySize]byte)(page[nvme.DiscoveryLogHeaderSize+i*nvme.DiscoveryLogEntrySize:]))
		}
		return page
	case nvme.LogChangedNSList:
		return make([]byte, 4096)
	}
	return nil
}

func (c *fakeConn) ioCmd(cmd *nvme.Command, msg []byte) error {
	f := c.f
	f.ioCount.Add(1)
	if f.holdIO.Load() {
		return nil
	}
	f.mu.Lock()
	disk := f.ns[cmd.NSID]
	f.mu.Unlock()
	if disk == nil {
		return c.respond(0, cmd, 0, 0, nvme.StatusInvalidNamespace.WithDNR())
	}
	slba := uint64(cmd.CDW10) | uint64(cmd.CDW11)<<32
	nlb := uint64(cmd.CDW12&0xFFFF) + 1
	blocks := uint64(len(disk) / fakeBlock)
	inRange := slba < blocks && nlb <= blocks-slba
	var st nvme.Status
	var err error
	switch nvme.IOOpcode(cmd.Opcode) {
	case nvme.IORead:
		if !inRange {
			return c.respond(0, cmd, 0, 0, nvme.StatusLBAOutOfRange.WithDNR())
		}
		n := int(nlb) * fakeBlock
		f.mu.Lock()
		copy(c.scratch, disk[slba*fakeBlock:slba*fakeBlock+uint64(n)])
		f.mu.Unlock()
		st, err = c.push(cmd, n)
	case nvme.IOWrite:
		n := int(nlb) * fakeBlock
		if st, err = c.fetch(cmd, msg, n); err == nil {
			if !inRange {
				return c.respond(0, cmd, 0, 0, nvme.StatusLBAOutOfRange.WithDNR())
			}
			f.mu.Lock()
			copy(disk[slba*fakeBlock:], c.scratch[:n])
			f.mu.Unlock()
		}
	case nvme.IOFlush:
	case nvme.IOWriteZeroes:
		if !inRange {
			return c.respond(0, cmd, 0, 0, nvme.StatusLBAOutOfRange.WithDNR())
		}
		f.mu.Lock()
		clear(disk[slba*fakeBlock : (slba+nlb)*fakeBlock])
		f.mu.Unlock()
	case nvme.IODatasetManagement:
		nr := int(cmd.CDW10&0xFF) + 1
		if st, err = c.fetch(cmd, msg, nr*dsmRangeSize); err == nil {
			f.mu.Lock()
			for i := 0; i < nr; i++ {
				r := c.scratch[i*dsmRangeSize:]
				cnt := uint64(binary.LittleEndian.Uint32(r[4:]))
				lba := binary.LittleEndian.Uint64(r[8:])
				if lba < blocks && cnt <= blocks-lba {
					clear(disk[lba*fakeBlock : (lba+cnt)*fakeBlock])
				}
			}
			f.mu.Unlock()
		}
	default:
		return c.respond(0, cmd, 0, 0, nvme.StatusInvalidOpcode.WithDNR())
	}
	if err == errFakeStatus {
		return c.respond(0, cmd, 0, 0, st)
	}
	if err != nil {
		return err
	}
	return c.respond(0, cmd, 0, 0, 0)
}

// addNamespace adds a namespace and completes the pending AERs with a
// namespace attribute notice (type 2, info 0, log 0x04).
func (f *fakeTarget) addNamespace(nsid uint32, blocks int) {
	f.mu.Lock()
	f.ns[nsid] = make([]byte, blocks*fakeBlock)
	aers := f.aers
	f.aers = nil
	f.mu.Unlock()
	for _, e := range aers {
		cmd := nvme.Command{CID: e.cid}
		e.c.respond(1, &cmd, 2|uint32(nvme.LogChangedNSList)<<16, 0, 0)
	}
}

func (f *fakeTarget) disk(nsid uint32) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]byte(nil), f.ns[nsid]...)
}

// testConfig is a host configuration for tests: a fresh soft adapter,
// short timeouts.
func testConfig(t testing.TB) Config {
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return Config{
		Adapter:           a,
		HostNQN:           "nqn.2014-08.org.nvmexpress:uuid:7a1c4bd2-0f3e-4a45-9c1e-3f1b2a6d8e90",
		Queues:            2,
		QueueDepth:        16,
		MaxTransfer:       64 << 10,
		KATO:              10 * time.Second,
		CtrlLossTimeout:   30 * time.Second,
		ReconnectDelay:    20 * time.Millisecond,
		MaxReconnectDelay: 200 * time.Millisecond,
		ConnectTimeout:    5 * time.Second,
		AdminTimeout:      5 * time.Second,
		IOTimeout:         5 * time.Second,
		Logf:              t.Logf,
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

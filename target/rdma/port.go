package rdma

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/internal/connset"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/transport"
)

// Port serves the target on one listening address of one adapter: the
// NVMe-oF RDMA transport binding. It owns a transport engine (one CQ, SRQ
// and receive-buffer pool per core), per-core data buffer pools and
// preallocated requests, and one conn per accepted QP.
type Port struct {
	t      *target.Target
	a      transport.Adapter
	pd     transport.PD
	cfg    Config
	size   Sizing
	engine *transport.Engine
	cores  []*coreState
	ln     transport.Listener
	id     uint16
	host   string
	svc    string
	// advHost and advSvc are what the port advertises (Config.AdvertiseAddr;
	// the listen address's own where not set).
	advHost, advSvc string

	conns connset.Set[*conn] // each with its watcher
	wg    sync.WaitGroup     // the accept loop and the connection requests being set up

	st counters
}

// Limits returns the limits of a port of cfg on an adapter reporting
// info: what the port passes to the target with every queue
// (target.QueueParams.Limits) and registers for discovery (Port.Limits).
// A target needs none of its own (target.Config.Limits) to serve the
// port; one that has them uses them only for queues that bring none.
func Limits(info transport.AdapterInfo, cfg Config) (target.Limits, error) {
	s, err := Size(info, cfg)
	if err != nil {
		return target.Limits{}, err
	}
	return s.Limits, nil
}

// Listen starts serving t on adapter a at cfg.Addr and registers the port
// with the target for discovery. Every queue of the port brings the
// port's Limits (QueueParams.Limits), so controllers that came in through
// it report and enforce them whatever the target's Config.Limits.
func Listen(t *target.Target, a transport.Adapter, cfg Config) (p *Port, err error) {
	cfg = cfg.withDefaults()
	if err := target.CheckListenAddr(cfg.Addr); err != nil {
		return nil, fmt.Errorf("rdma: %w", err)
	}
	var advHost, advSvc string
	if cfg.AdvertiseAddr != "" {
		if advHost, advSvc, err = target.ParseAdvertiseAddr(cfg.AdvertiseAddr); err != nil {
			return nil, fmt.Errorf("rdma: %w", err)
		}
	}
	size, err := Size(a.Info(), cfg)
	if err != nil {
		return nil, err
	}
	p = &Port{t: t, a: a, cfg: cfg, size: size, id: cfg.PortID}
	// p is passed in: the error returns below set the named result to nil.
	defer func(p *Port) {
		if err != nil {
			p.release()
		}
	}(p)
	if p.pd, err = a.CreatePD(); err != nil {
		return nil, fmt.Errorf("rdma: create PD: %w", err)
	}
	if p.engine, err = transport.NewEngine(a, p.pd, size.Engine, (*handler)(p)); err != nil {
		return nil, fmt.Errorf("rdma: engine: %w", err)
	}
	for _, c := range p.engine.Cores() {
		cs, err := newCoreState(p, c)
		if err != nil {
			return nil, fmt.Errorf("rdma: core %d: %w", c.Index(), err)
		}
		p.cores = append(p.cores, cs)
	}
	if p.ln, err = a.Listen(cfg.Addr); err != nil {
		return nil, fmt.Errorf("rdma: listen on %s: %w", cfg.Addr, err)
	}
	p.host, p.svc = target.SplitHostPort(p.ln.Addr().String())
	p.advHost, p.advSvc = cmp.Or(advHost, p.host), cmp.Or(advSvc, p.svc)
	if err = t.AddPort(target.Port{
		ID:             p.id,
		TrType:         nvme.TrTypeRDMA,
		AdrFam:         target.AdrFam(p.advHost),
		TrAddr:         p.host,
		TrSvcID:        p.svc,
		AdvertiseAddr:  advHost,
		AdvertiseSvcID: advSvc,
		Limits:         &p.size.Limits,
	}); err != nil {
		return nil, fmt.Errorf("rdma: register port: %w", err)
	}
	p.wg.Add(1)
	if size.ReadSink == ReadSinkShared {
		p.logf("rdma: port %s: this iWARP adapter cannot fast-register: the data buffers are remotely writable and every RDMA READ request shows a host their key, so a host could write into other hosts' data in flight; use the soft provider or an adapter with fast registration where hosts are not trusted", p.ln.Addr())
	}
	go p.acceptLoop()
	return p, nil
}

// Addr is the address the port listens on.
func (p *Port) Addr() net.Addr { return p.ln.Addr() }

// AdvertisedAddr is the address hosts connect to, host:port: the
// advertised address (Config.AdvertiseAddr, with the listen port if it
// gave none), else the listen address. It is "" for a port listening on a
// wildcard address without an advertised one: there is no single answer
// (its discovery log reports the address each connection arrived on).
func (p *Port) AdvertisedAddr() string {
	if ip := net.ParseIP(p.advHost); p.advHost == "" || ip != nil && ip.IsUnspecified() {
		return ""
	}
	return net.JoinHostPort(p.advHost, p.advSvc)
}

// Engine is the port's transport engine (for its statistics).
func (p *Port) Engine() *transport.Engine { return p.engine }

// Sizing is the sizes the port runs with.
func (p *Port) Sizing() Sizing { return p.size }

// Close stops accepting, disconnects every connection (their controllers
// are torn down by the core) and frees the engine and buffers.
func (p *Port) Close() error {
	conns, first := p.conns.Close()
	if !first {
		return nil
	}
	p.t.RemovePort(p.id)
	err := p.ln.Close()
	for _, c := range conns {
		c.Disconnect(errPortClosed)
	}
	p.wg.Wait()
	p.conns.Wait()
	return errors.Join(err, p.release())
}

var errPortClosed = errors.New("rdma: port closed")

func (p *Port) release() error {
	var errs []error
	if p.ln != nil && !p.conns.Closed() {
		errs = append(errs, p.ln.Close())
	}
	if p.engine != nil {
		errs = append(errs, p.engine.Close())
	}
	for _, cs := range p.cores {
		errs = append(errs, cs.close())
	}
	if p.pd != nil {
		errs = append(errs, p.pd.Close())
	}
	return errors.Join(errs...)
}

// logf writes a log line to Config.Logf, or if there is none to
// Config.Logger as a warning. Events go through events.go instead.
func (p *Port) logf(format string, args ...any) {
	if p.cfg.Logf != nil {
		p.cfg.Logf(format, args...)
	} else if p.logOn(slog.LevelWarn) {
		p.cfg.Logger.Warn(fmt.Sprintf(format, args...))
	}
}

func (p *Port) acceptLoop() {
	defer p.wg.Done()
	for {
		req, err := p.ln.GetConnectionRequest(context.Background())
		if err != nil {
			if !errors.Is(err, transport.ErrClosed) {
				p.logf("rdma: port %s: accept: %v", p.ln.Addr(), err)
			}
			return
		}
		// Setup runs beside the loop: one slow host must not hold up
		// the others.
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.setup(req)
		}()
	}
}

// reject answers a connection request with the NVMe/RDMA reject private
// data carrying sts.
func (p *Port) reject(req transport.ConnRequest, sts nvme.RDMACMRejectStatus, why string) {
	p.st.rejects.Add(1)
	p.logRejected(req, sts, why)
	var b [nvme.RDMACMRejectSize]byte
	r := nvme.RDMACMReject{RecFmt: 0, Status: sts}
	r.Marshal(&b)
	req.Reject(b[:])
}

// setup checks the CM private data, creates the QP on a core, accepts,
// and gives the core a new queue.
func (p *Port) setup(req transport.ConnRequest) {
	var cm nvme.RDMACMRequest
	if err := cm.Unmarshal(req.PrivateData()); err != nil {
		p.reject(req, nvme.RDMACMInvalidLength, err.Error())
		return
	}
	if cm.RecFmt != 0 {
		p.reject(req, nvme.RDMACMInvalidRecFmt, fmt.Sprintf("RECFMT %d", cm.RecFmt))
		return
	}
	admin := cm.QID == 0
	entries := uint32(cm.HSQSize) + 1
	limit := p.size.Limits.MaxQueueEntries
	if admin {
		limit = AdminQueueEntries
	}
	if entries < 2 || entries > limit {
		p.reject(req, nvme.RDMACMInvalidHSQSize, fmt.Sprintf("HSQSIZE %d: queue of %d entries outside [2, %d]", cm.HSQSize, entries, limit))
		return
	}
	// The host must be able to take a response for every command.
	if uint32(cm.HRQSize) < entries {
		p.reject(req, nvme.RDMACMInvalidHRQSize, fmt.Sprintf("HRQSIZE %d < queue entries %d", cm.HRQSize, entries))
		return
	}
	ird, _ := req.ReadLimits()
	if ird == 0 {
		// The host serves no RDMA reads: writes could never be fetched.
		p.reject(req, nvme.RDMACMInvalidIRD, "host IRD 0")
		return
	}
	c := &conn{port: p, admin: admin, qid: cm.QID, entries: entries, remote: addrString(req.RemoteAddr()),
		firstRun: target.NewFirstRun(entries)}
	var err error
	if admin {
		c.qp, c.core, err = p.createAdminQP(c)
	} else {
		var core *transport.Core
		c.qp, core, err = p.engine.CreateQP(c, p.size.SendSlots*entries, nvme.CQESize)
		if err == nil {
			c.core = p.cores[core.Index()]
		}
	}
	if err != nil {
		p.reject(req, nvme.RDMACMNoResources, err.Error())
		return
	}
	host, svc := target.SplitHostPort(req.LocalAddr().String())
	q, err := p.t.NewQueue(c, target.QueueParams{
		QID:        cm.QID,
		SQSize:     cm.HSQSize,
		Transport:  nvme.TrTypeRDMA,
		LocalAddr:  host,
		LocalPort:  svc,
		RemoteAddr: c.remote,
		// The core copies them: every controller of this port reports
		// and enforces what the port's buffers were sized for.
		Limits:     &p.size.Limits,
		Coalescing: p.coalesce,
	})
	if err != nil {
		c.destroy()
		p.reject(req, nvme.RDMACMNoResources, err.Error())
		return
	}
	c.q = q
	var ab [nvme.RDMACMAcceptSize]byte
	acc := nvme.RDMACMAccept{RecFmt: 0, CRQSize: uint16(entries)}
	acc.Marshal(&ab)
	if !p.conns.Add(c) {
		q.Close()
		c.destroy()
		req.Reject(nil)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), transport.DefaultConnectTimeout)
	err = req.Accept(ctx, c.qp, transport.ConnParams{
		InboundReadLimit:  p.size.IRD,
		OutboundReadLimit: p.size.ORD,
		PrivateData:       ab[:],
	})
	cancel()
	if err != nil {
		p.logf("rdma: port %s: accept %s: %v", p.ln.Addr(), req.RemoteAddr(), err)
		c.teardown()
		p.conns.Remove(c)
		return
	}
	p.st.accepts.Add(1)
	p.logAccepted(c)
	c.watch()
}

// coalesce maps NVMe Interrupt Coalescing (Set Features 0x08) onto the
// transport's interrupt moderation: TIME (100 µs units) is the moderation
// interval and THR+1 the completion count. The CQs are shared by every
// queue of a core, so the setting applies to the whole port, as it does
// to a PCIe controller's interrupt vectors. TIME 0 (no aggregation time)
// hands control back to the adaptive controller, the port's default.
func (p *Port) coalesce(threshold, time100us uint8) error {
	if time100us == 0 {
		p.engine.SetAdaptiveModeration()
		return nil
	}
	p.engine.SetFixedModeration(uint32(time100us)*100, uint32(threshold)+1)
	return nil
}

// Stats are the port's counters.
type Stats struct {
	Accepts, Rejects uint64
	Commands         uint64 // capsules received
	ProtocolErrors   uint64 // malformed capsules (connection dropped)
	InCapsuleWrites  uint64 // host data taken from the capsule (no READ)
	// CapsuleCopies are in-capsule writes copied into an aligned data
	// buffer for the disk engine (of InCapsuleWrites; see alignData).
	CapsuleCopies         uint64
	RDMAReads, RDMAWrites uint64
	DataWaits             uint64 // commands that waited for a data buffer
	// GroupedWrites were committed together in GroupCommits backend
	// commits (target.Group, one per core).
	GroupedWrites, GroupCommits uint64
	// DiskInFlight is the I/Os the cores have at the disk through their
	// backends' engines (target.Poller) as of each core's last pass;
	// DiskInFlightPeak the most one core had at once (both 0 when no
	// backend serves this port's cores asynchronously).
	DiskInFlight, DiskInFlightPeak uint64
	Engine                         transport.Stats
}

type counters struct {
	accepts, rejects atomic.Uint64
}

// Stats returns the port's counters (per-core counters summed).
func (p *Port) Stats() Stats {
	s := Stats{
		Accepts: p.st.accepts.Load(),
		Rejects: p.st.rejects.Load(),
		Engine:  p.engine.Stats(),
	}
	for _, cs := range p.cores {
		s.Commands += cs.st.commands.Load()
		s.ProtocolErrors += cs.st.protocolErrors.Load()
		s.InCapsuleWrites += cs.st.inCapsule.Load()
		s.CapsuleCopies += cs.st.capsuleCopies.Load()
		s.RDMAReads += cs.st.reads.Load()
		s.RDMAWrites += cs.st.writes.Load()
		s.DataWaits += cs.st.waits.Load()
		gs := cs.group.Stats()
		s.GroupedWrites += gs.Writes
		s.GroupCommits += gs.Commits
		s.DiskInFlight += cs.st.diskNow.Load()
		s.DiskInFlightPeak = max(s.DiskInFlightPeak, cs.st.diskPeak.Load())
	}
	return s
}

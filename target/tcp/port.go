//go:build linux

package tcp

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/internal/connset"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// Port serves the target on one listening TCP address: the NVMe/TCP
// transport binding. It owns one poll group per core (sockets, requests,
// data buffers) and an accept goroutine that hands each connection to the
// group with the fewest.
type Port struct {
	t      *target.Target
	cfg    Config
	limits target.Limits
	ln     *net.TCPListener
	groups []*group
	id     uint16
	host   string
	svc    string
	// advHost and advSvc are what the port advertises.
	advHost, advSvc string
	// maxCapsuleData is the most in-capsule data any capsule may carry
	// (the admin size or the I/O queues', whichever is larger): more is
	// a framing error (FES 0x05); less, but more than the command's
	// queue takes, is the command's error (SGL Offset Invalid).
	maxCapsuleData uint32

	conns   connset.Set[*conn]
	closing atomic.Bool
	wg      sync.WaitGroup // the accept loop

	accepts atomic.Uint64
	// pending counts connections accepted and not yet connected
	// (conn.pending), and pendingBy them by source address, both changed
	// under pmu (pending.go); rejected counts those closed at accept for
	// MaxPending or MaxPendingPerSource, rejectedSource those of them
	// for MaxPendingPerSource, evicted those closed to make room for a
	// source with fewer.
	pmu            sync.Mutex
	pending        atomic.Int32
	pendingBy      map[string]*pendingSource
	rejected       atomic.Uint64
	rejectedSource atomic.Uint64
	evicted        atomic.Uint64
	// digestConns counts connections that negotiated a digest.
	digestConns atomic.Uint64
}

// Listen starts serving t at cfg.Addr and registers the port with the
// target for discovery. t must have been created with Limits(cfg) (or
// smaller limits).
func Listen(t *target.Target, cfg Config) (p *Port, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	lim, err := Limits(cfg)
	if err != nil {
		return nil, err
	}
	var advHost, advSvc string
	if cfg.AdvertiseAddr != "" {
		if advHost, advSvc, err = target.ParseAdvertiseAddr(cfg.AdvertiseAddr); err != nil {
			return nil, fmt.Errorf("tcp: %w", err)
		}
	}
	p = &Port{t: t, cfg: cfg, limits: lim, id: cfg.PortID, pendingBy: make(map[string]*pendingSource),
		maxCapsuleData: max(nvme.TCPAdminInCapsule, lim.InCapsule)}
	for i := 0; i < cfg.Cores; i++ {
		g, err := newGroup(p, i)
		if err != nil {
			p.stopGroups()
			return nil, fmt.Errorf("tcp: poll group %d: %w", i, err)
		}
		p.groups = append(p.groups, g)
		started := make(chan struct{})
		go g.run(started)
		<-started
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		p.stopGroups()
		return nil, fmt.Errorf("tcp: listen on %s: %w", cfg.Addr, err)
	}
	p.ln = ln.(*net.TCPListener)
	p.host, p.svc = target.SplitHostPort(p.ln.Addr().String())
	p.advHost, p.advSvc = cmp.Or(advHost, p.host), cmp.Or(advSvc, p.svc)
	if err = t.AddPort(target.Port{
		ID:             p.id,
		TrType:         nvme.TrTypeTCP,
		AdrFam:         target.AdrFam(p.advHost),
		TrAddr:         p.host,
		TrSvcID:        p.svc,
		AdvertiseAddr:  advHost,
		AdvertiseSvcID: advSvc,
		// SQ flow control may be disabled (Connect CATTR bit 2).
		TReq:          nvme.TReqDisableSQFlow,
		Limits:        &p.limits,
		DiscoveryOnly: cfg.DiscoveryOnly,
	}); err != nil {
		p.ln.Close()
		p.stopGroups()
		return nil, fmt.Errorf("tcp: register port: %w", err)
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// queueParams is what the core learns of a queue when its first capsule
// arrives: the one place QueueParams is filled.
func (p *Port) queueParams(c *conn, qid, sqsize uint16) target.QueueParams {
	host, svc := target.SplitHostPort(c.local)
	return target.QueueParams{
		QID:        qid,
		SQSize:     sqsize,
		Transport:  nvme.TrTypeTCP,
		LocalAddr:  host,
		LocalPort:  svc,
		RemoteAddr: c.remote,
		Limits:     &p.limits,
	}
}

// Addr is the address the port listens on.
func (p *Port) Addr() net.Addr { return p.ln.Addr() }

// AdvertisedAddr is the address hosts connect to, host:port ("" for a
// wildcard listen address without an advertised one).
func (p *Port) AdvertisedAddr() string {
	if ip := net.ParseIP(p.advHost); p.advHost == "" || ip != nil && ip.IsUnspecified() {
		return ""
	}
	return net.JoinHostPort(p.advHost, p.advSvc)
}

// Limits is what the port can do: it brings them with every queue it
// creates and to discovery (target.QueueParams.Limits, target.Port.Limits).
func (p *Port) Limits() target.Limits { return p.limits }

func (p *Port) isClosing() bool { return p.closing.Load() }

// Close stops accepting, disconnects every connection (writing what each
// has queued; their controllers are torn down by the core), waits until
// every connection is gone and the core gave back its requests, then
// stops the poll groups.
func (p *Port) Close() error {
	p.closing.Store(true)
	conns, first := p.conns.Close()
	if !first {
		return nil
	}
	_ = p.t.RemovePort(p.id)
	err := p.ln.Close()
	for _, c := range conns {
		c.Disconnect(errPortClosed)
	}
	p.wg.Wait()
	p.conns.Wait()
	p.stopGroups()
	return err
}

func (p *Port) stopGroups() {
	for _, g := range p.groups {
		g.stop.Store(true)
		g.kick()
	}
	for _, g := range p.groups {
		<-g.exitedCh
	}
}

func (p *Port) acceptLoop() {
	defer p.wg.Done()
	var backoff time.Duration
	for {
		nc, err := p.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or memory: try again a little later
			// rather than spin (5 ms, doubling to 1 s).
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.logPortError("accept", "", err)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		src := sourceOf(nc.RemoteAddr())
		victim, why := p.admitPending(src)
		if why != "" {
			p.logRejected(nc.RemoteAddr().String(), src, why)
			_ = nc.SetLinger(0)
			nc.Close()
			continue
		}
		if victim != nil {
			victim.logEvicted(src)
			victim.Disconnect(errEvicted)
		}
		_ = nc.SetNoDelay(true)
		c, err := newConn(p, nc)
		if err != nil {
			p.unreserve(src)
			p.logPortError("accept", nc.RemoteAddr().String(), err)
			nc.Close()
			continue
		}
		if !p.conns.Add(c) {
			p.unreserve(src)
			nc.Close()
			continue
		}
		p.accepts.Add(1)
		p.track(c, src)
		// The group with the fewest connections takes it.
		g := p.groups[0]
		for _, o := range p.groups[1:] {
			if o.conns.Load() < g.conns.Load() {
				g = o
			}
		}
		c.g = g
		g.conns.Add(1)
		g.adopt(c)
	}
}

// Stats are the port's counters, summed over its poll groups.
type Stats struct {
	Accepts uint64 // connections accepted
	// Rejected were closed as they were accepted: MaxPending connections
	// of the port, or MaxPendingPerSource of the same source address,
	// were waiting to connect. RejectedSource are those of them refused
	// for MaxPendingPerSource. Evicted were pending connections closed
	// to make room for a connection of a source with fewer (pending.go).
	Rejected, RejectedSource, Evicted uint64
	// Pending are the connections accepted and not connected yet.
	Pending uint64
	// ConnectTimeouts were closed for sending no ICReq or no command
	// within ConnectTimeout (the core counts queues whose Connect did not
	// succeed in time: target.Stats.ConnectsTimedOut).
	ConnectTimeouts uint64
	// DigestConnections negotiated a header or data digest in ICReq.
	DigestConnections uint64
	Connections       uint64 // connections open now
	Commands          uint64 // CapsuleCmd PDUs
	InCapsule         uint64 // commands whose data came in the capsule
	R2Ts              uint64 // R2T PDUs sent
	H2CData           uint64 // H2CData PDUs received
	C2HData           uint64 // C2HData PDUs sent
	Responses         uint64 // CapsuleResp PDUs sent
	// SuccessFlags are reads answered by a C2HData with SUCCESS and no
	// CapsuleResp (the host disabled SQ flow control).
	SuccessFlags uint64
	// HeaderDigestErrors terminated their connection (FES 0x03);
	// DataDigestErrors closed it (as nvmet).
	HeaderDigestErrors, DataDigestErrors uint64
	// Terminations are C2HTermReqs sent (protocol errors);
	// HostTerminations H2CTermReqs received.
	Terminations, HostTerminations uint64
	// BytesIn and BytesOut are what the sockets moved.
	BytesIn, BytesOut uint64
	// Copies and CopiedBytes are the user-space copies of data: host
	// data that arrived in the staging buffer with its header and was
	// copied to its data buffer. Everything else is read into and
	// written from the data buffers directly.
	Copies, CopiedBytes uint64
	DataWaits           uint64 // commands that waited for a data buffer
	// Reads and Writes are the readv and writev calls; Wakes the eventfd
	// writes that woke a sleeping group, Sleeps its sleeps, Passes its
	// loop passes.
	Reads, Writes, Wakes, Sleeps, Passes uint64
	// GroupedWrites were committed together in GroupCommits backend
	// commits (target.Group, one per poll group).
	GroupedWrites, GroupCommits uint64
	// States counts the moves of requests into each state (req.go).
	States [numReqStates]uint64
}

// Stats returns the port's counters.
func (p *Port) Stats() Stats {
	s := Stats{Accepts: p.accepts.Load(), DigestConnections: p.digestConns.Load(),
		Rejected: p.rejected.Load(), RejectedSource: p.rejectedSource.Load(),
		Evicted: p.evicted.Load(), Pending: uint64(max(p.pending.Load(), 0))}
	for _, g := range p.groups {
		st := &g.st
		s.Connections += uint64(max(g.conns.Load(), 0))
		s.Commands += st.commands.Load()
		s.ConnectTimeouts += st.connectTimeouts.Load()
		s.InCapsule += st.inCapsule.Load()
		s.R2Ts += st.r2ts.Load()
		s.H2CData += st.h2c.Load()
		s.C2HData += st.c2h.Load()
		s.Responses += st.resps.Load()
		s.SuccessFlags += st.successFlags.Load()
		s.HeaderDigestErrors += st.hdgstErrs.Load()
		s.DataDigestErrors += st.ddgstErrs.Load()
		s.Terminations += st.terms.Load()
		s.HostTerminations += st.hostTerms.Load()
		s.BytesIn += st.bytesIn.Load()
		s.BytesOut += st.bytesOut.Load()
		s.Copies += st.copies.Load()
		s.CopiedBytes += st.copiedBytes.Load()
		s.DataWaits += st.dataWaits.Load()
		s.Reads += st.reads.Load()
		s.Writes += st.writes.Load()
		s.Wakes += g.loop.Wakes()
		s.Sleeps += g.loop.Sleeps()
		s.Passes += st.passes.Load()
		gs := g.tg.Stats()
		s.GroupedWrites += gs.Writes
		s.GroupCommits += gs.Commits
		for i := range s.States {
			s.States[i] += st.states[i].Load()
		}
	}
	return s
}

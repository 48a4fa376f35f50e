package target

import (
	"cmp"

	"github.com/blk-project/blk/nvme"
)

// execDiscoveryAdmin serves a discovery controller's admin queue, as
// nvmet's discovery.c: Identify Controller only, Get Log Page 0x70 only,
// Get/Set Features Keep Alive Timer and Async Event Configuration,
// Asynchronous Event Request, Keep Alive. Other opcodes are Invalid
// Opcode; other CNS, LIDs and FIDs Invalid Field.
func (q *Queue) execDiscoveryAdmin(c *ctrl, r *Request) {
	var st nvme.Status
	switch nvme.AdminOpcode(r.Cmd.Opcode) {
	case nvme.AdminIdentify:
		if uint8(r.Cmd.CDW10) != nvme.CNSController {
			st = nvme.StatusInvalidField.WithDNR()
		} else {
			st = c.identify(r)
		}
	case nvme.AdminGetLogPage:
		st = c.discoveryLogPage(r)
	case nvme.AdminSetFeatures:
		st = c.setFeatures(r)
	case nvme.AdminGetFeatures:
		st = c.getFeatures(r)
	case nvme.AdminAsyncEvent:
		c.asyncEventRequest(r)
		return
	case nvme.AdminKeepAlive:
		st = c.keepAliveCmd(r)
	default:
		st = nvme.StatusInvalidOpcode.WithDNR()
	}
	q.complete(r, st)
}

// discoveryLogPage serves Get Log Page on a discovery controller: the
// discovery log, for any dword-aligned window.
func (c *ctrl) discoveryLogPage(r *Request) nvme.Status {
	g, data, st := logPageArgs(r)
	if st != nvme.StatusSuccess {
		return st
	}
	if g.LID != nvme.LogDiscovery {
		return nvme.StatusInvalidField.WithDNR()
	}
	page := c.t.discoveryLog(c.hostNQN, c.admin.params)
	if !copyWindow(data, page, g.LPO) {
		return nvme.StatusInvalidField.WithDNR()
	}
	if !g.RAE {
		c.mu.Lock()
		c.masked &^= nvme.AENDiscoveryLogs
		c.mu.Unlock()
	}
	return nvme.StatusSuccess
}

// matchPort finds the port a connection with these parameters came in
// on: one whose service and address match (and transport, if the binding
// said which), preferring an exact address over a wildcard one. It
// returns the address and service to report: the port's advertised ones
// if it has them, else its own address, or for a wildcard port the
// local address the connection arrived on. Requires t.mu.
func (t *Target) matchPort(p QueueParams) (port Port, traddr, trsvcid string, ok bool) {
	var wild *Port
	for _, port := range t.sortedPorts() {
		if port.TrSvcID != p.LocalPort || (p.Transport != 0 && port.TrType != p.Transport) {
			continue
		}
		if port.TrAddr == p.LocalAddr {
			return port, cmp.Or(port.AdvertiseAddr, port.TrAddr), cmp.Or(port.AdvertiseSvcID, port.TrSvcID), true
		}
		if wild == nil && wildcardHost(port.TrAddr) {
			wild = &port
		}
	}
	if wild != nil {
		w := *wild
		if w.AdvertiseAddr == "" {
			// The family is the local address's: a port listening on
			// "::" also takes IPv4 connections.
			w.AdrFam = ipFamily(p.LocalAddr, w.AdrFam)
		}
		return w, cmp.Or(w.AdvertiseAddr, p.LocalAddr), cmp.Or(w.AdvertiseSvcID, w.TrSvcID), true
	}
	return Port{}, "", "", false
}

// discoveryOnlyPort reports whether a queue with these parameters came
// in through a discovery-only port.
func (t *Target) discoveryOnlyPort(p QueueParams) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	port, _, _, ok := t.matchPort(p)
	return ok && port.DiscoveryOnly
}

// asqsz is the ASQSZ the discovery log reports for a port: the admin
// queue size of the port's limits, else of Config.Limits, else 32.
func (t *Target) asqsz(p *Port) uint16 {
	n := uint32(defaultASQSZ)
	switch {
	case p.Limits != nil:
		n = p.Limits.AdminQueueEntries
	case t.cfg.Limits != (Limits{}):
		n = t.cfg.Limits.AdminQueueEntries
	}
	return uint16(min(n, 0xFFFF))
}

// discoveryLog builds the discovery log a host sees through the port its
// connection came in on: the discovery subsystem itself on that port
// (SUBTYPE 3), then every NVM subsystem the host may connect to, by NQN,
// once per port of the target — the arrival port first, then the others
// by ID — so that a host that discovers over one transport learns every
// transport that serves the subsystem (nvmet lists the arrival port only;
// SPDK lists them all), then on the other targets' ports its
// SubsystemConfig.Paths name; then the remote subsystems the host is
// admitted to (SetRemoteSubsystems), each on its paths. A discovery-only
// port (Port.DiscoveryOnly) lists no NVM subsystem on itself. A connection
// through no known port sees an empty log. The log and its GENCTR come from
// one snapshot under t.mu.
func (t *Target) discoveryLog(host string, p QueueParams) []byte {
	type listed struct {
		port            Port
		traddr, trsvcid string
	}
	t.mu.Lock()
	gen := t.genctr.Load()
	arrival, traddr, trsvcid, ok := t.matchPort(p)
	var subs []*Subsystem
	var paths [][]Port // each subsystem's remote paths
	var ports []listed // where the NVM subsystems are served
	var remote []RemoteSubsystem
	cur := listed{arrival, traddr, trsvcid}
	if ok {
		remote = t.remoteListed(host)
		for _, s := range t.sortedSubsystems() {
			if s.hostAllowed(host) {
				subs = append(subs, s)
				paths = append(paths, s.pathList())
			}
		}
		if !arrival.DiscoveryOnly {
			ports = append(ports, cur)
		}
		for _, port := range t.sortedPorts() {
			if port.ID == arrival.ID || port.DiscoveryOnly {
				continue
			}
			a := cmp.Or(port.AdvertiseAddr, port.TrAddr)
			if port.AdvertiseAddr == "" && wildcardHost(port.TrAddr) {
				// Listening everywhere: on the address this host
				// reached us by, as the arrival port's entry says.
				a = traddr
				port.AdrFam = ipFamily(traddr, port.AdrFam)
			}
			ports = append(ports, listed{port, a, cmp.Or(port.AdvertiseSvcID, port.TrSvcID)})
		}
	}
	t.mu.Unlock()

	n := 0
	if ok {
		n = 1 + len(subs)*len(ports)
		for _, ps := range paths {
			n += len(ps)
		}
		for _, r := range remote {
			n += len(r.Paths)
		}
	}
	page := make([]byte, nvme.DiscoveryLogHeaderSize+n*nvme.DiscoveryLogEntrySize)
	h := nvme.DiscoveryLogHeader{GenCtr: gen, NumRec: uint64(n)}
	h.Marshal((*[nvme.DiscoveryLogHeaderSize]byte)(page))
	if !ok {
		return page
	}
	off := nvme.DiscoveryLogHeaderSize
	put := func(l *listed, subtype uint8, nqn string, eflags uint16) {
		port := &l.port
		e := nvme.DiscoveryLogEntry{
			TrType: port.TrType, AdrFam: port.AdrFam, TReq: port.TReq, PortID: port.ID,
			CNTLID: nvme.CNTLIDDynamic, ASQSZ: t.asqsz(port), SubType: subtype, EFlags: eflags,
		}
		_ = e.SetTrSvcID(l.trsvcid)
		_ = e.SetTrAddr(l.traddr)
		switch port.TrType {
		case nvme.TrTypeRDMA:
			e.SetRDMATSAS(port.RDMA)
		case nvme.TrTypeTCP:
			e.SetTCPTSAS(port.TCP)
		}
		e.SubNQN, _ = nvme.MakeNQNField(nqn)
		e.Marshal((*[nvme.DiscoveryLogEntrySize]byte)(page[off:]))
		off += nvme.DiscoveryLogEntrySize
	}
	// The current discovery subsystem: the same information as this
	// controller, and persistent connections (KATO) are supported.
	put(&cur, nvme.SubTypeCurrentDiscovery, nvme.DiscoveryNQN, nvme.EFlagDupRetInfo|nvme.EFlagEPCSD)
	for i, s := range subs {
		for j := range ports {
			put(&ports[j], nvme.SubTypeNVM, s.nqn, 0)
		}
		// Then where other targets serve it (SubsystemConfig.Paths).
		for _, p := range paths[i] {
			put(&listed{p, p.TrAddr, p.TrSvcID}, nvme.SubTypeNVM, s.nqn, 0)
		}
	}
	// Then the subsystems only other targets serve, where they serve them.
	for _, r := range remote {
		for _, p := range r.Paths {
			put(&listed{p, p.TrAddr, p.TrSvcID}, nvme.SubTypeNVM, r.NQN, 0)
		}
	}
	return page
}

package target

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/auth"
)

// SubsystemConfig describes an NVM subsystem.
type SubsystemConfig struct {
	// NQN is the subsystem's NVMe Qualified Name.
	NQN string
	// Serial is Identify Controller SN (printable ASCII, ≤ 20 bytes).
	// Empty: 20 hex digits derived from the NQN.
	Serial string
	// Model is Identify Controller MN (printable ASCII, ≤ 40 bytes).
	// Empty: "blk".
	Model string
	// AllowAnyHost lets every host connect; otherwise only Hosts may.
	AllowAnyHost bool
	// Hosts are the host NQNs allowed to connect.
	Hosts []string
	// HostKeys are the DH-HMAC-CHAP secrets of hosts that must
	// authenticate, by host NQN (see SetHostKeys).
	HostKeys map[string]HostKeys

	// ANA makes the subsystem report Asymmetric Namespace Access (ana.go):
	// one ANA group, ID 1, of all its namespaces, whose state
	// SetANAState changes. Without it Identify, the logs and the I/O path
	// are as they always were.
	ANA bool
	// ANAState is the group's state at creation, with ANA. Zero:
	// optimized. A path that must not serve until told otherwise starts
	// inaccessible, with no window in which it serves.
	ANAState nvme.ANAState

	// Admit, when set, decides at each admin queue Connect whether a host
	// may create a controller, in place of AllowAnyHost and Hosts (which
	// must then be unset); DH-HMAC-CHAP (HostKeys) still applies to an
	// admitted host. A nil error admits; any other refuses the Connect
	// with Connect Invalid Host, with DNR (a Linux host stops
	// reconnecting) unless the error wraps ErrAdmitRetry. Admit runs on
	// the binding's goroutine, and again if EvictAndDrain ran during the
	// Connect: it must be quick and must not block. It is also asked
	// which hosts the discovery log shows the subsystem to. See fence.go.
	Admit func(hostNQN string) error

	// Paths are other targets' ports serving this same subsystem (the
	// other nodes of a volume exported under one NQN, each an ANA path):
	// the discovery log lists the subsystem on each, after this target's
	// own ports, so a host that discovers here learns every path (nvme
	// connect-all). Each is a Port as the other target reports it: ID its
	// PORTID there, TrAddr a specific address, Limits (optional) for its
	// ASQSZ (else as this target's ports); AdvertiseAddr, AdvertiseSvcID
	// and DiscoveryOnly are not used. Listed in the order given. SetPaths
	// replaces them.
	Paths []Port
}

// NamespaceConfig describes a namespace.
type NamespaceConfig struct {
	// NSID is the namespace ID, 1..Config.MaxNSID.
	NSID uint32
	// Backend is the namespace's storage, synchronous; the core calls it
	// through Inline. The subsystem does not close it. Set Backend or
	// Async, not both.
	Backend Backend
	// Async is the namespace's storage, asynchronous (async.go): IOs are
	// submitted and completed later, on the submitting poll group.
	Async AsyncBackend
	// Reservations, when set, makes the namespace serve persistent
	// reservations through this keeper (resv.go): ONCS bit 5 and RESCAP
	// in Identify, the four reservation opcodes, log 80h, features 82h
	// and 83h. Its I/O is answered Namespace Not Ready until the first
	// Subsystem.PublishReservation (LocalReservations publishes its
	// empty state at once). Nil: none, the opcodes are Invalid Opcode.
	Reservations ReservationKeeper
	// NGUID is the namespace's globally unique identifier. Zero: derived
	// from the subsystem NQN and the NSID (SHA-256), so it is stable
	// across restarts and the same on every target that serves the
	// subsystem (which is what a multipath host expects), and differs
	// between namespaces. NGUIDs must be unique within the target: a
	// Linux host ignores a namespace whose NGUID it has seen elsewhere.
	NGUID [16]byte
}

// Subsystem is an NVM subsystem (or the discovery subsystem, internally):
// its namespaces, the hosts allowed to connect, and its live controllers.
type Subsystem struct {
	t         *Target
	nqn       string
	serial    [20]byte
	model     [40]byte
	discovery bool

	// ns is the namespace table, replaced whole (copy on write) under
	// nsMu, read with one atomic load on the I/O path.
	ns   atomic.Pointer[nsTable]
	nsMu sync.Mutex // serialises namespace changes

	mu       sync.Mutex // guards below; ordered after Target.mu, before ctrl.mu
	allowAny bool
	hosts    map[string]bool
	keys     map[string]HostKeys
	ctrls    map[uint16]*ctrl
	removed  bool
	paths    []Port // replaced whole by SetPaths, never changed in place

	// admit is SubsystemConfig.Admit; evictGen counts EvictAndDrain
	// calls, so that a Connect admitted before one re-asks (fence.go).
	admit    func(hostNQN string) error
	evictGen atomic.Uint64
	// refuse is Refuse's reason, nil when new controllers are admitted;
	// stored under mu, before evictGen is bumped (fence.go).
	refuse atomic.Pointer[error]
	// ioQueues are the I/O queues connected to the subsystem's
	// controllers that have not drained yet (Queue.Drained), with their
	// host NQN: what EvictAndDrain waits for, including the queues of
	// controllers already torn down. qmu is a leaf lock.
	qmu      sync.Mutex
	ioQueues map[*Queue]string

	// ANA (ana.go). ana is fixed at creation; anaIO is the status an I/O
	// command gets in the current state (0: served), one atomic load per
	// command. anaMu serialises SetANAState and guards anaState and
	// anaChg; it is a leaf lock (taken under ctrl.mu by the log).
	ana      bool
	anaIO    atomic.Uint32
	anaMu    sync.Mutex
	anaState nvme.ANAState
	anaChg   uint64

	// drainMu serialises DrainHosts (resv.go).
	drainMu sync.Mutex
}

func newSubsystem(t *Target, c SubsystemConfig, discovery bool) *Subsystem {
	s := &Subsystem{t: t, nqn: c.NQN, discovery: discovery, allowAny: c.AllowAnyHost,
		hosts: make(map[string]bool), ctrls: make(map[uint16]*ctrl), ioQueues: make(map[*Queue]string)}
	if !discovery {
		s.admit = c.Admit
		s.paths = c.Paths
	}
	s.initANA(c)
	_ = nvme.SetASCII(s.serial[:], c.Serial)
	_ = nvme.SetASCII(s.model[:], c.Model)
	for _, h := range c.Hosts {
		s.hosts[h] = true
	}
	if !discovery {
		for h, k := range c.HostKeys {
			s.setKeys(h, &k)
		}
	}
	s.ns.Store(&nsTable{})
	return s
}

// NQN returns the subsystem's NQN.
func (s *Subsystem) NQN() string { return s.nqn }

// Serial returns the subsystem's serial number.
func (s *Subsystem) Serial() string { return nvme.TrimASCII(s.serial[:]) }

// Model returns the subsystem's model number.
func (s *Subsystem) Model() string { return nvme.TrimASCII(s.model[:]) }

// SetHostKeys makes hostNQN authenticate every queue it connects with
// DH-HMAC-CHAP, with the secrets k (nil: no authentication). A live
// controller of the host that did not authenticate (it connected before
// the host had secrets) is torn down: from now on the host must prove
// itself, and its next Connect asks it to. Authenticated controllers keep
// their sessions; new queues and re-authentications use the new secrets
// (rotation). The discovery subsystem authenticates nobody, as nvmet.
func (s *Subsystem) SetHostKeys(hostNQN string, k *HostKeys) error {
	if err := nvme.ValidateNQN(hostNQN); err != nil {
		return fmt.Errorf("target: subsystem %s: host NQN %q: %w", s.nqn, hostNQN, ErrInvalid)
	}
	if s.discovery {
		return fmt.Errorf("target: the discovery subsystem authenticates no host: %w", ErrInvalid)
	}
	if k != nil && (len(k.Host.Secret) == 0 || (k.Ctrl != nil && len(k.Ctrl.Secret) == 0)) {
		return fmt.Errorf("target: subsystem %s: host %s: empty secret: %w", s.nqn, hostNQN, ErrInvalid)
	}
	s.mu.Lock()
	s.setKeys(hostNQN, k)
	s.mu.Unlock()
	if k != nil {
		for _, c := range s.controllers() {
			if c.hostNQN == hostNQN && c.admin.auth == nil {
				c.teardown(errAuthNowRequired)
			}
		}
	}
	return nil
}

// setKeys stores a copy of k. Requires s.mu (or a subsystem not yet
// published).
func (s *Subsystem) setKeys(hostNQN string, k *HostKeys) {
	if k == nil {
		delete(s.keys, hostNQN)
		return
	}
	if s.keys == nil {
		s.keys = make(map[string]HostKeys)
	}
	c := HostKeys{Host: auth.Key{Transform: k.Host.Transform, Secret: bytes.Clone(k.Host.Secret)}}
	if k.Ctrl != nil {
		c.Ctrl = &auth.Key{Transform: k.Ctrl.Transform, Secret: bytes.Clone(k.Ctrl.Secret)}
	}
	s.keys[hostNQN] = c
}

// hostKeys returns hostNQN's secrets, if it must authenticate.
func (s *Subsystem) hostKeys(hostNQN string) (HostKeys, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[hostNQN]
	return k, ok
}

// AuthenticatedHosts returns the hosts that must authenticate, sorted.
func (s *Subsystem) AuthenticatedHosts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.keys))
}

// AllowHost lets a host NQN connect. A subsystem with Admit has no host
// list: ErrInvalid.
func (s *Subsystem) AllowHost(hostNQN string) error {
	if err := nvme.ValidateNQN(hostNQN); err != nil {
		return fmt.Errorf("target: subsystem %s: host NQN %q: %w", s.nqn, hostNQN, ErrInvalid)
	}
	if s.admit != nil {
		return fmt.Errorf("target: subsystem %s: hosts are admitted by its Admit, not listed: %w", s.nqn, ErrInvalid)
	}
	s.t.mu.Lock()
	s.mu.Lock()
	if s.hosts[hostNQN] {
		s.mu.Unlock()
		s.t.mu.Unlock()
		return fmt.Errorf("target: subsystem %s: host %s: %w", s.nqn, hostNQN, ErrExists)
	}
	s.hosts[hostNQN] = true
	s.t.genctr.Add(1)
	s.mu.Unlock()
	s.t.mu.Unlock()
	s.t.discoveryChanged()
	return nil
}

// DenyHost removes a host NQN from the allowed list. Unless the subsystem
// allows any host, that host's live controllers are torn down: access is
// revoked now, not at the next connect.
func (s *Subsystem) DenyHost(hostNQN string) error {
	s.t.mu.Lock()
	s.mu.Lock()
	if !s.hosts[hostNQN] {
		s.mu.Unlock()
		s.t.mu.Unlock()
		return fmt.Errorf("target: subsystem %s: host %s: %w", s.nqn, hostNQN, ErrNotFound)
	}
	delete(s.hosts, hostNQN)
	s.t.genctr.Add(1)
	s.mu.Unlock()
	s.t.mu.Unlock()
	s.revokeHosts()
	s.t.discoveryChanged()
	return nil
}

// SetAllowAnyHost switches allow-any-host. Switching it off tears down the
// controllers of hosts not on the allowed list.
func (s *Subsystem) SetAllowAnyHost(allow bool) {
	s.t.mu.Lock()
	s.mu.Lock()
	changed := s.allowAny != allow
	s.allowAny = allow
	if changed {
		s.t.genctr.Add(1)
	}
	s.mu.Unlock()
	s.t.mu.Unlock()
	if changed {
		s.revokeHosts()
		s.t.discoveryChanged()
	}
}

// AllowAnyHost reports whether any host may connect.
func (s *Subsystem) AllowAnyHost() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allowAny
}

// Hosts returns the allowed host NQNs, sorted.
func (s *Subsystem) Hosts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.hosts))
}

// ConnectedHosts returns the NQNs of the hosts with a live controller on
// the subsystem, sorted, each once.
func (s *Subsystem) ConnectedHosts() []string {
	var hs []string
	for _, c := range s.controllers() {
		if !slices.Contains(hs, c.hostNQN) {
			hs = append(hs, c.hostNQN)
		}
	}
	slices.Sort(hs)
	return hs
}

// hostAllowed reports whether hostNQN may connect. The discovery
// subsystem admits every host; a subsystem with Admit, the hosts it
// admits.
func (s *Subsystem) hostAllowed(hostNQN string) bool {
	if s.discovery {
		return true
	}
	if s.admit != nil {
		return s.admit(hostNQN) == nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allowAny || s.hosts[hostNQN]
}

// checkPath checks a remote path as AddPort checks a port, and returns
// it with the RDMA TSAS defaulted and its Limits copied.
func checkPath(p Port) (Port, error) {
	switch {
	case len(p.TrAddr) >= 256 || len(p.TrSvcID) >= 32:
		return p, fmt.Errorf("target: path (port %d): address %q service %q too long: %w", p.ID, p.TrAddr, p.TrSvcID, ErrInvalid)
	case p.TrAddr == "" || wildcardHost(p.TrAddr) || p.TrSvcID == "":
		return p, fmt.Errorf("target: path (port %d): address %q service %q: a host must be able to connect to it: %w", p.ID, p.TrAddr, p.TrSvcID, ErrInvalid)
	case p.AdvertiseAddr != "" || p.AdvertiseSvcID != "" || p.DiscoveryOnly:
		return p, fmt.Errorf("target: path (port %d): give the address hosts use as TrAddr, no AdvertiseAddr, AdvertiseSvcID or DiscoveryOnly: %w", p.ID, ErrInvalid)
	case p.TCP.SecType > nvme.TCPSecTypeTLS13:
		return p, fmt.Errorf("target: path (port %d): TCP SECTYPE %d unknown: %w", p.ID, p.TCP.SecType, ErrInvalid)
	}
	if p.Limits != nil {
		l := *p.Limits
		if err := l.Validate(); err != nil {
			return p, fmt.Errorf("target: path (port %d): %w", p.ID, err)
		}
		p.Limits = &l
	}
	if p.TrType == nvme.TrTypeRDMA && p.RDMA == (nvme.RDMATSAS{}) {
		p.RDMA = nvme.RDMATSAS{QPType: nvme.RDMAQPTypeConnected, PrType: nvme.RDMAPrTypeNotSpecified, CMS: nvme.RDMACMSRDMACM}
	}
	return p, nil
}

// checkPaths checks every path and returns the checked copies.
func checkPaths(ps []Port) ([]Port, error) {
	out := make([]Port, 0, len(ps))
	for _, p := range ps {
		c, err := checkPath(p)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// SetPaths replaces the subsystem's remote paths (SubsystemConfig.Paths):
// the discovery log changes, and every discovery controller that asked
// for it gets the discovery log change notice, so a host watching
// discovery (nvme discover -p) learns of a new path or a gone one.
func (s *Subsystem) SetPaths(paths []Port) error {
	if s.discovery {
		return fmt.Errorf("target: the discovery subsystem has no paths: %w", ErrInvalid)
	}
	ps, err := checkPaths(paths)
	if err != nil {
		return fmt.Errorf("target: subsystem %s: %w", s.nqn, err)
	}
	s.t.mu.Lock()
	s.mu.Lock()
	s.paths = ps
	s.t.genctr.Add(1)
	s.mu.Unlock()
	s.t.mu.Unlock()
	s.t.discoveryChanged()
	return nil
}

// Paths returns the subsystem's remote paths.
func (s *Subsystem) Paths() []Port {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.paths)
}

// pathList returns the paths slice itself (never changed in place).
func (s *Subsystem) pathList() []Port {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paths
}

// revokeHosts tears down the controllers of hosts no longer allowed. A
// subsystem with Admit has no host list to revoke from: EvictAndDrain
// is its revocation.
func (s *Subsystem) revokeHosts() {
	if s.admit != nil {
		return
	}
	for _, c := range s.controllers() {
		if !s.hostAllowed(c.hostNQN) {
			c.teardown(errHostRevoked)
		}
	}
}

// controllers returns a snapshot of the live controllers.
func (s *Subsystem) controllers() []*ctrl {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := make([]*ctrl, 0, len(s.ctrls))
	for _, c := range s.ctrls {
		cs = append(cs, c)
	}
	slices.SortFunc(cs, func(a, b *ctrl) int { return cmp.Compare(a.cntlid, b.cntlid) })
	return cs
}

// addCtrl registers a new controller; it fails if the subsystem was
// removed meanwhile.
func (s *Subsystem) addCtrl(c *ctrl) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return false
	}
	s.ctrls[c.cntlid] = c
	return true
}

// findCtrl returns the live controller an I/O queue Connect names.
func (s *Subsystem) findCtrl(cntlid uint16, hostNQN []byte) *ctrl {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.ctrls[cntlid]
	if c == nil || c.hostNQN != string(hostNQN) {
		return nil
	}
	return c
}

func (s *Subsystem) removeCtrl(c *ctrl) {
	s.mu.Lock()
	if s.ctrls[c.cntlid] == c {
		delete(s.ctrls, c.cntlid)
	}
	s.mu.Unlock()
}

// namespace is one namespace of a subsystem.
type namespace struct {
	s       *Subsystem
	nsid    uint32
	io      AsyncBackend // the backend the core calls (Inline(Backend) for a synchronous one)
	backend Backend      // the synchronous backend, nil for an asynchronous one
	inline  *inline      // io, when it is Inline(backend): called directly
	viewer  Viewer       // nil if the backend has none
	// blocking: Flush and FUA may wait for a sync in Submit (sync workers).
	blocking bool
	nguid    [16]byte
	bs       uint32 // block size, fixed
	shift    uint8  // log2(bs)

	blocks   atomic.Uint64 // capacity, refreshed by revalidate
	readOnly atomic.Bool

	// refs counts commands using the namespace; removed is set when it is
	// detached, after which acquire fails and the last release closes
	// drained.
	refs      atomic.Int64
	removed   atomic.Bool
	drained   chan struct{}
	drainOnce sync.Once

	c nsCounters

	// resv is the reservation state and keeper (resv.go).
	resv nsResv
	// locks is the range lock of fused pairs and plain writes
	// (rangelock.go).
	locks rangeLocks
}

// acquire takes a reference, or returns false if the namespace was
// detached.
func (ns *namespace) acquire() bool {
	ns.refs.Add(1)
	if ns.removed.Load() {
		ns.release()
		return false
	}
	return true
}

func (ns *namespace) release() {
	if ns.refs.Add(-1) == 0 && ns.removed.Load() {
		ns.drainOnce.Do(func() { close(ns.drained) })
	}
}

// detach makes the namespace unusable and waits until no command uses it.
func (ns *namespace) detach() {
	ns.removed.Store(true)
	if ns.refs.Load() == 0 {
		ns.drainOnce.Do(func() { close(ns.drained) })
	}
	<-ns.drained
}

// nsTable is an immutable, NSID-sorted namespace list.
type nsTable struct{ list []*namespace }

// find returns the namespace with that NSID, or nil. No allocation, no
// lock: the I/O path calls it per command.
func (tb *nsTable) find(nsid uint32) *namespace {
	l := tb.list
	lo, hi := 0, len(l)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l[m].nsid < nsid {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(l) && l[lo].nsid == nsid {
		return l[lo]
	}
	return nil
}

func (s *Subsystem) table() *nsTable { return s.ns.Load() }

// acquireNS returns the namespace with a reference held, or nil.
func (s *Subsystem) acquireNS(nsid uint32) *namespace {
	ns := s.ns.Load().find(nsid)
	if ns == nil || !ns.acquire() {
		return nil
	}
	return ns
}

// Namespaces returns the attached NSIDs in increasing order.
func (s *Subsystem) Namespaces() []uint32 {
	l := s.table().list
	ids := make([]uint32, len(l))
	for i, ns := range l {
		ids[i] = ns.nsid
	}
	return ids
}

// derivedNGUID is the NGUID of a namespace configured without one.
func derivedNGUID(nqn string, nsid uint32) [16]byte {
	h := sha256.New()
	h.Write([]byte("blk nguid\x00"))
	h.Write([]byte(nqn))
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], nsid)
	h.Write(b[:])
	var g [16]byte
	copy(g[:], h.Sum(nil))
	return g
}

// AddNamespace attaches a namespace. Every controller of the subsystem
// gets the NSID in its Changed Namespace List log and a namespace
// attribute changed asynchronous event.
func (s *Subsystem) AddNamespace(c NamespaceConfig) error {
	if s.discovery {
		return fmt.Errorf("target: discovery subsystem has no namespaces: %w", ErrInvalid)
	}
	if c.NSID == 0 || c.NSID > s.t.cfg.MaxNSID {
		return fmt.Errorf("target: subsystem %s: NSID %d outside [1, %d]: %w", s.nqn, c.NSID, s.t.cfg.MaxNSID, ErrInvalid)
	}
	if (c.Backend == nil) == (c.Async == nil) {
		return fmt.Errorf("target: subsystem %s: NSID %d: want one of Backend and Async: %w", s.nqn, c.NSID, ErrInvalid)
	}
	io := c.Async
	if c.Backend != nil {
		io = Inline(c.Backend)
	}
	g, err := io.Geometry()
	if err != nil {
		return fmt.Errorf("target: subsystem %s: NSID %d: geometry: %w", s.nqn, c.NSID, err)
	}
	if g.BlockSize < 512 || g.BlockSize > 4096 || bits.OnesCount32(g.BlockSize) != 1 || g.Blocks == 0 {
		return fmt.Errorf("target: subsystem %s: NSID %d: block size %d, %d blocks: %w",
			s.nqn, c.NSID, g.BlockSize, g.Blocks, ErrInvalid)
	}
	ns := &namespace{s: s, nsid: c.NSID, io: io, backend: c.Backend, blocking: io.Blocking(), nguid: c.NGUID, bs: g.BlockSize,
		shift: uint8(bits.TrailingZeros32(g.BlockSize)), drained: make(chan struct{})}
	if a, ok := io.(inline); ok {
		// A synchronous backend, given as Backend or wrapped by the
		// caller: the core calls it directly (Queue.submit).
		ns.inline = &a
		ns.backend = a.b
	}
	if ns.backend != nil {
		ns.viewer, _ = ns.backend.(Viewer)
	} else {
		ns.viewer, _ = c.Async.(Viewer)
	}
	if ns.nguid == ([16]byte{}) {
		ns.nguid = derivedNGUID(s.nqn, c.NSID)
	}
	ns.blocks.Store(g.Blocks)
	ns.readOnly.Store(g.ReadOnly)
	if c.Reservations != nil {
		if err := ns.setKeeper(c.Reservations, nil); err != nil {
			return err
		}
	}

	s.nsMu.Lock()
	old := s.table()
	if old.find(c.NSID) != nil {
		s.nsMu.Unlock()
		return fmt.Errorf("target: subsystem %s: NSID %d: %w", s.nqn, c.NSID, ErrExists)
	}
	t := s.t
	t.mu.Lock()
	removed := t.subsystems[s.nqn] != s
	owner, dup := t.nguids[ns.nguid]
	if !removed && !dup {
		t.nguids[ns.nguid] = fmt.Sprintf("%s/%d", s.nqn, c.NSID)
	}
	t.mu.Unlock()
	if removed {
		s.nsMu.Unlock()
		return fmt.Errorf("target: subsystem %s: %w", s.nqn, ErrNotFound)
	}
	if dup {
		s.nsMu.Unlock()
		return fmt.Errorf("target: subsystem %s: NSID %d: NGUID %x already used by %s: %w",
			s.nqn, c.NSID, ns.nguid, owner, ErrExists)
	}
	l := append(slices.Clone(old.list), ns)
	slices.SortFunc(l, func(a, b *namespace) int { return cmp.Compare(a.nsid, b.nsid) })
	s.ns.Store(&nsTable{list: l})
	s.nsMu.Unlock()
	s.nsChanged(c.NSID)
	return nil
}

// RemoveNamespace detaches a namespace: new commands naming it get
// Invalid Namespace, every controller gets the changed-namespace log entry
// and event, and it returns once no command is running on it (so the
// caller may close the backend).
func (s *Subsystem) RemoveNamespace(nsid uint32) error {
	s.nsMu.Lock()
	old := s.table()
	ns := old.find(nsid)
	if ns == nil {
		s.nsMu.Unlock()
		return fmt.Errorf("target: subsystem %s: NSID %d: %w", s.nqn, nsid, ErrNotFound)
	}
	l := slices.DeleteFunc(slices.Clone(old.list), func(n *namespace) bool { return n == ns })
	s.ns.Store(&nsTable{list: l})
	s.t.mu.Lock()
	delete(s.t.nguids, ns.nguid)
	s.t.mu.Unlock()
	s.nsMu.Unlock()
	s.nsChanged(nsid)
	ns.detach()
	return nil
}

// RevalidateNamespace re-reads a namespace's geometry (after a volume was
// resized or made read-only) and, if it changed, tells every controller
// as for an attach. Identify Namespace does the same on its own.
func (s *Subsystem) RevalidateNamespace(nsid uint32) error {
	ns := s.acquireNS(nsid)
	if ns == nil {
		return fmt.Errorf("target: subsystem %s: NSID %d: %w", s.nqn, nsid, ErrNotFound)
	}
	defer ns.release()
	changed, err := ns.revalidate()
	if err != nil {
		return fmt.Errorf("target: subsystem %s: NSID %d: %w", s.nqn, nsid, err)
	}
	if changed {
		s.nsChanged(nsid)
	}
	return nil
}

// revalidate refreshes the cached capacity and write protection and
// reports whether they changed.
func (ns *namespace) revalidate() (bool, error) {
	g, err := ns.io.Geometry()
	if err != nil {
		return false, err
	}
	return ns.setGeometry(g)
}

// revalidateNow is revalidate on a poll group: with a backend that can
// answer without waiting (GeometryTrier), a busy one leaves the cached
// geometry as it is (a resize is announced by RevalidateNamespace anyway,
// and the next Identify picks it up).
func (ns *namespace) revalidateNow() (bool, error) {
	t, ok := ns.io.(GeometryTrier)
	if !ok {
		return ns.revalidate()
	}
	g, ok, err := t.TryGeometry()
	if err != nil || !ok {
		return false, err
	}
	return ns.setGeometry(g)
}

func (ns *namespace) setGeometry(g Geometry) (bool, error) {
	if g.BlockSize != ns.bs {
		return false, fmt.Errorf("block size changed from %d to %d: %w", ns.bs, g.BlockSize, ErrInvalid)
	}
	changed := ns.blocks.Swap(g.Blocks) != g.Blocks
	if ns.readOnly.Swap(g.ReadOnly) != g.ReadOnly {
		changed = true
	}
	return changed, nil
}

// detachAll detaches every namespace (the subsystem was removed) and waits
// for their commands.
func (s *Subsystem) detachAll() {
	s.nsMu.Lock()
	old := s.table()
	s.ns.Store(&nsTable{})
	s.t.mu.Lock()
	for _, ns := range old.list {
		delete(s.t.nguids, ns.nguid)
	}
	s.t.mu.Unlock()
	s.nsMu.Unlock()
	for _, ns := range old.list {
		ns.detach()
	}
}

// nsChanged tells every live controller that a namespace changed.
func (s *Subsystem) nsChanged(nsid uint32) {
	for _, c := range s.controllers() {
		c.nsChanged(nsid)
	}
}

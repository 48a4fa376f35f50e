package target

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
)

// Target is one NVMe-oF target: its ports, its subsystems and their
// namespaces, the discovery subsystem, and every controller that hosts
// connect. It is safe for concurrent use.
type Target struct {
	cfg   Config
	clock Clock
	// authSem bounds the authentication exchanges computing at once.
	authSem chan struct{}
	start   time.Time

	pool *syncPool
	bg   sync.WaitGroup // shutdown flushes in flight

	stats counters

	// genctr is the discovery log's generation counter. It changes under
	// mu, with the state the log shows, so a log built under mu is
	// consistent with the GENCTR it carries.
	genctr atomic.Uint64

	disc *Subsystem // the discovery subsystem, never removed

	mu         sync.Mutex // guards everything below; ordered before Subsystem.mu and ctrl.mu
	closed     bool
	ports      map[uint16]Port
	subsystems map[string]*Subsystem
	nguids     map[[16]byte]string // NGUID -> "subnqn/nsid", for uniqueness
	remote     []RemoteSubsystem   // other targets' subsystems, by NQN; replaced whole (remote.go)
	cntlids    cntlidSpace
	nctrl      int // live controllers, discovery controllers included
	// ndisc counts the live discovery controllers, and discBySource
	// them by source address (an entry is deleted at zero): the
	// discovery budget (budget.go).
	ndisc        int
	discBySource map[string]int

	evMu sync.Mutex           // guards lost; taken alone
	lost map[hostKey]lostCtrl // controllers hosts lost, for reconnect events
}

// Port is a listening address the discovery log lists: the transport's
// address a host connects to. Subsystems are reachable on every port. A
// discovery controller lists the port its own connection came in on
// (matchPort), as nvmet does.
type Port struct {
	// ID is the discovery log PORTID, unique within the target.
	ID uint16
	// TrType is the transport type (nvme.TrTypeRDMA = 1, TCP = 3).
	TrType uint8
	// AdrFam is the address family (nvme.AdrFamIPv4 = 1, IPv6 = 2, IB = 3).
	AdrFam uint8
	// TrAddr is the address ("192.168.1.10"). "", "0.0.0.0" and "::"
	// match any local address: the log then reports the address the
	// discovery connection arrived on (TRADDR is never an "any" address).
	TrAddr string
	// TrSvcID is the transport service ("4420").
	TrSvcID string
	// AdvertiseAddr, if set, is the TRADDR the discovery log reports
	// instead of TrAddr: the address hosts reach the port by when it is
	// not the one it listens on (a target behind NAT, or listening on a
	// wildcard address). It must be a specific address, never an "any"
	// address. TrAddr still decides which connections came in through
	// the port.
	AdvertiseAddr string
	// AdvertiseSvcID, if set, is the TRSVCID the discovery log reports
	// instead of TrSvcID (a port forwarded under another number).
	AdvertiseSvcID string
	// TReq is the discovery log TREQ (secure channel, SQ flow control
	// disable).
	TReq uint8
	// RDMA is the RDMA TSAS, reported for an RDMA port. Zero means
	// reliable connected QPs, no provider type specified, RDMA CM.
	RDMA nvme.RDMATSAS
	// TCP is the TCP TSAS, reported for a TCP port. Zero means no
	// security (SECTYPE none).
	TCP nvme.TCPTSAS
	// DiscoveryOnly: the port serves the discovery subsystem only, as the
	// well-known discovery port (8009 for NVMe/TCP, where nvme discover
	// looks by default) does. A Connect to an NVM subsystem through it is
	// refused as an unknown subsystem (nvmet's answer for a subsystem not
	// on the port), and the discovery log lists NVM subsystems on the
	// other ports only.
	DiscoveryOnly bool
	// Limits, if set, are the port's limits (the ones its binding passes
	// in QueueParams.Limits); the discovery log reports their
	// AdminQueueEntries as ASQSZ. Nil: Config.Limits', or 32 (what a
	// Linux host uses, and nvmet reports) when Config.Limits is zero.
	// AddPort copies them.
	Limits *Limits
}

// defaultASQSZ is the discovery log ASQSZ of a port with no limits.
const defaultASQSZ = 32

// New starts a target: it validates cfg and starts the sync workers.
func New(cfg Config) (*Target, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	t := &Target{
		cfg:          cfg,
		clock:        cfg.Clock,
		ports:        make(map[uint16]Port),
		subsystems:   make(map[string]*Subsystem),
		nguids:       make(map[[16]byte]string),
		discBySource: make(map[string]int),
		authSem:      make(chan struct{}, authWorkers),
	}
	if t.clock == nil {
		t.clock = realClock{}
	}
	t.start = t.clock.Now()
	t.cntlids.lo, t.cntlids.hi = cfg.CNTLIDMin, cfg.CNTLIDMax
	t.disc = newSubsystem(t, SubsystemConfig{NQN: nvme.DiscoveryNQN, Serial: cfg.DiscoverySerial,
		Model: "blk discovery", AllowAnyHost: true}, true)
	t.pool = newSyncPool(t, cfg.SyncWorkers, cfg.SyncQueue)
	return t, nil
}

// capTimeout is CAP.TO, in 500 ms units.
const capTimeout = 15

// makeCAP is the CAP property of a controller whose admin queue came with
// limits l.
func makeCAP(l *Limits) nvme.CAP {
	return nvme.MakeCAP(nvme.CAPFields{
		// The largest I/O queue of the controller's transport port.
		MQES: uint16(l.MaxQueueEntries - 1),
		// Ready timeout 7.5 s in 500 ms units, as nvmet: RDY is set
		// synchronously on the enable edge, so any value ≥ 2 works with a
		// Linux host (it waits (TO+1)/2 whole seconds).
		TO: capTimeout,
		// NVM command set only: CSS bit 43 would make Linux hosts select
		// CC.CSS 6 and require a CSI descriptor everywhere.
		CSS: nvme.CAPCSSNVM,
	})
}

// logf writes a log line to Config.Logf, or if there is none to
// Config.Logger as a warning. Events go through events.go instead.
func (t *Target) logf(format string, args ...any) {
	if t.cfg.Logf != nil {
		t.cfg.Logf(format, args...)
	} else if t.logOn(slog.LevelWarn) {
		t.cfg.Logger.Warn(fmt.Sprintf(format, args...))
	}
}

// Config returns the target's configuration, defaults filled in, with
// the CNTLID range SetCNTLIDRange set last.
func (t *Target) Config() Config {
	c := t.cfg
	t.mu.Lock()
	c.CNTLIDMin, c.CNTLIDMax = t.cntlids.lo, t.cntlids.hi
	t.mu.Unlock()
	return c
}

// Close tears down every controller (each queue's Responder.Disconnect is
// called), waits for the sync workers to finish what they hold, and
// closes the target: NewQueue and every later Connect fail. It does not
// close the namespaces' backends, which the caller owns; once Close
// returns the core calls none of them.
func (t *Target) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	subs := append(t.sortedSubsystems(), t.disc)
	t.mu.Unlock()
	for _, s := range subs {
		for _, c := range s.controllers() {
			c.teardown(errTargetClosed)
		}
	}
	t.pool.close()
	t.bg.Wait()
	// Wait for inline commands that passed their checks before the
	// teardown: after this no backend is called.
	for _, s := range subs {
		s.detachAll()
	}
	return nil
}

// AddPort adds a port to the discovery log.
func (t *Target) AddPort(p Port) error {
	if len(p.TrAddr) >= 256 || len(p.TrSvcID) >= 32 {
		return fmt.Errorf("target: port %d: address %q service %q too long: %w", p.ID, p.TrAddr, p.TrSvcID, ErrInvalid)
	}
	if len(p.AdvertiseAddr) >= 256 || len(p.AdvertiseSvcID) >= 32 {
		return fmt.Errorf("target: port %d: advertised address %q service %q too long: %w", p.ID, p.AdvertiseAddr, p.AdvertiseSvcID, ErrInvalid)
	}
	if p.AdvertiseAddr != "" && wildcardHost(p.AdvertiseAddr) {
		return fmt.Errorf("target: port %d: advertised address %q is an \"any\" address, which no host can connect to: %w", p.ID, p.AdvertiseAddr, ErrInvalid)
	}
	if p.TCP.SecType > nvme.TCPSecTypeTLS13 {
		return fmt.Errorf("target: port %d: TCP SECTYPE %d unknown: %w", p.ID, p.TCP.SecType, ErrInvalid)
	}
	if p.Limits != nil {
		l := *p.Limits
		if err := l.Validate(); err != nil {
			return fmt.Errorf("target: port %d: %w", p.ID, err)
		}
		p.Limits = &l
	}
	if p.TrType == nvme.TrTypeRDMA && p.RDMA == (nvme.RDMATSAS{}) {
		p.RDMA = nvme.RDMATSAS{QPType: nvme.RDMAQPTypeConnected, PrType: nvme.RDMAPrTypeNotSpecified, CMS: nvme.RDMACMSRDMACM}
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	if _, ok := t.ports[p.ID]; ok {
		t.mu.Unlock()
		return fmt.Errorf("target: port %d: %w", p.ID, ErrExists)
	}
	t.ports[p.ID] = p
	t.genctr.Add(1)
	t.mu.Unlock()
	t.discoveryChanged()
	return nil
}

// RemovePort removes a port from the discovery log. Connections that came
// in through it are not affected.
func (t *Target) RemovePort(id uint16) error {
	t.mu.Lock()
	if _, ok := t.ports[id]; !ok {
		t.mu.Unlock()
		return fmt.Errorf("target: port %d: %w", id, ErrNotFound)
	}
	delete(t.ports, id)
	t.genctr.Add(1)
	t.mu.Unlock()
	t.discoveryChanged()
	return nil
}

// Ports returns the ports, by ID.
func (t *Target) Ports() []Port {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.sortedPorts()
	for i := range ps {
		if l := ps[i].Limits; l != nil {
			c := *l
			ps[i].Limits = &c
		}
	}
	return ps
}

// sortedPorts requires t.mu.
func (t *Target) sortedPorts() []Port {
	ps := make([]Port, 0, len(t.ports))
	for _, p := range t.ports {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b Port) int { return cmp.Compare(a.ID, b.ID) })
	return ps
}

// AddSubsystem creates an NVM subsystem. The NQN must be a well-formed NQN
// other than the discovery NQN, not already used. An empty Serial becomes
// 20 hex digits derived from the NQN (stable across restarts); an empty
// Model becomes "blk".
func (t *Target) AddSubsystem(c SubsystemConfig) (*Subsystem, error) {
	if err := nvme.ValidateNQN(c.NQN); err != nil || c.NQN == nvme.DiscoveryNQN {
		return nil, fmt.Errorf("target: subsystem NQN %q: %w", c.NQN, ErrInvalid)
	}
	if c.Serial == "" {
		sum := sha256.Sum256([]byte(c.NQN))
		c.Serial = hex.EncodeToString(sum[:10])
	}
	if c.Model == "" {
		c.Model = "blk"
	}
	var sn [20]byte
	var mn [40]byte
	if err := nvme.SetASCII(sn[:], c.Serial); err != nil {
		return nil, fmt.Errorf("target: subsystem %s: serial %q: %v: %w", c.NQN, c.Serial, err, ErrInvalid)
	}
	if err := nvme.SetASCII(mn[:], c.Model); err != nil {
		return nil, fmt.Errorf("target: subsystem %s: model %q: %v: %w", c.NQN, c.Model, err, ErrInvalid)
	}
	for _, h := range c.Hosts {
		if err := nvme.ValidateNQN(h); err != nil {
			return nil, fmt.Errorf("target: subsystem %s: host NQN %q: %w", c.NQN, h, ErrInvalid)
		}
	}
	if c.Admit != nil && (c.AllowAnyHost || len(c.Hosts) > 0) {
		return nil, fmt.Errorf("target: subsystem %s: Admit replaces AllowAnyHost and Hosts, set only one: %w", c.NQN, ErrInvalid)
	}
	paths, err := checkPaths(c.Paths)
	if err != nil {
		return nil, fmt.Errorf("target: subsystem %s: %w", c.NQN, err)
	}
	c.Paths = paths
	if c.ANAState != 0 && (!c.ANA || !c.ANAState.Valid()) {
		return nil, fmt.Errorf("target: subsystem %s: ANA state %#x (ANA %v): %w", c.NQN, uint8(c.ANAState), c.ANA, ErrInvalid)
	}
	s := newSubsystem(t, c, false)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	if _, ok := t.subsystems[c.NQN]; ok {
		t.mu.Unlock()
		return nil, fmt.Errorf("target: subsystem %s: %w", c.NQN, ErrExists)
	}
	t.subsystems[c.NQN] = s
	t.genctr.Add(1)
	t.mu.Unlock()
	t.discoveryChanged()
	return s, nil
}

// Subsystem returns the subsystem with that NQN.
func (t *Target) Subsystem(nqn string) (*Subsystem, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.subsystems[nqn]
	return s, ok
}

// Subsystems returns every NVM subsystem, by NQN.
func (t *Target) Subsystems() []*Subsystem {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sortedSubsystems()
}

// sortedSubsystems requires t.mu.
func (t *Target) sortedSubsystems() []*Subsystem {
	ss := make([]*Subsystem, 0, len(t.subsystems))
	for _, s := range t.subsystems {
		ss = append(ss, s)
	}
	slices.SortFunc(ss, func(a, b *Subsystem) int { return cmp.Compare(a.nqn, b.nqn) })
	return ss
}

// RemoveSubsystem removes a subsystem: its controllers are torn down (each
// queue's Responder.Disconnect is called), its namespaces detached, and
// it returns once no command is running on any of its namespaces. The
// backends are not closed: the caller owns them.
func (t *Target) RemoveSubsystem(nqn string) error {
	t.mu.Lock()
	s, ok := t.subsystems[nqn]
	if !ok {
		t.mu.Unlock()
		return fmt.Errorf("target: subsystem %s: %w", nqn, ErrNotFound)
	}
	delete(t.subsystems, nqn)
	t.genctr.Add(1)
	s.mu.Lock()
	s.removed = true
	s.mu.Unlock()
	t.mu.Unlock()
	for _, c := range s.controllers() {
		c.teardown(errSubsystemRemoved)
	}
	s.detachAll()
	t.discoveryChanged()
	return nil
}

// NewQueue creates a queue for a new connection: it accepts only a
// Connect command until one succeeds. p is what the binding learned
// before the Connect (for RDMA, from the CM private data); Connect's QID
// and SQSIZE must match it. Limits.CheckQueue lets the binding refuse
// impossible queues before accepting the connection. The queue's limits
// are p.Limits, else Config.Limits; NewQueue fails (ErrInvalid) if
// neither is set or p.Limits do not pass Limits.Validate.
func (t *Target) NewQueue(r Responder, p QueueParams) (*Queue, error) {
	if r == nil {
		return nil, fmt.Errorf("target: NewQueue with a nil Responder: %w", ErrInvalid)
	}
	lim := t.cfg.Limits // validated by New, if set
	if p.Limits != nil {
		lim = *p.Limits
		if err := lim.Validate(); err != nil {
			return nil, fmt.Errorf("target: NewQueue (QID %d): %w", p.QID, err)
		}
	} else if lim == (Limits{}) {
		return nil, fmt.Errorf("target: NewQueue (QID %d): no Limits in QueueParams and none in Config: %w", p.QID, ErrInvalid)
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	q := newQueue(t, r, p, lim)
	q.armConnectTimer()
	return q, nil
}

// lookupSubsystem finds the subsystem a Connect names, the discovery
// subsystem included. It does not allocate.
func (t *Target) lookupSubsystem(nqn []byte) *Subsystem {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	if string(nqn) == nvme.DiscoveryNQN {
		return t.disc
	}
	return t.subsystems[string(nqn)]
}

func (t *Target) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// cntlidSpace hands out controller IDs lo..hi (Config.CNTLIDMin and
// CNTLIDMax), next-fit, so that a just-freed ID is the last to be reused
// (a host that still holds it for a dead association does not meet it on
// a new one at once).
type cntlidSpace struct {
	used   [(int(nvme.CNTLIDMax) + 64) / 64]uint64
	next   uint16
	lo, hi uint16
}

// alloc returns a free ID, or false if all of lo..hi are taken.
func (s *cntlidSpace) alloc() (uint16, bool) {
	if s.next < s.lo || s.next > s.hi {
		s.next = s.lo
	}
	id := s.next
	for range int(s.hi-s.lo) + 1 {
		if s.used[id/64]&(1<<(id%64)) == 0 {
			s.used[id/64] |= 1 << (id % 64)
			s.next = id + 1
			return id, true
		}
		id++
		if id > s.hi {
			id = s.lo
		}
	}
	return 0, false
}

// free releases an ID. With rollback (the ID was never shown to a host:
// its Connect failed) the next-fit cursor moves back to it, so refused
// Connects do not use up fresh IDs.
func (s *cntlidSpace) free(id uint16, rollback bool) {
	s.used[id/64] &^= 1 << (id % 64)
	if rollback && s.next == id+1 {
		s.next = id
	}
}

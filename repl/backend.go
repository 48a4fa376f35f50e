package repl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// Leg is one remote replica's namespace, as the primary writes it;
// *initiator.Namespace satisfies it. Its methods must not block: they
// submit one command and return (an error means it was not submitted),
// and call the callback once per command that was, from any goroutine,
// after the command's slot is free again. An error matching
// initiator.ErrQueueFull means every slot is busy: the leg waits for
// one (the peer's backlog); any other error fails the leg.
type Leg interface {
	WriteAsync(lba uint64, buf []byte, flags initiator.IOFlags, cb initiator.Callback) error
	WriteZeroesAsync(lba uint64, blocks uint32, cb initiator.Callback) error
	DeallocateAsync(ranges []initiator.Range, cb initiator.Callback) error
	FlushAsync(cb initiator.Callback) error
}

// Peer is one other replica of the volume that takes every write.
type Peer struct {
	Node string // the replica's node ID, as the registry names it
	NS   Leg
	// MaxTransfer is the leg's largest write command in bytes
	// (initiator.Info.MaxTransfer of its controller; 0:
	// initiator.DefaultMaxTransfer): a larger host write is sent as
	// several commands.
	MaxTransfer int
}

// Reporter tells the registry that a replica missed a write. It returns
// once the registry committed that replica out of sync (nil), or an
// error: no quorum, a stale epoch (this primary is deposed). It is
// called on a goroutine of its own, never on the data path, at most once
// per replica per epoch; its context ends at Config.HoldTimeout.
type Reporter interface {
	ReplicaFailed(ctx context.Context, node string, epoch uint64, reason string) error
}

// MaxPeers is the most remote replicas one Backend writes to: a record
// holds a callback for each (a replication factor up to 5).
const MaxPeers = 4

// Defaults of Config.
const (
	// DefaultHoldTimeout: a write a replica missed waits at most 4 s for
	// the registry (docs/replication.md §2, "Bounded wait"): with the
	// leg's own 2 s I/O timeout, 6 s after submission, well inside the
	// host's 30 s nvme_core.io_timeout.
	DefaultHoldTimeout = 4 * time.Second
	// DefaultDepth: 1024 records, the host I/Os the backend carries at
	// once (8 queues at QD 128); more allocate (Stats.Overflows).
	DefaultDepth = 1024
	// maxDepth bounds Config.Depth: records are ~1 KiB each.
	maxDepth = 1 << 20
)

// Per command limits of a leg (initiator/commands.go): Write Zeroes
// takes 16-bit block counts, a Deallocate range 32-bit ones.
const (
	maxLegZeroes     = 1 << 16
	maxLegDeallocate = 1<<32 - 1
)

// Config configures a Backend.
type Config struct {
	// Local is the primary's own replica (target.StoreIO.Backend); it
	// serves every read. Required.
	Local target.AsyncBackend
	// Reporter takes the report of a replica that missed a write.
	// Required.
	Reporter Reporter
	// Epoch is the volume's epoch the backend starts at (SetPeers may
	// only raise it).
	Epoch uint64
	// HoldTimeout bounds how long a write a replica missed waits for the
	// Reporter (DefaultHoldTimeout); it then fails with the inaccessible
	// path status and the backend stops serving.
	HoldTimeout time.Duration
	// Depth is the records preallocated: the host I/Os the backend
	// carries at once, the sum of the queue depths of the namespace's
	// queues (DefaultDepth). Beyond it each write allocates a record
	// (counted in Stats.Overflows): slower, never refused or blocked.
	Depth int
	// Logger receives the leg failures and the reports (none: discarded).
	Logger *slog.Logger
	// LocalFailed, if set, is told (on a goroutine of its own, once until
	// SetServing(true)) that the local replica failed a write or a
	// flush: the backend stopped serving and the volume needs a
	// failover.
	LocalFailed func(err error)
	// DirtyRegion is the dirty-region log's region in bytes
	// (DefaultDirtyRegion, 64 KiB; drl.go says why), a power of two; a
	// volume too large for a 2 MiB bitmap gets larger regions.
	DirtyRegion int
}

// Validate checks the configuration after defaults.
func (c *Config) Validate() error {
	switch {
	case c.Local == nil:
		return fmt.Errorf("%w: no local backend", ErrInvalid)
	case c.Reporter == nil:
		return fmt.Errorf("%w: no reporter", ErrInvalid)
	case c.HoldTimeout < 0:
		return fmt.Errorf("%w: hold timeout %v", ErrInvalid, c.HoldTimeout)
	case c.Depth < 0 || c.Depth > maxDepth:
		return fmt.Errorf("%w: depth %d outside 1..%d", ErrInvalid, c.Depth, maxDepth)
	case c.DirtyRegion <= 0 || c.DirtyRegion&(c.DirtyRegion-1) != 0:
		return fmt.Errorf("%w: dirty region %d bytes is not a power of two", ErrInvalid, c.DirtyRegion)
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.HoldTimeout == 0 {
		c.HoldTimeout = DefaultHoldTimeout
	}
	if c.Depth == 0 {
		c.Depth = DefaultDepth
	}
	if c.DirtyRegion == 0 {
		c.DirtyRegion = DefaultDirtyRegion
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

var (
	// ErrInvalid: a configuration or peer set that cannot work.
	ErrInvalid = errors.New("repl: invalid configuration")
	// ErrStaleEpoch: SetPeers with an epoch below the backend's.
	ErrStaleEpoch = errors.New("repl: stale epoch")
	// ErrNotServing: the backend does not serve (SetServing(false), a
	// failed local replica, a report the registry refused).
	ErrNotServing = errors.New("repl: not serving: deposed or unconfirmed primary")
	// ErrUnconfirmed: a replica missed the write and the registry did not
	// confirm it out of sync (an error, or HoldTimeout).
	ErrUnconfirmed = errors.New("repl: a replica missed the write and the registry did not confirm it out of sync")
	// ErrHoldTimeout: the Reporter did not answer within HoldTimeout.
	ErrHoldTimeout = errors.New("repl: registry did not answer in time")
)

// The host's statuses, made once: a path error without DNR, which Linux
// multipath requeues on another path (nvme_failover_req).
var (
	errNotServing  = target.WithStatus(ErrNotServing, nvme.StatusANAInaccessible)
	errUnconfirmed = target.WithStatus(ErrUnconfirmed, nvme.StatusANAInaccessible)
)

// Backend is a volume's namespace on its primary: reads from the local
// replica, every write, write zeroes, deallocate and flush on the local
// replica and every in-sync remote one (see doc.go).
type Backend struct {
	local       target.AsyncBackend
	rep         Reporter
	hold        time.Duration
	log         *slog.Logger
	localFailed func(error)
	shift       uint // log2 of the block size

	set       atomic.Pointer[legSet]
	serving   atomic.Bool
	readable  atomic.Bool // reads served while not serving (SetReadOnly)
	localOnce atomic.Bool // LocalFailed told since the last SetServing(true)

	recs []record
	free freeList
	t0   time.Time     // now's origin
	tick time.Duration // the backlog timer's period (backlogTick)

	overflows, localFailures atomic.Uint64
	// over holds the overflow records in use (allocated beyond Depth), so
	// that a rebuild's copier waits for them too (Rebuild.quiesce).
	overMu sync.Mutex
	over   map[*record]struct{}

	mu sync.Mutex // SetPeers, StartRebuild
	rb *Rebuild   // the rebuild running (one at a time), under mu

	// The dirty-region logs of the replicas that left (drl.go): drls is
	// read per write, changed under drlMu (a failure path). blocks is the
	// volume's size a new log covers (New, Geometry).
	dirtyRegion int
	drls        atomic.Pointer[dirtySet]
	drlMu       sync.Mutex
	blocks      atomic.Uint64

	// The barrier (barrier.go): gated is loaded by every write; held is
	// the FIFO of the IOs it holds, made at New with Depth entries, under
	// gateMu; barrier is the slot of the one barrier running.
	gated                            atomic.Bool
	gateMu                           sync.Mutex
	held                             []*target.IO
	barrier                          chan struct{}
	barriers, heldIOs, heldOverflows atomic.Uint64
	// heldRange is the range a HoldRange holds the writes of
	// (holdrange.go), nil when none runs; stored under gateMu, loaded by
	// every write.
	heldRange  atomic.Pointer[blockRange]
	rangeHolds atomic.Uint64
}

var _ target.AsyncBackend = (*Backend)(nil)
var _ target.GeometryTrier = (*Backend)(nil)

// legSet is one epoch's peers, in the order of SetPeers; never changed
// once stored (a failed peer changes its own state).
type legSet struct {
	epoch uint64
	peers []*peer
}

// New makes a Backend over cfg.Local with no peers, serving.
func New(cfg Config) (*Backend, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g, err := cfg.Local.Geometry()
	if err != nil {
		return nil, fmt.Errorf("repl: local geometry: %w", err)
	}
	if g.BlockSize < 512 || g.BlockSize&(g.BlockSize-1) != 0 {
		return nil, fmt.Errorf("%w: local block size %d", ErrInvalid, g.BlockSize)
	}
	b := &Backend{local: cfg.Local, rep: cfg.Reporter, hold: cfg.HoldTimeout, log: cfg.Logger, localFailed: cfg.LocalFailed,
		dirtyRegion: cfg.DirtyRegion}
	for g.BlockSize>>b.shift != 1 {
		b.shift++
	}
	b.blocks.Store(g.Blocks)
	b.t0 = time.Now()
	b.tick = min(backlogTick, max(cfg.HoldTimeout/4, time.Millisecond))
	b.set.Store(&legSet{epoch: cfg.Epoch})
	b.serving.Store(true)
	b.over = make(map[*record]struct{})
	b.held = make([]*target.IO, 0, cfg.Depth)
	b.barrier = make(chan struct{}, 1)
	b.recs = make([]record, cfg.Depth)
	for i := range b.recs {
		r := &b.recs[i]
		r.init(b)
		r.idx = uint32(i)
		r.pooled = true
		b.put(r)
	}
	return b, nil
}

// SetPeers replaces the set of remote replicas writes go to, at epoch (≥
// the backend's; a higher one starts a new epoch): the lead's reconcile
// gives the in-sync replicas other than this node. Writes submitted after
// it returns use the new set; those in flight finish on the one they
// started with. An empty set makes the backend its local one (plus an
// atomic load or two per I/O).
//
// A peer that missed a write stays out of the set for the rest of its
// epoch whatever SetPeers says (it is out of sync, or about to be); a
// peer listed again at the same epoch with the same Leg keeps its state
// and counters.
func (b *Backend) SetPeers(epoch uint64, peers []Peer) error {
	if len(peers) > MaxPeers {
		return fmt.Errorf("%w: %d peers, at most %d", ErrInvalid, len(peers), MaxPeers)
	}
	for i, p := range peers {
		switch {
		case p.Node == "":
			return fmt.Errorf("%w: peer %d has no node", ErrInvalid, i)
		case p.NS == nil:
			return fmt.Errorf("%w: peer %s has no namespace", ErrInvalid, p.Node)
		case p.MaxTransfer < 0 || p.MaxTransfer > 0 && (p.MaxTransfer>>b.shift == 0 || p.MaxTransfer&(1<<b.shift-1) != 0):
			return fmt.Errorf("%w: peer %s: max transfer %d is not a multiple of the block size %d", ErrInvalid, p.Node, p.MaxTransfer, 1<<b.shift)
		}
		for _, q := range peers[:i] {
			if q.Node == p.Node {
				return fmt.Errorf("%w: peer %s listed twice", ErrInvalid, p.Node)
			}
		}
	}
	b.mu.Lock()
	old := b.set.Load()
	if epoch < old.epoch {
		b.mu.Unlock()
		return fmt.Errorf("%w: peers for epoch %d, backend at %d", ErrStaleEpoch, epoch, old.epoch)
	}
	s := &legSet{epoch: epoch, peers: make([]*peer, len(peers))}
	for i, p := range peers {
		if epoch == old.epoch {
			if o := old.find(p.Node); o != nil && (o.state.Load() != peerInSync || sameLeg(o.ns, p.NS)) {
				s.peers[i] = o
				continue
			}
		}
		xfer := p.MaxTransfer
		if xfer == 0 {
			xfer = initiator.DefaultMaxTransfer
		}
		s.peers[i] = newPeer(b, p.Node, p.NS, epoch, uint64(xfer)>>b.shift)
	}
	// A replica being rebuilt (StartRebuild) stays at its epoch whether
	// listed or not: the registry lists it once the rebuild committed it
	// in sync. A new epoch ends the rebuild (its copier sees its peer
	// gone).
	var ended *Rebuild
	if rb := b.rb; rb != nil {
		if epoch != old.epoch {
			ended = rb
		} else if st := rb.p.state.Load(); (st == peerRebuilding || st == peerPromoting) && s.find(rb.p.node) == nil {
			if len(s.peers) == MaxPeers {
				b.mu.Unlock()
				return fmt.Errorf("%w: %d peers and a rebuilding one, at most %d", ErrInvalid, len(peers), MaxPeers)
			}
			s.peers = append(s.peers, rb.p)
		}
	}
	b.set.Store(s)
	if epoch != old.epoch {
		// Another primary may have written at the epochs between: no log
		// of this one says what a replica lacks now. After the store: a
		// peer of the old epoch failing from now on makes no log
		// (keepDirty), one that made it before is dropped here.
		b.drlMu.Lock()
		b.drls.Store(nil)
		b.drlMu.Unlock()
	}
	b.mu.Unlock()
	if ended != nil {
		ended.fail(fmt.Errorf("%w: epoch %d replaced by %d", ErrStaleEpoch, old.epoch, epoch))
	}
	// Legs parked on a peer the new set dropped still finish on it (their
	// writes started with the old set); a kick makes sure none waits for
	// a completion that is not coming.
	for _, p := range old.peers {
		p.kick()
	}
	return nil
}

func (s *legSet) find(node string) *peer {
	for _, p := range s.peers {
		if p.node == node {
			return p
		}
	}
	return nil
}

// sameLeg reports whether a and b are the same namespace (comparable and
// equal: a pointer, normally).
func sameLeg(a, b Leg) bool {
	t := reflect.TypeOf(a)
	return t == reflect.TypeOf(b) && t.Comparable() && a == b
}

// SetServing turns the backend on or off: off, every I/O completes with
// the path status Asymmetric Access Inaccessible (no DNR: a multipath
// host retries it on another path) before it reaches any replica. The
// backend turns itself off when its local replica fails or the registry
// does not confirm a replica out of sync; the lead turns it on again
// once the registry shows this node primary (with a new SetPeers).
func (b *Backend) SetServing(ok bool) {
	if ok {
		b.localOnce.Store(false)
	}
	b.serving.Store(ok)
	if !ok {
		b.failHeld()
	}
	for _, p := range b.set.Load().peers {
		p.kick() // nothing parked waits on a change
	}
}

// Serving reports whether the backend serves I/O.
func (b *Backend) Serving() bool { return b.serving.Load() }

// SetReadOnly serves reads from the local replica while the backend does
// not serve (SetServing(false)); other I/O still gets the path status.
// For a primary that holds the registry's current epoch and is still
// connecting its replicas: its local copy is in sync, so reads are
// right, while writes cannot be replicated yet. The backend clears it
// whenever it stops serving by itself (a local failure, a loss the
// registry did not confirm: this primary may be deposed).
func (b *Backend) SetReadOnly(ok bool) { b.readable.Store(ok) }

// stop turns the backend off by itself: no I/O at all, reads included.
func (b *Backend) stop() {
	b.readable.Store(false)
	b.serving.Store(false)
	b.failHeld()
}

// Geometry is the local replica's (its size is what a new dirty-region
// log covers).
func (b *Backend) Geometry() (target.Geometry, error) {
	g, err := b.local.Geometry()
	if err == nil {
		b.blocks.Store(g.Blocks)
	}
	return g, err
}

// TryGeometry is the local replica's, without waiting when it can tell
// (target.GeometryTrier).
func (b *Backend) TryGeometry() (target.Geometry, bool, error) {
	if t, ok := b.local.(target.GeometryTrier); ok {
		g, ok, err := t.TryGeometry()
		if ok && err == nil {
			b.blocks.Store(g.Blocks)
		}
		return g, ok, err
	}
	g, err := b.Geometry()
	return g, true, err
}

// Blocking is the local replica's: the remote legs never block a submit.
func (b *Backend) Blocking() bool { return b.local.Blocking() }

// NewWriteGroup is nil: every write goes through Submit and its legs.
func (b *Backend) NewWriteGroup() target.WriteGroup { return nil }

// Submit implements target.AsyncBackend: reads (and anything with no
// remote leg) go to the local replica alone; writes, write zeroes,
// deallocates and flushes take a record and fan out, or wait for a
// barrier's release (barrier.go).
func (b *Backend) Submit(io *target.IO) { b.submit(io, io) }

// submit is Submit with the IO whose poll group the local leg uses
// (IO.Inherit): io itself, or offGroup for an IO a barrier releases off
// its group.
func (b *Backend) submit(io, parent *target.IO) {
	if !b.serving.Load() {
		if io.Op == target.OpRead && b.readable.Load() {
			b.local.Submit(io)
			return
		}
		io.Done(errNotServing)
		return
	}
	switch io.Op {
	case target.OpWrite, target.OpWriteZeroes, target.OpDeallocate, target.OpFlush:
	default:
		b.local.Submit(io) // reads never leave the primary
		return
	}
	// The record before the leg set, also with no peer: a rebuild's
	// copier, once it has stored a set with the rebuilding replica, waits
	// for every record in use (Rebuild.quiesce); a write that loaded an
	// older set (without that replica) is then in use already, so the
	// copier waits for it to land before it reads what it wrote.
	r := b.get()
	// The gate after the record: a barrier stores the gate (a range hold
	// its range), then waits for every record in use (barrier.go,
	// holdrange.go).
	if (b.gated.Load() || b.heldRange.Load() != nil) && b.holdIO(io, r) {
		return
	}
	r.drls = b.drls.Load() // the logs before the legs: see drl.go
	r.start(io, b.set.Load(), parent)
}

// now is the backend's monotonic clock in nanoseconds (backlog ages).
func (b *Backend) now() int64 { return int64(time.Since(b.t0)) }

// localFailure stops serving after the local replica failed a write or
// a flush: its copy may now lack what the others hold.
func (b *Backend) localFailure(err error) {
	b.localFailures.Add(1)
	b.stop()
	if b.localOnce.CompareAndSwap(false, true) {
		b.log.Error("local replica failed a write: not serving", "error", err)
		if fn := b.localFailed; fn != nil {
			go fn(err)
		}
	}
}

// Stats are the backend's counters.
type Stats struct {
	Epoch         uint64
	Serving       bool
	Overflows     uint64 // records allocated beyond Depth
	LocalFailures uint64 // writes and flushes the local replica failed
	Peers         []PeerStats
	// Dirty: the dirty-region logs the backend keeps, one per replica
	// that left at this epoch and has not been rebuilt since.
	Dirty []DirtyStats
	// Barriers taken (Barrier), the host I/Os they and the range holds held,
	// and those held beyond Depth (the FIFO grew).
	Barriers, HeldIOs, HeldOverflows uint64
	// RangeHolds taken (HoldRange: a region hashed at one instant on
	// every copy).
	RangeHolds uint64
}

// DirtyStats is one replica's dirty-region log.
type DirtyStats struct {
	Node  string
	Bytes uint64 // the size of its dirty regions
	// Lost: a write fell outside the log (the volume grew): the next
	// rebuild is a full copy.
	Lost bool
}

// PeerStats count one peer's legs.
type PeerStats struct {
	Node     string
	State    string // in-sync, failing (reported, unconfirmed), out-of-sync (confirmed), unconfirmed (the report failed)
	Writes   uint64 // writes, write zeroes, deallocates and flushes sent
	Failures uint64 // of those, failed
	Held     uint64 // host I/Os held waiting for its report
	// Backlogged: legs that found the connection's every slot busy (or
	// others waiting) and waited in its backlog for a slot.
	Backlogged uint64
	Queued     int // legs waiting in the backlog now
	// RebuildDone and RebuildTotal: a peer added by StartRebuild, the
	// bytes its copier has passed (copied, or a hole deallocated) and
	// those it has to pass (the volume's size for a full copy, its dirty
	// regions' for an incremental one: Rebuild.Progress).
	RebuildDone, RebuildTotal uint64
	// RebuildCopied: the bytes its copier wrote (Rebuild.Copied);
	// RebuildMode "full" or "incremental" (Rebuild.Mode).
	RebuildCopied uint64
	RebuildMode   string
}

// Stats returns the counters of the backend and of its current peers.
func (b *Backend) Stats() Stats {
	s := b.set.Load()
	st := Stats{Epoch: s.epoch, Serving: b.serving.Load(), Overflows: b.overflows.Load(), LocalFailures: b.localFailures.Load(),
		Barriers: b.barriers.Load(), HeldIOs: b.heldIOs.Load(), HeldOverflows: b.heldOverflows.Load(),
		RangeHolds: b.rangeHolds.Load()}
	for _, p := range s.peers {
		st.Peers = append(st.Peers, PeerStats{Node: p.node, State: peerStateNames[p.state.Load()],
			Writes: p.writes.Load(), Failures: p.failures.Load(), Held: p.held.Load(),
			Backlogged: p.backlogged.Load(), Queued: int(p.queued.Load())})
		if p.rb != nil {
			ps := &st.Peers[len(st.Peers)-1]
			ps.RebuildDone, ps.RebuildTotal = p.rb.Progress()
			ps.RebuildCopied, ps.RebuildMode = p.rb.Copied(), p.rb.Mode()
		}
	}
	if ds := b.drls.Load(); ds != nil {
		blocks := b.blocks.Load()
		for _, d := range ds.logs {
			st.Dirty = append(st.Dirty, DirtyStats{Node: d.node, Bytes: d.bytes(blocks, b.shift), Lost: d.lost.Load()})
		}
	}
	return st
}

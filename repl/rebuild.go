package repl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/target"
)

// A full-copy rebuild (docs/replication.md §5): StartRebuild adds an
// out-of-sync replica to the leg set as rebuilding, so every host write,
// write zeroes, deallocate and flush from then on goes to it too, and a
// copier goroutine walks the whole LBA space of the local replica in
// order: every allocated run is read locally and written to the replica,
// every hole deallocated there (it reads as zeros, as on the primary).
// Then a Flush on the replica, then Promote (the lead commits the replica
// in sync), then the peer counts as in sync.
//
// The race between the copier and the host's writes. The copier works in
// windows [lo, hi) (a region of at most RegionBytes of a mapped run, or
// one hole), and keeps several in flight, in LBA order (up to copyDepth
// windows and copyBytes of data): it reads the next window's local data
// while the replica receives the writes of the ones before it. The windows in flight are published
// together in Rebuild.win (one immutable set, stored again whenever one
// starts or lands). For each window W:
//
//  1. Start: once fewer than copyDepth windows are in flight (else the
//     oldest lands first, step 5), publish the set with W in it.
//  2. Quiesce: wait for every record in use (a host write between get
//     and complete: record.uses odd) to complete, except those holding
//     their leg on a window (3).
//  3. A host write whose rebuilding leg overlaps a window of the
//     published set does not send that leg: it is held (Rebuild.hold;
//     record.deferredOn set) while it overlaps any window of the set (the
//     record stays pending; its local leg and in-sync legs go out as
//     usual).
//  4. Look at the local map of W again, read the local data of its
//     mapped runs (older windows land first while the bytes in flight
//     would exceed copyBytes), send them to the replica, send a
//     deallocate for the rest; the copier goes on to the next window
//     without waiting.
//  5. Land, oldest window first: wait until every command of W
//     completed, then publish the set without W and send the held legs
//     that now overlap no window of the set (deferredOn cleared first).
//
// Why no copy carries bytes older than a host write that reached the
// replica first. Take a host write H overlapping window W, and C, W's
// copy. H takes its record (uses odd, an atomic add), then loads the
// leg set and, for the rebuilding peer, the window set; the copier
// stores the leg set (StartRebuild) and a window set holding W, then
// loads each record's uses. Go's atomics are sequentially consistent,
// so either H saw a set holding W, or the copier saw H's record in use.
// In the first case H is held (step 3: a hold that finds the set
// replaced meanwhile looks at the new one, under the mutex that
// publishing takes), and stays held while W is in the set, that is
// until C completed on the replica: the replica ends with H's bytes,
// and whatever C read locally is H's or older ones H overwrites on
// both. In the second case the copier waited (step 2) until H completed
// on every leg, the local one and this replica's included, before it
// read: C then carries H's bytes or a later write's, never older ones;
// unless H was held at the time on other windows, and then it overlaps
// W while W is in the set, so it is held until C landed, as in the
// first case. A write that loaded a leg set without the rebuilding
// replica (before StartRebuild) is in the second case too: it took its
// record before it loaded the set. Writes outside every window go to
// the replica as they come: a region copied stays current, one not
// copied yet is copied later with them in it. A hole seen in step 4
// after the quiesce has no write in flight but held ones, which land
// after the Deallocate. Nothing in this argument needs the windows to
// land in order or the replica to apply commands in order: only that a
// held leg goes after C's completion.
//
// Why the copier cannot wait for itself: a held record is skipped by
// every quiesce, and a record in use that is not held waits for
// nothing the copier does (its commands complete on the connection's
// goroutines into r.cbs, which has room for every command the copier
// may have out).
//
// An incremental rebuild (RebuildConfig.UseDirtyLog, with a dirty-region
// log of the replica: drl.go) takes the same windows over the dirty
// regions only, in LBA order (runs of consecutive dirty regions, each
// window at most RegionBytes but at least one region), and clears a
// window's regions in the log once its copy is on the replica, before
// the window's held legs go (step 5); a copy that failed still clears
// the oldest windows whose every command completed without error
// (salvage). A window's regions are marked again right after the clear
// if the replica is no longer rebuilding then: a write that skipped it
// once a failure dropped it marks when it finishes, perhaps before the
// clear; seen rebuilding after the clear, the replica left after it, and
// every such mark comes later. Before its first look at the log it waits
// for every record in use: a write that loaded a leg set without the
// replica marks the log when it finishes, and could otherwise mark a
// region behind the copier. From then on every write goes to the
// replica: one that does not land there (its leg failed, or a failed
// rebuild never sent it) marks the log again, after the clearing of its
// window (a held leg goes after it); the rebuild has failed then, and
// the next one copies what is marked. So a region not marked is on the
// replica, the window argument above making sure no copy is older than
// a write it overtook.
//
// Only one rebuild runs per Backend: with two, a write held on one's
// window would be waited for by the other's quiesce and the reverse.
// Holes: the copier deallocates each hole on the replica (one command per
// hole, whatever its size) rather than the whole namespace first, which
// would race the host writes already going to it.

// Defaults of RebuildConfig.
const (
	// DefaultRegionBytes: 1 MiB windows (16 clusters of 64 KiB): host
	// writes to the window wait for one region's copy at most.
	DefaultRegionBytes = 1 << 20
	maxRegionBytes     = 64 << 20
	// maxCopyCommands bounds the commands in flight of one window (its
	// region at the leg's largest transfer).
	maxCopyCommands = 64
	// copyDepth bounds the windows in flight, copyBytes the bytes they
	// write: the copier reads the next window while the others are on
	// the wire (see the top of the file). copyBytes sets both the rate
	// and how long a host write into the newest window waits (the bytes
	// in flight before it at the copy's rate: about 10 ms at 400 MB/s);
	// copyDepth lets small windows (an incremental copy's, of a few
	// dirty regions) fill it. Measured in docs/replication.md §5. The
	// copier reads into one buffer of a region: the leg copies it before
	// WriteAsync returns (initiator.Namespace.WriteAsync).
	copyDepth = 16
	copyBytes = 4 << 20
	// copyReaders, copyReadPart: a window's local read goes as up to
	// copyReaders reads at once of at least copyReadPart bytes.
	copyReaders  = 4
	copyReadPart = 128 << 10
)

// copyBudget is copyBytes, a variable so that tests can make the copier
// wait for its budget often.
var copyBudget = copyBytes

var (
	// ErrRebuildBusy: StartRebuild while another rebuild of the backend
	// runs, or a barrier (Barrier).
	ErrRebuildBusy = errors.New("repl: a rebuild is running")
	// ErrRebuildLeg: the rebuilding replica failed a command.
	ErrRebuildLeg = errors.New("repl: rebuilding replica failed")
	// ErrRebuildCancelled: Cancel, or the backend dropped the peer.
	ErrRebuildCancelled = errors.New("repl: rebuild cancelled")
)

// RebuildConfig describes one full copy to a replica.
type RebuildConfig struct {
	Node string // the replica's node ID
	NS   Leg    // its namespace (a connection of the primary at the current epoch)
	// MaxTransfer: the leg's largest write in bytes (0:
	// initiator.DefaultMaxTransfer).
	MaxTransfer int
	// Mapped walks the local replica's allocated runs in LBA order
	// ((*store.Volume).Mapped); a run mapped or freed meanwhile may or
	// may not be seen. Required.
	Mapped func(from, to uint64, fn func(lba, blocks uint64) error) error
	// Read reads the local replica (store.Volume.Read); it may block,
	// and is called from up to copyReaders goroutines at once (parts of
	// one window), so it must be safe for concurrent use. Required.
	Read func(lba uint64, buf []byte) error
	// RegionBytes is the window's size (DefaultRegionBytes), a multiple
	// of the block size.
	RegionBytes int
	// Rate bounds the bytes copied per second (0: unlimited); holes cost
	// nothing. Ignored with a Limiter.
	Rate int64
	// Limiter, if set, is shared with other rebuilds (a node's rate).
	Limiter *Limiter
	// MappedOwn, if set, makes a full copy (no dirty-region log, no
	// RemoteDigests) copy only what the local replica owns on top of its
	// parent snapshot ((*store.Volume).MappedOwn): runs of own clusters
	// (zero false) are copied, own tombstones (zero true) deallocated,
	// and every other region (read through the parent, or a hole there
	// too) is left as the replica has it. The caller guarantees that the
	// replica's copy reads what the local parent reads
	// (docs/snapshots.md §4.3: the replica was brought to its own copy
	// of that snapshot), and fails the walk if the local parent changes.
	// Nil: the whole volume is copied, holes deallocated.
	MappedOwn func(from, to uint64, fn func(lba, blocks uint64, zero bool) error) error
	// UseDirtyLog copies only the regions the backend's dirty-region log
	// of Node marks, if it keeps a usable one (Backend.DirtyBytes; see
	// Rebuild.Incremental), and a full copy otherwise. The lead leaves it
	// false when the registry says the replica lost its data
	// (meta.Replica.Full): the log only knows what it missed while this
	// backend wrote.
	UseDirtyLog bool
	// RemoteDigests, if set, makes a rebuild that has no dirty-region
	// log to copy from a compare (resync.go): only the regions whose
	// digests differ from the replica's are copied. Nil: a full copy.
	RemoteDigests RemoteDigestsFunc
	// Promote asks the registry to count the replica in sync at the
	// backend's epoch, once every byte is on it and flushed: only after
	// it returned nil do the replica's failures hold host writes. It may
	// take long; its context ends with Cancel. Required.
	Promote func(ctx context.Context) error
	Logger  *slog.Logger
}

// Rebuild is one running copy (StartRebuild): full, or incremental.
type Rebuild struct {
	b      *Backend
	p      *peer
	cfg    RebuildConfig
	drl    *dirtyLog // the log copied from (incremental), or nil (full)
	blocks uint64    // the volume's, at the start
	region uint64    // blocks per window
	xfer   uint64    // blocks per write command

	win     atomic.Pointer[window]
	mu      sync.Mutex // held: the legs waiting for the window, and the window's clearing
	held    *leg
	heldN   int
	holds   int // legs held so far (tests)
	ctx     context.Context
	cancel  context.CancelFunc
	errOnce sync.Once
	cause   error // the first failure (fail), before ctx ends

	done, copied atomic.Uint64 // bytes passed, bytes written
	differ       atomic.Uint64 // a compare's: bytes of the regions found to differ
	total        atomic.Uint64 // bytes to pass: the volume's, or its dirty regions'
	fin          chan struct{}
	err          error // set before fin closes

	// The copier's, read and written by its goroutine only: the windows
	// in flight, oldest first (slots[head], n of them), their commands
	// not yet completed (out), whose results come on cbs.
	slots   [copyDepth]copySlot
	head, n int
	peak    int // the most windows in flight so far (tests)
	out     int
	cbs     chan copyDone
	bytes   int    // written by the windows in flight, at most copyBudget but for the newest
	buf     []byte // the local reads', a region
	runs    [][2]uint64
	zeros   []bool // runs[i] is an own tombstone (a MappedOwn copy)
	own     bool   // a full copy through cfg.MappedOwn
}

// window is the copier's windows in flight, published to host writes:
// rs[:n], each [lo, hi) in blocks; immutable once stored.
type window struct {
	n  int
	rs [copyDepth][2]uint64
}

// overlaps reports whether [lo, hi) overlaps one of w's windows.
func (w *window) overlaps(lo, hi uint64) bool {
	for _, x := range w.rs[:w.n] {
		if lo < x[1] && hi > x[0] {
			return true
		}
	}
	return false
}

// copySlot is one window in flight: its range, its bytes, its commands
// not yet completed.
type copySlot struct {
	lo, hi   uint64
	progress uint64 // bytes Progress counts once it landed
	copied   uint64 // bytes written by its commands
	cmds     int
	sent     bool // every command of the window was sent
	failed   bool // one of them failed
	cb       slotCB
}

// slotCB is the initiator.Callback of a slot's commands.
type slotCB struct {
	ch   chan<- copyDone
	slot int
}

// copyDone is one completion of the copier's commands.
type copyDone struct {
	slot int
	err  error
}

func (c *slotCB) IODone(err error) { c.ch <- copyDone{slot: c.slot, err: err} }

// StartRebuild adds cfg.Node as a rebuilding peer at epoch (the
// backend's: the lead has committed the replica rebuilding at it) and
// starts copying. Host writes go to the replica from now on; its
// failures end the rebuild and hold no write. The returned Rebuild ends
// (Done) once the replica is in sync (Err nil) or the rebuild failed.
func (b *Backend) StartRebuild(epoch uint64, cfg RebuildConfig) (*Rebuild, error) {
	switch {
	case cfg.Node == "":
		return nil, fmt.Errorf("%w: rebuild of no node", ErrInvalid)
	case cfg.NS == nil:
		return nil, fmt.Errorf("%w: rebuild of %s: no namespace", ErrInvalid, cfg.Node)
	case cfg.Mapped == nil || cfg.Read == nil || cfg.Promote == nil:
		return nil, fmt.Errorf("%w: rebuild of %s: Mapped, Read and Promote are required", ErrInvalid, cfg.Node)
	case cfg.Rate < 0:
		return nil, fmt.Errorf("%w: rebuild rate %d", ErrInvalid, cfg.Rate)
	}
	if cfg.Limiter == nil && cfg.Rate > 0 {
		cfg.Limiter = NewLimiter(cfg.Rate)
	}
	bs := 1 << b.shift
	if cfg.RegionBytes == 0 {
		cfg.RegionBytes = DefaultRegionBytes
	}
	if cfg.RegionBytes < bs || cfg.RegionBytes > maxRegionBytes || cfg.RegionBytes%bs != 0 {
		return nil, fmt.Errorf("%w: rebuild region %d bytes (block %d, at most %d)", ErrInvalid, cfg.RegionBytes, bs, maxRegionBytes)
	}
	xfer := cfg.MaxTransfer
	if xfer == 0 {
		xfer = initiator.DefaultMaxTransfer
	}
	if xfer < bs || xfer%bs != 0 {
		return nil, fmt.Errorf("%w: rebuild of %s: max transfer %d is not a multiple of the block size %d", ErrInvalid, cfg.Node, xfer, bs)
	}
	if cfg.Logger == nil {
		cfg.Logger = b.log
	}
	g, err := b.local.Geometry()
	if err != nil {
		return nil, fmt.Errorf("repl: local geometry: %w", err)
	}
	r := &Rebuild{b: b, cfg: cfg, blocks: g.Blocks, region: uint64(cfg.RegionBytes) >> b.shift,
		xfer: uint64(xfer) >> b.shift, fin: make(chan struct{}), cbs: make(chan copyDone, copyDepth*maxCopyCommands)}
	for i := range r.slots {
		r.slots[i].cb = slotCB{ch: r.cbs, slot: i}
	}
	r.region = min(r.region, r.xfer*maxCopyCommands)
	r.ctx, r.cancel = context.WithCancel(context.Background())

	b.mu.Lock()
	old := b.set.Load()
	switch {
	case epoch != old.epoch:
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: rebuild at epoch %d, backend at %d", ErrStaleEpoch, epoch, old.epoch)
	case b.rb != nil:
		node := b.rb.p.node
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: of %s", ErrRebuildBusy, node)
	case b.gated.Load():
		// A barrier stores the gate before it looks for a rebuild to
		// end, under mu: a rebuild it would not see is refused here.
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: a snapshot barrier is running", ErrRebuildBusy)
	}
	s := &legSet{epoch: epoch, peers: make([]*peer, 0, len(old.peers)+1)}
	for _, p := range old.peers {
		if p.node != cfg.Node {
			s.peers = append(s.peers, p)
			continue
		}
		if st := p.state.Load(); st == peerInSync || st == peerFailing {
			b.mu.Unlock()
			return nil, fmt.Errorf("%w: %s is %s, not out of sync", ErrInvalid, cfg.Node, peerStateNames[st])
		}
	}
	if len(s.peers) == MaxPeers {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: %d peers, at most %d", ErrInvalid, len(s.peers)+1, MaxPeers)
	}
	if cfg.UseDirtyLog {
		if d := b.drls.Load().find(cfg.Node); d != nil && !d.lost.Load() {
			r.drl = d
		}
	}
	if r.drl != nil {
		r.total.Store(r.drl.bytes(r.blocks, b.shift))
	} else {
		r.total.Store(r.blocks << b.shift)
	}
	r.own = r.drl == nil && cfg.RemoteDigests == nil && cfg.MappedOwn != nil
	r.p = newPeer(b, cfg.Node, cfg.NS, epoch, r.xfer)
	r.p.rb = r
	r.p.state.Store(peerRebuilding)
	s.peers = append(s.peers, r.p)
	b.rb = r
	b.set.Store(s)
	b.mu.Unlock()
	r.cfg.Logger.Info("rebuild started", "node", cfg.Node, "epoch", epoch, "mode", r.Mode(), "bytes", r.total.Load(), "rate", cfg.Rate)
	go r.run()
	return r, nil
}

// Done is closed once the rebuild ended; Err then says how.
func (r *Rebuild) Done() <-chan struct{} { return r.fin }

// Err is nil once the replica is in sync, the failure otherwise; nil
// too while the rebuild runs.
func (r *Rebuild) Err() error {
	select {
	case <-r.fin:
		return r.err
	default:
		return nil
	}
}

// Node is the replica being rebuilt.
func (r *Rebuild) Node() string { return r.cfg.Node }

// Progress returns the bytes the copier has passed and the bytes it
// has to pass: the volume's size for a full copy, the size of the dirty
// regions for an incremental one.
func (r *Rebuild) Progress() (done, total uint64) {
	total = r.total.Load()
	return min(r.done.Load(), total), total
}

// Incremental reports whether the rebuild copies only the regions of the
// replica's dirty-region log (else it is a full copy).
func (r *Rebuild) Incremental() bool { return r.drl != nil }

// Mode is "incremental", "compare" or "full" (logs and metrics).
func (r *Rebuild) Mode() string {
	switch {
	case r.drl != nil:
		return "incremental"
	case r.cfg.RemoteDigests != nil:
		return "compare"
	}
	return "full"
}

// Differ is, for a compare, the bytes of the regions whose digests
// differed (what it copied, holes included); 0 otherwise.
func (r *Rebuild) Differ() uint64 { return r.differ.Load() }

// Copied is the bytes written to the replica by the copier (holes not
// counted).
func (r *Rebuild) Copied() uint64 { return r.copied.Load() }

// Cancel ends the rebuild (ErrRebuildCancelled unless it ended already);
// the replica stops taking writes. It does not wait: see Done.
func (r *Rebuild) Cancel() { r.fail(ErrRebuildCancelled) }

// fail ends the rebuild with err (the first one counts).
func (r *Rebuild) fail(err error) {
	r.errOnce.Do(func() {
		r.mu.Lock()
		r.cause = err
		r.mu.Unlock()
		r.cancel()
	})
}

func (r *Rebuild) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cause != nil {
		return r.cause
	}
	return ErrRebuildCancelled
}

// check returns why the copier must stop, if it must.
func (r *Rebuild) check() error {
	if r.ctx.Err() != nil {
		return r.failure()
	}
	if st := r.p.state.Load(); st != peerRebuilding {
		return fmt.Errorf("%w: replica %s", ErrRebuildLeg, peerStateNames[st])
	}
	if r.b.set.Load().find(r.p.node) != r.p {
		return fmt.Errorf("%w: replica %s left the leg set", ErrRebuildCancelled, r.p.node)
	}
	return nil
}

func (r *Rebuild) run() {
	start := time.Now()
	var err error
	switch {
	case r.drl != nil:
		err = r.copyDirty()
	case r.cfg.RemoteDigests != nil:
		err = r.compareAll()
	default:
		err = r.copyAll()
	}
	if err == nil {
		err = r.flush()
	}
	if err == nil {
		err = r.promote()
	}
	if err != nil && r.p.state.CompareAndSwap(peerRebuilding, peerDropped) {
		r.p.kick()
	}
	r.release() // windows left by an error: their held legs
	r.cancel()
	b := r.b
	b.mu.Lock()
	if b.rb == r {
		b.rb = nil
	}
	b.mu.Unlock()
	r.err = err
	if err != nil {
		r.cfg.Logger.Warn("rebuild failed", "node", r.p.node, "epoch", r.p.epoch, "mode", r.Mode(), "done_bytes", r.done.Load(), "error", err)
	} else {
		r.cfg.Logger.Info("rebuild done: replica in sync", "node", r.p.node, "epoch", r.p.epoch, "mode", r.Mode(),
			"copied_bytes", r.copied.Load(), "seconds", time.Since(start).Seconds())
	}
	close(r.fin)
}

// promote asks the registry to count the replica in sync: from the
// moment it is asked, the replica's failures are an in-sync replica's
// (held and reported), since the commit may land before the answer.
func (r *Rebuild) promote() error {
	p := r.p
	if !p.state.CompareAndSwap(peerRebuilding, peerPromoting) {
		return r.check()
	}
	if err := r.cfg.Promote(r.ctx); err != nil {
		if p.state.CompareAndSwap(peerPromoting, peerDropped) {
			p.kick()
		}
		return fmt.Errorf("repl: replica %s copied, not committed in sync: %w", p.node, err)
	}
	// In sync: its dirty-region log (if any) goes with the state change,
	// under drlMu: a failure meanwhile (peer.missed) either found the log
	// and left promoting first (the CAS fails, the log stays) or comes
	// after and makes a new one.
	b := r.b
	b.drlMu.Lock()
	ok := p.state.CompareAndSwap(peerPromoting, peerInSync)
	if ok {
		b.dropDirtyLocked(p.node)
	}
	b.drlMu.Unlock()
	if !ok {
		// It failed while the commit was asked: reported as an in-sync
		// replica that missed a write.
		return fmt.Errorf("%w: replica %s failed while being committed in sync", ErrRebuildLeg, p.node)
	}
	return nil
}

// copyDirty copies the dirty regions of the log in windows, in LBA order
// (an incremental rebuild: see the top of the file).
func (r *Rebuild) copyDirty() error {
	// Every write that started without the replica in its leg set marks
	// the log when it finishes: wait for them (no window is published
	// yet, so nobody holds a leg) before the first look.
	if err := r.quiesce(nil); err != nil {
		return err
	}
	d := r.drl
	r.total.Store(d.bytes(r.blocks, r.b.shift))
	per := uint64(1) << d.shift       // blocks per region
	span := max(1, r.region/per)      // regions per window
	end := (r.blocks + per - 1) / per // regions of the volume
	for i := d.next(0, end); i < end; i = d.next(i, end) {
		if err := r.check(); err != nil {
			return err
		}
		j := i + 1
		for j < end && j-i < span && d.dirty(j) {
			j++
		}
		lo, hi := i*per, min(j*per, r.blocks)
		if err := r.push(lo, hi, (hi-lo)<<r.b.shift); err != nil {
			r.salvage()
			return err
		}
		i = j
	}
	if err := r.drain(); err != nil {
		r.salvage()
		return err
	}
	return nil
}

// copyAll walks the volume in windows, in LBA order.
func (r *Rebuild) copyAll() error {
	errFound := errors.New("found")
	for c := uint64(0); c < r.blocks; {
		if err := r.check(); err != nil {
			return err
		}
		var s, e uint64
		found := false
		err := r.walk(c, r.blocks, func(lba, n uint64, _ bool) error {
			s, e, found = lba, lba+n, true
			return errFound
		})
		if err != nil && err != errFound {
			return fmt.Errorf("repl: rebuild: local map: %w", err)
		}
		hi := min(r.blocks, c+maxLegDeallocate) // a hole (left alone by a MappedOwn copy)
		switch {
		case found && s > c:
			hi = min(hi, s)
		case found:
			hi = min(e, c+r.region)
		}
		if err := r.push(c, hi, (hi-c)<<r.b.shift); err != nil {
			return err
		}
		c = hi
	}
	return r.drain()
}

// push starts the copy of [lo, hi) as the newest window in flight, once
// the oldest landed if copyDepth are (see the top of the file): publish
// it with the others, quiesce, look at its local map again, read each
// mapped run and send it, deallocate the rest. progress is the bytes
// Progress counts once it landed.
func (r *Rebuild) push(lo, hi, progress uint64) error {
	if r.n == copyDepth {
		if err := r.land(); err != nil {
			return err
		}
	}
	s := &r.slots[(r.head+r.n)%copyDepth]
	s.lo, s.hi, s.progress, s.copied, s.sent, s.failed = lo, hi, progress, 0, false, false
	r.n++
	r.peak = max(r.peak, r.n)
	r.publish()
	if err := r.quiesce(nil); err != nil {
		return err
	}
	r.runs, r.zeros = r.runs[:0], r.zeros[:0]
	if err := r.walk(lo, hi, func(lba, n uint64, zero bool) error {
		r.runs = append(r.runs, [2]uint64{lba, lba + n})
		r.zeros = append(r.zeros, zero)
		return nil
	}); err != nil {
		return fmt.Errorf("repl: rebuild: local map: %w", err)
	}
	at := lo
	for i, run := range r.runs {
		if run[0] > at && !r.own {
			if err := r.deallocate(s, at, run[0]); err != nil {
				return err
			}
		}
		if r.zeros[i] {
			if err := r.deallocate(s, run[0], run[1]); err != nil {
				return err
			}
			at = run[1]
			continue
		}
		for c := run[0]; c < run[1]; {
			n := min(run[1]-c, r.region)
			if err := r.copyChunk(s, c, n); err != nil {
				return err
			}
			c += n
		}
		at = run[1]
	}
	if at < hi && !r.own {
		if err := r.deallocate(s, at, hi); err != nil {
			return err
		}
	}
	s.sent = true
	return nil
}

// walk is the copy's look at the local map over [lo, hi): Mapped's runs
// (zero false), or with a MappedOwn copy the own runs, tombstones with
// zero true.
func (r *Rebuild) walk(lo, hi uint64, fn func(lba, n uint64, zero bool) error) error {
	if r.own {
		return r.cfg.MappedOwn(lo, hi, fn)
	}
	return r.cfg.Mapped(lo, hi, func(lba, n uint64) error { return fn(lba, n, false) })
}

// land waits until the oldest window in flight is on the replica and
// ends it: its regions are clean in the dirty-region log (an
// incremental rebuild; a held leg that then fails marks them again),
// then the windows are published without it and the legs it held alone
// go.
func (r *Rebuild) land() error {
	s := &r.slots[r.head]
	if err := r.settle(s); err != nil {
		return err
	}
	if d := r.drl; d != nil {
		d.clear(s.lo>>d.shift, (s.hi-1)>>d.shift)
		// A write that skipped the replica once a failure dropped it
		// marks the log when it finishes, which may have come before
		// this clear: once the replica left, its regions stay marked.
		// (Seen rebuilding after the clear, it left after it: every
		// such mark comes later.)
		if r.p.state.Load() != peerRebuilding {
			d.mark(s.lo, s.hi-s.lo)
		}
	}
	r.copied.Add(s.copied)
	r.done.Add(s.progress)
	r.bytes -= int(s.copied)
	r.head = (r.head + 1) % copyDepth
	r.n--
	r.publish()
	return nil
}

// salvage lands, once the copy failed, the oldest windows that are on
// the replica all the same (each command sent and completed without
// error, as far as completions came already): their regions are clean
// in the log, the next incremental rebuild does not copy them again,
// unless the replica was dropped meanwhile (land).
func (r *Rebuild) salvage() {
	for more := r.out > 0; more; more = r.out > 0 {
		select {
		case d := <-r.cbs:
			r.out--
			r.slots[d.slot].cmds--
			r.slots[d.slot].failed = r.slots[d.slot].failed || d.err != nil
		default:
			more = false
		}
	}
	r.landLanded()
}

// landLanded lands the oldest windows whose every command was sent and
// completed without error.
func (r *Rebuild) landLanded() {
	for r.n > 0 {
		if s := &r.slots[r.head]; !s.sent || s.failed || s.cmds > 0 || r.land() != nil {
			return
		}
	}
}

// drain lands every window in flight.
func (r *Rebuild) drain() error {
	for r.n > 0 {
		if err := r.land(); err != nil {
			return err
		}
	}
	return nil
}

// publish stores the windows in flight (nil: none) and sends, or drops
// if the replica stopped taking writes, the held legs that overlap none
// of them any more: every window they overlapped has landed.
func (r *Rebuild) publish() {
	var w *window
	if r.n > 0 {
		w = &window{n: r.n}
		for k := range r.n {
			s := &r.slots[(r.head+k)%copyDepth]
			w.rs[k] = [2]uint64{s.lo, s.hi}
		}
	}
	var out *leg
	r.mu.Lock()
	r.win.Store(w)
	var kept *leg
	for l := r.held; l != nil; {
		next := l.nextRB
		if lo, hi := r.span(l.r.host); w != nil && w.overlaps(lo, hi) {
			l.nextRB, kept = kept, l
		} else {
			l.nextRB, out = out, l
			r.heldN--
		}
		l = next
	}
	r.held = kept
	r.mu.Unlock()
	for l := out; l != nil; {
		next := l.nextRB
		l.nextRB = nil
		l.r.deferredOn.Store(nil) // in use and not held: a quiesce waits for it now
		if sending(r.p.state.Load()) {
			l.send(l.r.host)
		} else {
			l.r.release() // never sent: the replica is out
		}
		l = next
	}
}

// release ends every window (the copier stopped) and sends, or drops,
// the legs they held.
func (r *Rebuild) release() {
	r.n = 0
	r.publish()
}

// quiesce waits for every host write in use to complete, but those
// holding their leg on a window (hold): Backend.waitIdle, exempting
// them. Its argument is the serial copier's (the window whose holders to
// skip) and ignored: every held record is skipped, whichever windows
// hold it; pass nil.
func (r *Rebuild) quiesce(*window) error {
	err := r.b.waitIdle(r.ctx, true, r.check)
	if err != nil && r.ctx.Err() != nil {
		return r.failure()
	}
	return err
}

// span is the blocks [lo, hi) a host I/O writes.
func (r *Rebuild) span(io *target.IO) (lo, hi uint64) {
	n := io.Blocks
	if io.Op == target.OpWrite {
		n = uint64(len(io.Data)) >> r.b.shift
	}
	return io.LBA, io.LBA + n
}

// hold keeps l, the rebuilding leg of a host write io, until the copy of
// every window in flight it overlaps is on the replica; false: it
// overlaps none, send it now. The record counts l as pending already.
func (r *Rebuild) hold(l *leg, io *target.IO) bool {
	w := r.win.Load()
	if w == nil || io.Op == target.OpFlush {
		return false
	}
	if lo, hi := r.span(io); !w.overlaps(lo, hi) {
		return false
	}
	r.mu.Lock()
	if r.win.Load() != w { // published again meanwhile
		r.mu.Unlock()
		return r.hold(l, io)
	}
	l.r.deferredOn.Store(w)
	l.nextRB = r.held
	r.held = l
	r.heldN++
	r.holds++
	r.mu.Unlock()
	return true
}

// copyChunk reads n blocks at lba (at most a region) of s, the newest
// window, locally and writes them to the replica, once older windows
// landed if the bytes in flight would exceed the budget.
func (r *Rebuild) copyChunk(s *copySlot, lba, n uint64) error {
	shift := r.b.shift
	size := int(n << shift)
	for r.n > 1 && r.bytes+size > copyBudget { // the oldest is not s
		if err := r.land(); err != nil {
			return err
		}
	}
	if cap(r.buf) < size {
		r.buf = make([]byte, r.region<<shift)
	}
	buf := r.buf[:size]
	if err := r.read(lba, buf); err != nil {
		return err
	}
	if err := r.throttle(uint64(size)); err != nil {
		return err
	}
	for k := uint64(0); k < n; k += r.xfer {
		c := min(r.xfer, n-k)
		if err := r.send(s, func(cb initiator.Callback) error {
			return r.p.ns.WriteAsync(lba+k, buf[k<<shift:(k+c)<<shift], 0, cb)
		}); err != nil {
			return err
		}
	}
	s.copied += uint64(size)
	r.bytes += size
	return nil
}

// read reads buf at lba locally, in up to copyReaders parts of at least
// copyReadPart read at once (cfg.Read blocks: the store reads O_DIRECT,
// one part at a time).
func (r *Rebuild) read(lba uint64, buf []byte) error {
	shift := r.b.shift
	blocks := uint64(len(buf)) >> shift
	parts := min(copyReaders, max(1, len(buf)/copyReadPart))
	per := (blocks + uint64(parts) - 1) / uint64(parts)
	var (
		wg   sync.WaitGroup
		errs [copyReaders]error
	)
	for k := 1; k < parts; k++ {
		lo := min(uint64(k)*per, blocks)
		hi := min(lo+per, blocks)
		if lo == hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = r.cfg.Read(lba+lo, buf[lo<<shift:hi<<shift])
		}()
	}
	errs[0] = r.cfg.Read(lba, buf[:min(per, blocks)<<shift])
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("repl: rebuild: local read at LBA %d: %w", lba, err)
		}
	}
	return nil
}

// deallocate makes [lo, hi) read as zeros on the replica (one range: a
// window is at most maxLegDeallocate blocks).
func (r *Rebuild) deallocate(s *copySlot, lo, hi uint64) error {
	rng := []initiator.Range{{LBA: lo, Blocks: uint32(hi - lo)}}
	return r.send(s, func(cb initiator.Callback) error { return r.p.ns.DeallocateAsync(rng, cb) })
}

// flush makes the copy durable on the replica (no window in flight).
func (r *Rebuild) flush() error {
	s := &r.slots[r.head]
	if err := r.send(s, func(cb initiator.Callback) error { return r.p.ns.FlushAsync(cb) }); err != nil {
		return err
	}
	return r.settle(s)
}

// send sends one command of s, once s has fewer than maxCopyCommands in
// flight (r.cbs holds every completion), waiting for the copier's
// commands while the connection is full.
func (r *Rebuild) send(s *copySlot, op func(initiator.Callback) error) error {
	for s.cmds >= maxCopyCommands {
		if err := r.collect(); err != nil {
			return err
		}
	}
	for {
		err := op(&s.cb)
		if err == nil {
			s.cmds++
			r.out++
			return nil
		}
		if !errors.Is(err, initiator.ErrQueueFull) {
			err = fmt.Errorf("%w: %w", ErrRebuildLeg, err)
			r.fail(err)
			return err
		}
		if r.out > 0 { // one of ours frees a slot
			if err := r.collect(); err != nil {
				return err
			}
			continue
		}
		select {
		case <-r.ctx.Done():
			return r.failure()
		case <-time.After(time.Millisecond):
		}
	}
}

// settle waits until s's commands completed.
func (r *Rebuild) settle(s *copySlot) error {
	for s.cmds > 0 {
		if err := r.collect(); err != nil {
			return err
		}
	}
	return nil
}

// collect takes one completion of the copier's commands; a failed one
// fails the rebuild.
func (r *Rebuild) collect() error {
	select {
	case d := <-r.cbs:
		r.out--
		r.slots[d.slot].cmds--
		if d.err != nil {
			r.slots[d.slot].failed = true
			err := fmt.Errorf("%w: %w", ErrRebuildLeg, d.err)
			r.fail(err)
			return err
		}
		return nil
	case <-r.ctx.Done():
		// Commands may still complete into cbs: buffered, never read
		// again (the rebuild is over).
		return r.failure()
	}
}

// throttle waits until copying n more bytes keeps the rate.
func (r *Rebuild) throttle(n uint64) error {
	if r.cfg.Limiter == nil {
		return nil
	}
	if err := r.cfg.Limiter.Wait(r.ctx, n); err != nil {
		return r.failure()
	}
	return nil
}

// Limiter bounds the bytes per second of the rebuilds that share it (a
// node's --rebuild-rate): each copy reserves its bytes on a timeline that
// advances at the rate, and waits for its turn; a timeline left behind
// (nothing copied for a while) restarts at the present, so no burst
// builds up beyond the copy that is about to go. A copier's, not the
// data path's: it takes a mutex.
type Limiter struct {
	rate float64 // bytes per second
	mu   sync.Mutex
	next time.Time // when the next reservation may go
}

// NewLimiter returns a Limiter of rate bytes per second (> 0).
func NewLimiter(rate int64) *Limiter { return &Limiter{rate: float64(max(rate, 1))} }

// Wait reserves n bytes and waits for their turn, or until ctx ends
// (the rebuild's failure then).
func (l *Limiter) Wait(ctx context.Context, n uint64) error {
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	at := l.next
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	l.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

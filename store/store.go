package store

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// Store is one storage node's extent store: a pebble instance for the
// metadata and a data area for the bytes. Safe for concurrent use.
// Administrative calls (Create, Delete, Resize, SetState, Close) are
// serialised by one mutex and durable when they return; block I/O goes
// through *Volume handles and never takes it.
type Store struct {
	cfg    Config
	db     *pebble.DB
	area   Area
	align  int
	cshift uint8  // log2(cluster bytes)
	cmask  uint64 // cluster bytes - 1
	format formatRecord
	log    Logger

	// fatal holds the first error that failed the store (a failed sync of
	// the area or of pebble's WAL, a pebble fatal error): every request
	// then returns ErrIO.
	fatal atomic.Pointer[error]

	al allocator

	// seq counts acknowledged mutations (writes, zeroes, frees);
	// flushedSeq is the seq the last completed flush covered. flushMu
	// serialises flushes and Close's closing of pebble (dbClosed).
	seq, flushedSeq atomic.Uint64
	flushMu         sync.Mutex
	dbClosed        bool

	// The space guard (space.go).
	noSpace, spaceMonitored        atomic.Bool
	freeBytes, totalBytes, reserve atomic.Uint64
	spaceStop, spaceDone           chan struct{}

	// The background syncer (sync.go).
	syncArmed          atomic.Bool
	syncKick           chan struct{}
	syncStop, syncDone chan struct{}

	// The background refill of the ready pool (refill.go).
	refillKick             chan struct{}
	refillStop, refillDone chan struct{}

	bounce sync.Pool // *[]byte of MaxTransferBytes, aligned: for unaligned caller buffers
	// cowBufs: *[]byte of one cluster, aligned: copy-on-write reads the
	// parent's cluster into one (docs/snapshots.md §1.3).
	cowBufs sync.Pool
	// zeroBuf is one cluster of zeros, aligned: write zeroes over part of
	// a parent's cluster copies it on write with these. Never written.
	zeroBuf []byte
	// sbShift is log2 of a partial cluster's sub-block (docs/snapshots.md
	// §1.3, "Sub-cluster redirect"): a 16th of a cluster, at least 4 KiB;
	// fullMask has a bit per sub-block. A store whose clusters hold fewer
	// than two sub-blocks (4 KiB clusters) copies whole clusters.
	sbShift  uint8
	fullMask uint64
	// def holds the map keys of writes that replaced a parent's data,
	// committed after the next area sync (deferred.go); gate orders the
	// reads of partial clusters before the free of a cluster they may
	// read through (partial.go).
	def  deferred
	gate sync.RWMutex

	// nextMap is the next map ID a snapshot, clone or revert takes (the
	// 'N' key). Guarded by mu.
	nextMap uint64

	c storeCounters

	// testHook, if set, is called at each step of the write path named by
	// a hookPoint (crash tests clone the filesystem and area there).
	testHook func(hookPoint)

	// serialFirstWrites makes each volume's first writes one at a time,
	// data write and map commit included, as before their claims: the
	// baseline of BenchmarkFirstWriteConcurrent. Set before any I/O.
	serialFirstWrites bool

	legacy bool // the directory holds target/volume's layout: Open migrates it (upgrade.go)

	mu     sync.Mutex // guards closed and vols; serialises administrative calls
	closed bool
	vols   map[ID]*Volume
}

type storeCounters struct {
	refills, mapCommits, frees, flushes, areaSyncs, bounces, bgSyncs, zeroedAtOpen, zeroedAhead atomic.Uint64
	bgRefills, bgRefillErrors                                                                   atomic.Uint64
	cows, redirects, deferredCommits                                                            atomic.Uint64
	// pebble's health (events): background errors, write stalls and their
	// total length; stallStart is the running stall's start (UnixNano), 0
	// when none.
	bgErrors, writeStalls, stallNanos atomic.Uint64
	stallStart                        atomic.Int64
}

// hookPoint names a step of the write path, for crash injection.
type hookPoint uint8

const (
	hookReserved          hookPoint = iota // a refill's 'R' keys are durable; nothing written yet
	hookDataWritten                        // a first write's data is in its cluster; its map key is not committed
	hookMapCommitted                       // the map key is committed (not synced); the entry not published
	hookFreed                              // a free's {delete 'X', set 'R'} is committed, not synced; clusters in limbo
	hookLimboZeroed                        // a flush zeroed the limbo clusters; the area is not synced
	hookAreaSynced                         // a flush synced the area; the WAL is not synced
	hookReleaseZeroed                      // delete or shrink zeroed and synced its clusters; the map is not changed
	hookSizeCommitted                      // a shrink's new size is durable; its clusters are not released
	hookGrown                              // the area grew (durably); the format record does not say so yet
	hookAheadZeroed                        // a refill zeroed clusters at or past the zeroed watermark; the area is not synced
	hookAheadSynced                        // ... and synced the area; its 'R' keys and the new watermark are not committed
	hookMigrated                           // an upgrade batch is committed (not synced); its data synced
	hookSnapFlushed                        // a snapshot flushed its volume (under its exclusive lock); nothing committed
	hookSnapCommitted                      // a snapshot's records and 'N' are durable; the tables not swapped
	hookCloneCommitted                     // a clone's record and 'N' are durable
	hookRevertCommitted                    // a revert's record and 'N' are durable; the old map not released
	hookMergeChunk                         // a chunk of a snapshot's merge into its child is committed (not synced)
	hookMergeDone                          // a merge's last batch (the snapshot's record gone, the child re-parented) is durable
	hookFlattenChunk                       // a flatten copied one cluster (committed, not synced)
	hookFlattenDone                        // a flatten's record (no parent) is durable; tombstones not deleted
	hookDeferredCommitted                  // deferred map keys were committed after an area sync (not synced unless the batch was)
	numHookPoints
)

func (p hookPoint) String() string {
	if p >= numHookPoints {
		return fmt.Sprintf("hookPoint(%d)", uint8(p))
	}
	return [...]string{"reserved", "data-written", "map-committed", "freed", "limbo-zeroed",
		"area-synced", "release-zeroed", "size-committed", "grown", "watermark-zeroed", "watermark-synced", "migrated",
		"snap-flushed", "snap-committed", "clone-committed", "revert-committed", "merge-chunk", "merge-done",
		"flatten-chunk", "flatten-done", "deferred-committed"}[p]
}

func (s *Store) hook(p hookPoint) {
	if s.testHook != nil {
		s.testHook(p)
	}
}

// Open opens the store in cfg.Dir (creating it and its data area if new),
// loads every volume and map, and repairs what a crash left: clusters
// reserved but not mapped are zeroed and become the ready pool; deletes and
// shrinks interrupted are finished.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	askedCluster := cfg.ClusterBytes
	cfg = cfg.WithDefaults()
	s := &Store{cfg: cfg, vols: make(map[ID]*Volume), log: cfg.Logger}
	if s.log == nil {
		s.log = pebble.DefaultLogger
	}
	cache := pebble.NewCache(cfg.CacheBytes)
	defer cache.Unref()
	db, err := pebble.Open(cfg.Dir, &pebble.Options{
		FS:                 cfg.FS,
		Cache:              cache,
		MemTableSize:       uint64(cfg.MemTableBytes),
		FormatMajorVersion: pebble.FormatNewest,
		ReadOnly:           cfg.ReadOnly,
		Logger:             pebbleLogger{s: s, out: s.log},
		EventListener:      s.events(),
	})
	if err != nil {
		if cfg.Area != nil {
			_ = cfg.Area.Close()
		}
		return nil, fmt.Errorf("store: open %q: %w: %w", cfg.Dir, ErrIO, err)
	}
	s.db = db
	if err := s.openArea(askedCluster); err != nil {
		_ = db.Close()
		if s.area != nil {
			_ = s.area.Close()
		} else if cfg.Area != nil {
			_ = cfg.Area.Close()
		}
		return nil, err
	}
	if openHook != nil {
		openHook(s)
	}
	// Lazily: the area's alignment and cluster size are known once load
	// opened it, and a merge load finishes may copy clusters.
	s.bounce.New = func() any { b := alignedBuf(cfg.MaxTransferBytes, s.align); return &b }
	s.cowBufs.New = func() any { b := alignedBuf(int(s.cmask+1), s.align); return &b }
	err = s.load()
	if err == nil && s.legacy {
		err = s.migrate()
	}
	if err != nil {
		_ = db.Close()
		_ = s.area.Close()
		return nil, err
	}
	s.zeroBuf = alignedBuf(int(s.cmask+1), s.align)
	s.startSpaceGuard()
	s.startSyncer()
	s.startRefiller()
	return s, nil
}

// openArea reads (or, for a new store, writes) the format record and opens
// the data area, checking that its header names this store.
func (s *Store) openArea(askedCluster int) error {
	legacy, err := s.isLegacy()
	if err != nil {
		return err
	}
	s.legacy = legacy
	if legacy && s.cfg.ReadOnly {
		return fmt.Errorf("store: %q holds target/volume's layout: open it read-write once to upgrade it: %w", s.cfg.Dir, ErrReadOnly)
	}
	v, closer, err := s.db.Get(formatKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return s.create()
	case err != nil:
		return fmt.Errorf("store: %q: read format: %w: %w", s.cfg.Dir, ErrIO, err)
	}
	f, err := decodeFormat(v)
	_ = closer.Close()
	if err != nil {
		return fmt.Errorf("store: %q: %w", s.cfg.Dir, err)
	}
	if askedCluster != 0 && askedCluster != 1<<f.clusterL {
		return fmt.Errorf("store: %q was created with %d-byte clusters, not %d: %w", s.cfg.Dir, 1<<f.clusterL, askedCluster, ErrInvalid)
	}
	s.format = f
	s.setCluster(f.clusterL)
	if err := s.checkAreaKind(); err != nil {
		return err
	}
	a := s.cfg.Area
	switch {
	case a != nil:
	case f.device:
		if a, err = OpenDeviceArea(s.cfg.AreaDevice); err != nil {
			return fmt.Errorf("store: %q: %w", s.cfg.Dir, err)
		}
	default:
		if a, _, err = OpenFileArea(s.cfg.AreaPath, 0, false); err != nil {
			return fmt.Errorf("store: %q: its data area: %w", s.cfg.Dir, err)
		}
	}
	s.useArea(a)
	if a.Size() < int64(f.clusters)<<f.clusterL {
		if f.device {
			return fmt.Errorf("store: data device %s holds %d bytes, store %x (created on %s) has %d clusters of %d: a smaller or another device: %w",
				s.cfg.AreaDevice, a.Size(), f.uuid, f.path, f.clusters, 1<<f.clusterL, ErrCorrupt)
		}
		return fmt.Errorf("store: data area of %d bytes, the store has %d clusters of %d: %w",
			a.Size(), f.clusters, 1<<f.clusterL, ErrCorrupt)
	}
	if f.state == formatCreating {
		// A crash interrupted create: the area holds nothing yet. A device
		// is checked again (it may have been swapped since), and its
		// watermark set back to the header: a record written by a release
		// that zeroed the whole device first becomes a lazy one too.
		if f.device {
			if err := s.prepareDevice(); err != nil {
				return err
			}
		}
		if unzeroed(a) {
			s.format.lazy = true
			if err := s.startFormat(); err != nil {
				return err
			}
		}
		return s.initArea()
	}
	hdr := alignedBuf(max(4096, s.align), s.align)
	if err := a.ReadAt(hdr, 0); err != nil {
		return fmt.Errorf("store: read the data area header: %w: %w", ErrIO, err)
	}
	h, err := decodeHeader(hdr)
	if err != nil && f.device {
		what, derr := deviceContents(a)
		if derr != nil || what == "" {
			what = "no store header"
		}
		return fmt.Errorf("store: data device %s holds %s, not store %x of %q (created on %s): the device was swapped or overwritten; "+
			"start with the device that holds store %x: %w", s.cfg.AreaDevice, what, f.uuid, s.cfg.Dir, f.path, f.uuid, ErrCorrupt)
	}
	if err != nil {
		return fmt.Errorf("store: %q: %w", s.cfg.Dir, err)
	}
	// The header keeps the area's size at creation; growth records the
	// new size in the format record only.
	if h.uuid != f.uuid || h.clusterL != f.clusterL {
		if f.device {
			return fmt.Errorf("store: data device %s holds blk store %x, but %q is store %x (created on %s): the device was swapped; "+
				"start with the device that holds store %x: %w", s.cfg.AreaDevice, h.uuid, s.cfg.Dir, f.uuid, f.path, f.uuid, ErrCorrupt)
		}
		return fmt.Errorf("store: the data area belongs to another store (uuid %x, not %x): %w", h.uuid, f.uuid, ErrCorrupt)
	}
	return nil
}

// checkAreaKind refuses to open a store on another kind of area than it
// was created with: a file store's data is in its file, a device store's
// on its device, and starting on the other would find an empty area, or
// none, where the volumes should be.
func (s *Store) checkAreaKind() error {
	f := s.format
	switch {
	case f.device && s.cfg.AreaDevice == "":
		return fmt.Errorf("store: %q was created on the block device %s (store %x): its data is there, not in a file; "+
			"start with the data device setting (blkd --data-device) naming that device: %w", s.cfg.Dir, f.path, f.uuid, ErrInvalid)
	case !f.device && s.cfg.AreaDevice != "":
		return fmt.Errorf("store: %q was created with its data area in the file %s (store %x), not on a block device: "+
			"its data is in that file, so it will not start on %s; drop the data device setting, or give the device a new data directory: %w",
			s.cfg.Dir, s.cfg.Dir+".area", f.uuid, s.cfg.AreaDevice, ErrInvalid)
	}
	return nil
}

// prepareDevice readies a block device for a new store: it refuses one
// that holds anything but zeros or this store's own header (a crashed
// create) unless Config.WipeDevice says to destroy it. With the wipe
// confirmed, it zeroes the first and last deviceScanBytes (where every
// signature recognise knows lives: blkid, and the next store's blank
// check, then see none of the old contents) and syncs. It zeroes nothing
// else: the store is lazy (format.lazy), its clusters zeroed as they are
// first handed out (refill), so the old bytes in between are never read
// by anyone (docs/store.md, "Zeroed watermark").
func (s *Store) prepareDevice() error {
	dev := s.cfg.AreaDevice
	hdr := alignedBuf(max(4096, s.align), s.align)
	if err := s.area.ReadAt(hdr, 0); err != nil {
		return fmt.Errorf("store: data device %s: read: %w: %w", dev, ErrIO, err)
	}
	if h, err := decodeHeader(hdr); err == nil && h.uuid == s.format.uuid {
		return nil // this store's own create, interrupted: its ends hold nothing else
	}
	what, err := deviceContents(s.area)
	if err != nil {
		return fmt.Errorf("store: data device %s: %w", dev, err)
	}
	switch {
	case what == "":
		return nil
	case !s.cfg.WipeDevice:
		return fmt.Errorf("store: data device %s holds %s: refusing to create a store on it (is it the right device?); "+
			"to destroy what it holds, confirm with the wipe setting (blkd --data-device-wipe %s): %w", dev, what, dev, ErrNotBlank)
	}
	s.log.Infof("store: data device %s held %s: wiping it, as confirmed (its ends now; each cluster before its first use)", dev, what)
	size := s.area.Size()
	n := min(int64(deviceScanBytes), size) &^ int64(s.align-1)
	for _, off := range []int64{0, size - n} {
		if err := s.area.Zero(off, n); err != nil {
			return fmt.Errorf("store: data device %s: zero %d bytes at %d: %w: %w", dev, n, off, ErrIO, err)
		}
	}
	if err := s.area.Sync(); err != nil {
		return fmt.Errorf("store: data device %s: sync: %w: %w", dev, ErrIO, err)
	}
	return nil
}

func (s *Store) setCluster(l uint8) {
	s.cshift = l
	s.cmask = 1<<l - 1
	s.sbShift = max(l, 16) - 4
	s.fullMask = 1<<(1<<(l-s.sbShift)) - 1
}

// partials says whether first writes into a parent's cluster redirect
// (write their sub-blocks into a new partial cluster) rather than copy
// the whole cluster.
func (s *Store) partials() bool { return s.fullMask > 1 }

// create makes a new store: the format record (state creating, synced),
// then the area and its header (synced), then the record again (ready).
// A crash in between leaves "creating", and Open starts again.
func (s *Store) create() error {
	if s.cfg.ReadOnly {
		return fmt.Errorf("store: %q holds no store and is opened read-only: %w", s.cfg.Dir, ErrReadOnly)
	}
	if !s.legacy {
		if err := s.checkEmpty(); err != nil {
			return err
		}
	}
	l := uint8(bits.TrailingZeros(uint(s.cfg.ClusterBytes)))
	s.setCluster(l)
	areaBytes := s.cfg.AreaBytes
	a := s.cfg.Area
	if a == nil && s.cfg.AreaDevice != "" {
		var err error
		if a, err = OpenDeviceArea(s.cfg.AreaDevice); err != nil {
			return fmt.Errorf("store: %q: %w", s.cfg.Dir, err)
		}
		s.useArea(a) // closed by Open on any error from here
	}
	if s.legacy {
		// Size the area for the old blocks (and a ready pool), or refuse
		// an upgrade that cannot fit before anything is written, so the
		// operator can retry with a larger area.
		need, err := s.legacyClusters(l)
		if err != nil {
			return err
		}
		areaBytes = max(areaBytes, int64(need+1+uint64(s.cfg.ReadyClusters))<<l)
		limit, what := s.cfg.AreaMaxBytes, "AreaMaxBytes"
		if a != nil {
			limit, what = a.Size(), "the data area's size"
		}
		if limit > 0 && int64(need+1)<<l > limit {
			return fmt.Errorf("store: upgrading %q needs %d clusters of %d bytes, %s (%d) holds %d: %w",
				s.cfg.Dir, need, 1<<l, what, limit, limit>>l-1, ErrNoSpace)
		}
		if limit > 0 {
			areaBytes = min(areaBytes, limit)
		}
		s.log.Infof("store: %q holds target/volume's layout: upgrading it into %d-byte clusters (%d needed)", s.cfg.Dir, 1<<l, need)
	}
	if a == nil {
		var err error
		if a, _, err = OpenFileArea(s.cfg.AreaPath, areaBytes&^int64(s.cmask), true); err != nil {
			return fmt.Errorf("store: %q: %w", s.cfg.Dir, err)
		}
	}
	s.useArea(a)
	if a.Align() > 1<<l {
		return fmt.Errorf("store: data area alignment %d above the cluster size %d: %w", a.Align(), 1<<l, ErrInvalid)
	}
	device := s.cfg.AreaDevice != ""
	s.format = formatRecord{state: formatCreating, clusterL: l, clusters: uint64(a.Size()) >> l, device: device, lazy: unzeroed(a)}
	if device {
		s.format.path = s.cfg.AreaDevice
	}
	if s.format.clusters < 2 {
		return fmt.Errorf("store: data area of %d bytes holds fewer than two clusters: %w", a.Size(), ErrInvalid)
	}
	if s.format.clusters > physMask {
		return fmt.Errorf("store: data area of %d bytes holds %d clusters, more than a map entry can name (%d): %w", a.Size(), s.format.clusters, physMask, ErrInvalid)
	}
	if _, err := rand.Read(s.format.uuid[:]); err != nil {
		return fmt.Errorf("store: uuid: %w: %w", ErrIO, err)
	}
	if device {
		if err := s.prepareDevice(); err != nil {
			return err
		}
	}
	if err := s.startFormat(); err != nil {
		return err
	}
	return s.initArea()
}

// checkEmpty refuses a pebble directory that holds keys but no store
// format (and is not target/volume's, which Open upgrades).
func (s *Store) checkEmpty() error {
	it, err := s.db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("store: %q: %w: %w", s.cfg.Dir, ErrIO, err)
	}
	var first []byte
	if it.First() {
		first = slices.Clone(it.Key())
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: %q: %w: %w", s.cfg.Dir, ErrIO, err)
	}
	switch {
	case first == nil:
		return nil
	case first[0] >= 'a' && first[0] <= 'z':
		return fmt.Errorf("store: %q holds keys of another layout (key %q) and no format key: %w", s.cfg.Dir, first, ErrCorrupt)
	}
	return fmt.Errorf("store: %q holds keys but no store format (key %q): %w", s.cfg.Dir, first, ErrCorrupt)
}

// startFormat writes the format record (state creating) and, for a lazy
// area, the zeroed watermark at cluster 1 (only the header's cluster is
// ours), in one synced batch: no moment exists where a lazy store's
// record is durable without its watermark.
func (s *Store) startFormat() error {
	b := s.db.NewBatch()
	_ = b.Set(formatKey, s.format.record(), nil)
	if s.format.lazy {
		_ = b.Set(zeroedKey, zeroedValue(1), nil)
	}
	if err := s.commit(b, true); err != nil {
		return fmt.Errorf("store: write format: %w", err)
	}
	return nil
}

func (s *Store) putFormat() error {
	if err := s.db.Set(formatKey, s.format.record(), pebble.Sync); err != nil {
		return fmt.Errorf("store: write format: %w: %w", ErrIO, err)
	}
	return s.err()
}

// initArea writes the header into cluster 0, syncs, and marks the store
// ready. Every other cluster of a new file area reads zeros (it is
// fallocated); a lazy area's are zeroed as refills first pick them.
func (s *Store) initArea() error {
	hdr := alignedBuf(max(4096, s.align), s.align)
	f := s.format
	f.state = formatReady
	f.encodeHeader(hdr)
	if err := s.area.WriteAt(hdr, 0); err != nil {
		return fmt.Errorf("store: write the data area header: %w: %w", ErrIO, err)
	}
	if err := s.area.Sync(); err != nil {
		return fmt.Errorf("store: sync the data area: %w: %w", ErrIO, err)
	}
	s.format = f
	return s.putFormat()
}

// load reads every volume record, map key and reservation, rebuilds the
// allocator, and repairs (unless read-only) what a crash interrupted.
func (s *Store) load() error {
	s.al.init(s.format.clusters)
	if err := s.loadZeroed(); err != nil {
		return err
	}
	if err := s.loadNextMap(); err != nil {
		return err
	}
	byMap := map[uint64]*Volume{}
	all := map[ID]*Volume{}
	var deleting, merging []*Volume
	err := s.scan(familyVolume, func(k, v []byte) error {
		id, ok := volumeKeyID(k)
		if !ok {
			return fmt.Errorf("store: volume key %x: %w", k, ErrCorrupt)
		}
		r, err := decodeVolumeRecord(id, v)
		if err != nil {
			return err
		}
		if byMap[r.mapID] != nil {
			return fmt.Errorf("store: volume %d: map %d shared with another object: %w", id, r.mapID, ErrCorrupt)
		}
		if r.mapID >= s.nextMap && s.nextMap != 0 {
			// A volume a release before snapshots created with an ID in
			// the counter's range: the counter goes past it (0: none left).
			s.nextMap = r.mapID + 1
		}
		vol := newVolume(s, r)
		byMap[r.mapID] = vol
		all[id] = vol
		switch r.info.State {
		case stateDeleting:
			deleting = append(deleting, vol)
		case stateMerging:
			merging = append(merging, vol)
		default:
			s.vols[id] = vol
		}
		return nil
	})
	if err != nil {
		return err
	}
	order, err := parentsFirst(all)
	if err != nil {
		return err
	}
	type orphan struct{ m, idx, phys uint64 }
	var trim []orphan // map keys past a volume's end, of a deleting volume, or of no volume; tombstones of parentless maps
	checkKey := func(m, idx, phys uint64) error {
		if phys >= s.al.clusters {
			return fmt.Errorf("store: map %d index %d names cluster %d, outside the area: %w", m, idx, phys, ErrCorrupt)
		}
		if phys == 0 {
			return nil // a tombstone: no cluster
		}
		if phys >= s.al.zeroed {
			return fmt.Errorf("store: map %d index %d names cluster %d, at or past the zeroed watermark %d (never zeroed): %w", m, idx, phys, s.al.zeroed, ErrCorrupt)
		}
		if !s.al.markUsed(phys) {
			return fmt.Errorf("store: cluster %d is mapped twice (map %d index %d): %w", phys, m, idx, ErrCorrupt)
		}
		return nil
	}
	// Parents first, one key range per map: a child's table starts as its
	// parent's top (pages shared) and its own keys path-copy what they
	// change.
	for _, vol := range order {
		if vol.parent != nil {
			vol.m = vol.parent.m.share(vol.mapID)
			vol.m.resize(vol.clusters())
		}
		err := s.scanMap(vol.mapID, func(k, v []byte) error {
			m, idx, ok := parseMapKey(k)
			e, okv := parsePhys(v)
			if !ok || !okv || s.badPartial(e) {
				return fmt.Errorf("store: map key %x = %x: %w", k, v, ErrCorrupt)
			}
			phys := physOf(e)
			if err := checkKey(m, idx, phys); err != nil {
				return err
			}
			if vol.info.State == stateDeleting || idx >= vol.clusters() || (phys == 0 && vol.parent == nil) {
				trim = append(trim, orphan{m, idx, phys})
				return nil
			}
			if phys == 0 {
				vol.m.set(idx, tombstone)
				return nil
			}
			vol.m.set(idx, e)
			vol.allocated.Add(1)
			s.al.mapped++
			return nil
		})
		if err != nil {
			return err
		}
	}
	err = s.scanOrphanMaps(byMap, func(k, v []byte) error {
		m, idx, ok := parseMapKey(k)
		e, okv := parsePhys(v)
		if !ok || !okv {
			return fmt.Errorf("store: map key %x = %x: %w", k, v, ErrCorrupt)
		}
		phys := physOf(e)
		if err := checkKey(m, idx, phys); err != nil {
			return err
		}
		trim = append(trim, orphan{m, idx, phys})
		return nil
	})
	if err != nil {
		return err
	}
	var reserved, stale []uint64
	err = s.scan(familyReserved, func(k, _ []byte) error {
		p, ok := parseReservedKey(k)
		if !ok || p == 0 || p >= s.al.clusters {
			return fmt.Errorf("store: reservation key %x: %w", k, ErrCorrupt)
		}
		if p >= s.al.zeroed {
			return fmt.Errorf("store: cluster %d reserved at or past the zeroed watermark %d (never zeroed): %w", p, s.al.zeroed, ErrCorrupt)
		}
		if !s.al.markUsed(p) {
			stale = append(stale, p) // mapped: cannot happen (map commits delete it); the map wins
			return nil
		}
		reserved = append(reserved, p)
		return nil
	})
	if err != nil || s.cfg.ReadOnly {
		return err
	}
	// Repair. Every cluster that may hold bytes no map names is zeroed and
	// the zeroing synced before anything can hand it out.
	zero := slices.Clone(reserved)
	for _, o := range trim {
		if o.phys != 0 {
			zero = append(zero, o.phys)
		}
	}
	if err := s.zeroClusters(zero); err != nil {
		return err
	}
	s.c.zeroedAtOpen.Store(uint64(len(zero)))
	if len(zero) > 0 {
		if err := s.syncArea(); err != nil {
			return err
		}
	}
	b := s.db.NewBatch()
	var key [mapKeyLen]byte
	for _, o := range trim {
		putMapKey(key[:], o.m, o.idx)
		_ = b.Delete(key[:], nil)
	}
	for _, p := range stale {
		putReservedKey(key[:], p)
		_ = b.Delete(key[:reservedKeyLen], nil)
		s.log.Errorf("store: cluster %d was both mapped and reserved; kept mapped", p)
	}
	for _, vol := range deleting {
		_ = b.Delete(volumeKey(vol.id), nil)
	}
	if b.Empty() {
		_ = b.Close()
	} else if err := s.commit(b, true); err != nil {
		return fmt.Errorf("store: repair: %w", err)
	}
	for _, o := range trim {
		if o.phys != 0 {
			s.al.release(o.phys)
		}
	}
	s.al.pushReady(reserved)
	if n := len(trim) + len(reserved) + len(deleting); n > 0 {
		s.log.Infof("store: open: %d reserved clusters zeroed, %d clusters of deleted or shrunk volumes released, %d deletes finished",
			len(reserved), len(trim), len(deleting))
	}
	return s.finishMerges(merging, all)
}

// loadZeroed sets the allocator's zeroed watermark: the 'Z' key of a lazy
// store (ErrCorrupt if missing or outside the area), else the area's end
// (a file; a device store written by a release that zeroed the whole
// device at creation, which wrote no key).
func (s *Store) loadZeroed() error {
	if !s.format.lazy {
		return nil
	}
	v, closer, err := s.db.Get(zeroedKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("store: %q: a lazily zeroed area without its zeroed watermark: %w", s.cfg.Dir, ErrCorrupt)
	}
	if err != nil {
		return fmt.Errorf("store: %q: read the zeroed watermark: %w: %w", s.cfg.Dir, ErrIO, err)
	}
	w, ok := parseZeroed(v)
	_ = closer.Close()
	if !ok || w < 1 || w > s.al.clusters {
		return fmt.Errorf("store: %q: zeroed watermark %x in an area of %d clusters: %w", s.cfg.Dir, v, s.al.clusters, ErrCorrupt)
	}
	s.al.zeroed = w
	return nil
}

// scan calls fn for every key of one family.
func (s *Store) scan(family byte, fn func(k, v []byte) error) error {
	return s.scanRange([]byte{family}, []byte{family + 1}, fn)
}

// scanRange calls fn for every key in [lo, hi).
func (s *Store) scanRange(lo, hi []byte, fn func(k, v []byte) error) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("store: %w: %w", ErrIO, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err == nil {
			err = fn(it.Key(), v)
		} else {
			err = fmt.Errorf("store: %w: %w", ErrIO, err)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: %w: %w", ErrIO, err)
	}
	return nil
}

// zeroClusters zeroes each cluster, one Area.Zero per run of consecutive
// clusters. Sorts ps.
func (s *Store) zeroClusters(ps []uint64) error {
	slices.Sort(ps)
	for i := 0; i < len(ps); {
		j := i + 1
		for j < len(ps) && ps[j] == ps[j-1]+1 {
			j++
		}
		if err := s.area.Zero(int64(ps[i])<<s.cshift, int64(j-i)<<s.cshift); err != nil {
			return fmt.Errorf("store: zero clusters %d-%d: %w: %w", ps[i], ps[j-1], ErrIO, err)
		}
		i = j
	}
	return nil
}

// syncArea syncs the data area; a failure fails the store (the kernel may
// have dropped what it could not write: nothing later may be acknowledged
// on the strength of it).
func (s *Store) syncArea() error {
	s.c.areaSyncs.Add(1)
	if err := s.area.Sync(); err != nil {
		err = fmt.Errorf("store: sync the data area: %w: %w", ErrIO, err)
		s.fail(err)
		return err
	}
	return nil
}

// CreateOptions describes a new volume.
type CreateOptions struct {
	SizeBytes uint64 // a positive multiple of BlockSize, at most MaxSizeBytes; nothing is allocated
	BlockSize uint32 // BlockSize4K or BlockSize512; 0 means DefaultBlockSize
}

// Create makes a new, empty (all zeros, nothing allocated) volume.
func (s *Store) Create(id ID, o CreateOptions) (*Volume, error) {
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if err := checkShape(o.SizeBytes, o.BlockSize); err != nil {
		return nil, fmt.Errorf("volume %d: create: %w", id, err)
	}
	if int(o.BlockSize) < s.align {
		return nil, fmt.Errorf("volume %d: create: block size %d below the data area's direct-I/O alignment %d: %w",
			id, o.BlockSize, s.align, ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(id, "create"); err != nil {
		return nil, err
	}
	if _, ok := s.vols[id]; ok {
		return nil, fmt.Errorf("volume %d: create: %w", id, ErrExists)
	}
	r := volumeRecord{info: Info{ID: id, SizeBytes: o.SizeBytes, BlockSize: o.BlockSize, State: StateOnline}, mapID: uint64(id)}
	b := s.db.NewBatch()
	if uint64(id) >= firstMapID {
		// An ID in the 'N' counter's range takes its map from the counter,
		// so no two objects ever name one map.
		m, err := s.takeMapID(b)
		if err != nil {
			_ = b.Close()
			return nil, fmt.Errorf("volume %d: create: %w", id, err)
		}
		r.mapID = m
	}
	_ = b.Set(volumeKey(id), r.encode(), nil)
	if err := s.commit(b, true); err != nil {
		return nil, fmt.Errorf("volume %d: create: %w", id, err)
	}
	if uint64(id) >= firstMapID {
		s.nextMap = r.mapID + 1 // 0 past the last: none left
	}
	v := newVolume(s, r)
	s.vols[id] = v
	return v, nil
}

func (s *Store) putRecord(r volumeRecord) error {
	b := s.db.NewBatch()
	_ = b.Set(volumeKey(r.info.ID), r.encode(), nil)
	return s.commit(b, true)
}

// Volume returns the handle of an existing volume.
func (s *Store) Volume(id ID) (*Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("volume %d: %w", id, ErrClosed)
	}
	v, ok := s.vols[id]
	if !ok {
		return nil, fmt.Errorf("volume %d: %w", id, ErrNotFound)
	}
	return v, nil
}

// List returns every volume's Info in ID order.
func (s *Store) List() ([]Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("store: list: %w", ErrClosed)
	}
	out := make([]Info, 0, len(s.vols))
	for _, v := range s.vols {
		v.mu.RLock()
		out = append(out, v.info)
		v.mu.RUnlock()
	}
	slices.SortFunc(out, func(a, b Info) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// Delete removes a volume and releases its clusters: the record is marked
// deleting (synced), the clusters are zeroed and the area synced, then the
// map and the record go in one synced batch and the clusters are free. A
// crash in between is finished by Open. It waits for requests in flight.
func (s *Store) Delete(id ID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(id, "delete"); err != nil {
		return err
	}
	v, ok := s.vols[id]
	if !ok {
		return fmt.Errorf("volume %d: delete: %w", id, ErrNotFound)
	}
	cs := s.children(v)
	if len(cs) > 1 {
		return fmt.Errorf("volume %d: delete: %d objects read through it (%d...): %w", id, len(cs), cs[0].id, ErrHasChildren)
	}
	if len(cs) == 1 {
		return s.deleteMerging(v, cs[0])
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	r := v.record()
	r.info.State = stateDeleting
	if err := s.putRecord(r); err != nil {
		return fmt.Errorf("volume %d: delete: %w", id, err)
	}
	v.gone = ErrNotFound
	delete(s.vols, id)
	if err := s.release(v, 0, func(b *pebble.Batch) { _ = b.Delete(volumeKey(id), nil) }); err != nil {
		return fmt.Errorf("volume %d: delete (finished at the next open): %w", id, err)
	}
	return nil
}

// release frees every cluster of v at index from or later: zero them,
// sync the area, then one synced batch deletes their map keys (plus what
// extra adds), and they are free at once (their free is durable and they
// read zeros). Requires v.mu held exclusively.
func (s *Store) release(v *Volume, from uint64, extra func(*pebble.Batch)) error {
	var idx, ps []uint64
	v.m.each(from, ^uint64(0), func(i, e uint64) {
		if owned(e) { // a parent's clusters and tombstones are not v's to free
			idx, ps = append(idx, i), append(ps, physOf(e))
		}
	})
	if len(ps) > 0 {
		if err := s.zeroClusters(slices.Clone(ps)); err != nil {
			return err
		}
		if err := s.syncArea(); err != nil {
			return err
		}
	}
	s.hook(hookReleaseZeroed)
	b := s.db.NewBatch()
	var lo, hi [mapKeyLen]byte
	putMapKey(lo[:], v.mapID, from)
	putMapEnd(hi[:], v.mapID)
	_ = b.DeleteRange(lo[:], hi[:], nil)
	if extra != nil {
		extra(b)
	}
	if err := s.commit(b, true); err != nil {
		return err
	}
	for _, i := range idx {
		v.m.set(i, 0)
	}
	v.allocated.Add(-int64(len(ps)))
	s.al.mu.Lock()
	for _, p := range ps {
		s.al.release(p)
	}
	s.al.mapped -= uint64(len(ps))
	s.al.mu.Unlock()
	return nil
}

// Resize changes a volume's size. Growing zeroes the blocks past the old
// end in its last cluster first (they may hold what a shrink left), so the
// new blocks read zeros. Shrinking fails with ErrWouldLoseData if a
// cluster past the new end is allocated, or the blocks past it in the new
// last cluster are not zeros, unless force; then the new size is committed
// first and the clusters past it released. It waits for requests in
// flight.
func (s *Store) Resize(id ID, sizeBytes uint64, force bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(id, "resize"); err != nil {
		return err
	}
	v, ok := s.vols[id]
	if !ok {
		return fmt.Errorf("volume %d: resize: %w", id, ErrNotFound)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	r := v.record()
	if err := checkShape(sizeBytes, r.info.BlockSize); err != nil {
		return fmt.Errorf("volume %d: resize: %w", id, err)
	}
	old := r.info.SizeBytes
	switch {
	case r.info.Kind == KindSnapshot && sizeBytes == old:
		return nil // nothing to do, and a snapshot's clusters are never written (not even its tail)
	case r.info.Kind == KindSnapshot:
		return fmt.Errorf("volume %d: resize: a snapshot's size is fixed: %w", id, ErrInvalid)
	case v.parent != nil && sizeBytes < old:
		// A regrown object would read its parent's clusters past the old
		// end again (docs/snapshots.md §1.9).
		return fmt.Errorf("volume %d: shrink from %d to %d bytes: it has a parent (%d): %w", id, old, sizeBytes, v.parent.id, ErrInvalid)
	}
	r.info.SizeBytes = sizeBytes
	newClusters := (sizeBytes + s.cmask) >> s.cshift
	if sizeBytes >= old {
		if err := s.zeroTail(v, old); err != nil {
			return fmt.Errorf("volume %d: resize: %w", id, err)
		}
		v.m.resize(newClusters)
		if err := s.putRecord(r); err != nil {
			return fmt.Errorf("volume %d: resize: %w", id, err)
		}
		v.setRecord(r)
		return nil
	}
	written, err := s.writtenPast(v, sizeBytes, old)
	if err != nil {
		return fmt.Errorf("volume %d: resize: %w", id, err)
	}
	if written && !force {
		return fmt.Errorf("volume %d: resize from %d to %d bytes: %w", id, old, sizeBytes, ErrWouldLoseData)
	}
	if err := s.putRecord(r); err != nil {
		return fmt.Errorf("volume %d: resize: %w", id, err)
	}
	v.setRecord(r)
	s.hook(hookSizeCommitted)
	if err := s.release(v, newClusters, nil); err != nil {
		return fmt.Errorf("volume %d: resize (finished at the next open): %w", id, err)
	}
	v.m.resize(newClusters)
	return nil
}

// zeroTail zeroes the bytes from end to the end of its cluster, if that
// cluster is allocated, and syncs: a shrink leaves them as they were. A
// parent's cluster there is copied on write with zeros (its bytes past
// end may be what a shrink of the parent left).
func (s *Store) zeroTail(v *Volume, end uint64) error {
	in := end & s.cmask
	if in == 0 {
		return nil
	}
	idx := end >> s.cshift
	e := v.m.get(idx)
	switch {
	case inPlace(e):
		if err := s.area.Zero(int64(e<<s.cshift+in), int64(s.cmask+1-in)); err != nil {
			return fmt.Errorf("zero past the end: %w: %w", ErrIO, err)
		}
	case physOf(e) != 0:
		if _, err := v.firstWrite(idx, in, s.zeroBuf[:s.cmask+1-in]); err != nil {
			return fmt.Errorf("zero past the end: %w", err)
		}
	default:
		return nil
	}
	return s.syncArea()
}

// writtenPast says whether v holds data in [from, to): an allocated
// cluster wholly past from, or non-zero bytes in the cluster holding from.
func (s *Store) writtenPast(v *Volume, from, to uint64) (bool, error) {
	first := (from + s.cmask) >> s.cshift
	found := false
	v.m.each(first, ^uint64(0), func(uint64, uint64) { found = true })
	in := from & s.cmask
	if found || in == 0 {
		return found, nil
	}
	if physOf(v.m.get(from>>s.cshift)) == 0 {
		return false, nil
	}
	n := min(s.cmask+1, to-(from&^s.cmask)) - in
	buf := alignedBuf(int(n), s.align)
	if err := v.readPartial(from>>s.cshift, in, buf); err != nil {
		return false, err
	}
	return slices.ContainsFunc(buf, func(c byte) bool { return c != 0 }), nil
}

// SetState sets a volume's persisted state. It waits for requests in
// flight.
func (s *Store) SetState(id ID, state State) error {
	if !state.valid() {
		return fmt.Errorf("volume %d: set state %v: %w", id, state, ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(id, "set state"); err != nil {
		return err
	}
	v, ok := s.vols[id]
	if !ok {
		return fmt.Errorf("volume %d: set state: %w", id, ErrNotFound)
	}
	if v.info.Kind == KindSnapshot {
		return fmt.Errorf("volume %d: set state %v: a snapshot is read-only: %w", id, state, ErrInvalid)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	r := v.record()
	r.info.State = state
	if err := s.putRecord(r); err != nil {
		return fmt.Errorf("volume %d: set state: %w", id, err)
	}
	v.setRecord(r)
	return nil
}

// Flush makes every write acknowledged before it durable, on every volume.
func (s *Store) Flush() error {
	if err := s.flush(); err != nil {
		return fmt.Errorf("store: flush: %w", err)
	}
	return nil
}

// flush: zero the limbo clusters, sync the area, sync pebble's WAL, then
// limbo joins the ready pool. The area first: a WAL sync must never make
// durable a map key whose data an acknowledged Flush covered but the area
// had not synced. Free when nothing was written since the last flush.
func (s *Store) flush() error {
	_, err := s.flushRound()
	return err
}

// flushRound is flush, also reporting whether it had anything to make
// durable (the background syncer counts only the rounds that did).
func (s *Store) flushRound() (synced bool, err error) {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	if s.dbClosed {
		return false, ErrClosed
	}
	if err := s.err(); err != nil {
		return false, err
	}
	if s.cfg.ReadOnly {
		return false, nil
	}
	seq := s.seq.Load()
	s.al.mu.Lock()
	limbo := s.al.takeLimbo()
	s.al.mu.Unlock()
	if s.flushedSeq.Load() >= seq && len(limbo) == 0 && s.def.n.Load() == 0 {
		return false, nil
	}
	s.c.flushes.Add(1)
	back := func(err error) error {
		s.al.mu.Lock()
		s.al.limbo = append(s.al.limbo, limbo...)
		s.al.mu.Unlock()
		return err
	}
	if err := s.zeroClusters(limbo); err != nil {
		return false, back(err)
	}
	s.hook(hookLimboZeroed)
	if err := s.syncAll(); err != nil {
		return false, back(err)
	}
	if err := s.err(); err != nil {
		return false, back(err)
	}
	maxStore(&s.flushedSeq, seq)
	s.al.mu.Lock()
	s.al.pushReady(limbo)
	s.al.mu.Unlock()
	return true, nil
}

// syncAll is a flush's durable part: the area synced, then the WAL with
// the deferred map keys (deferred.go) taken before the area sync, whose
// bytes were written before they were deferred, so the sync holds them.
// Under drainMu, released before the caller takes the allocator's lock
// (a refill holds that lock across its commit, which takes drainMu). A
// sync failure fails the store.
func (s *Store) syncAll() error {
	s.def.drainMu.Lock()
	defer s.def.drainMu.Unlock()
	d := s.db.NewBatch()
	n := s.takeDeferred(d)
	if err := s.syncArea(); err != nil {
		_ = d.Close()
		return err
	}
	s.hook(hookAreaSynced)
	if n == 0 {
		_ = d.Close()
		if err := s.db.LogData(nil, pebble.Sync); err != nil {
			err = fmt.Errorf("store: sync the WAL: %w: %w", ErrIO, err)
			s.fail(err)
			return err
		}
		return nil
	}
	if err := s.apply(d, true); err != nil {
		s.fail(err)
		return err
	}
	s.c.deferredCommits.Add(uint64(n))
	s.hook(hookDeferredCommitted)
	return nil
}

func maxStore(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if old >= v || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// takeCluster pops a ready cluster for a first write: refilling the ready
// pool from the free clusters (one synced commit of their 'R' keys), or,
// with none free, flushing so that limbo becomes ready. ErrNoSpace if the
// area is full. A pop that leaves the pool below its low-water mark wakes
// the background refill (refill.go).
func (s *Store) takeCluster() (uint64, error) {
	for attempt := 0; ; attempt++ {
		s.al.mu.Lock()
		for s.al.readyLen() == 0 && s.al.free == 0 && s.al.refilling {
			// A refill (the background's, say) is reserving what were the
			// last free clusters: they are ready when it ends (or free
			// again if it fails), not a reason to fail for space.
			s.al.awaitRefill()
		}
		if p, ok := s.al.popReady(); ok {
			s.kickRefill()
			s.al.mu.Unlock()
			return p, nil
		}
		if s.al.free > 0 {
			_, err := s.refill(s.inlineRefill(), 1)
			if err == nil {
				s.al.refillFailed = false // the path works again: the background may retry
			}
			s.al.mu.Unlock()
			if err != nil {
				return 0, err
			}
			s.hook(hookReserved)
			continue
		}
		limbo := len(s.al.limbo) > 0
		if !limbo || attempt > 1 {
			grew, err := s.grow()
			s.al.mu.Unlock()
			if err != nil {
				return 0, err
			}
			if grew && attempt < 4 {
				continue
			}
			return 0, fmt.Errorf("%d clusters of %d bytes, none free: %w", s.al.clusters-1, s.cmask+1, ErrNoSpace)
		}
		s.al.mu.Unlock()
		if err := s.flush(); err != nil {
			return 0, err
		}
	}
}

// takeFollowing pops into out the ready clusters that follow p physically
// (p+1, p+2, ...) while they are next in the pool, and returns how many:
// a first write of several clusters then writes them with one write. The
// pool hands out a fresh area's clusters in ascending runs, so a first
// write gets a contiguous run unless another took a cluster in between.
func (s *Store) takeFollowing(p uint64, out []uint64) int {
	if len(out) == 0 {
		return 0
	}
	s.al.mu.Lock()
	defer s.al.mu.Unlock()
	n := 0
	for n < len(out) && s.al.readyLen() > 0 && s.al.ready[s.al.head] == p+uint64(n)+1 {
		out[n], _ = s.al.popReady()
		n++
	}
	if n > 0 {
		s.kickRefill()
	}
	return n
}

// inlineRefill is how many clusters a first write that found the pool
// empty reserves on its path: ReadyClusters without the background
// refill; with it an eighth of that (8 MiB at the defaults), the
// background refill, which its take wakes, reserving the rest. So the
// first write of a fresh store, or one that outran the background, pays
// for a small run (its zeroing and the syncs), not a pool's.
func (s *Store) inlineRefill() int {
	if s.refillKick == nil {
		return s.cfg.ReadyClusters
	}
	return max(s.cfg.ReadyClusters/8, 1)
}

// grow extends a growable area by an eighth, at least ReadyClusters
// clusters, within Config.AreaMaxBytes and the filesystem's free space
// above the space guard's reserve: fallocate and fsync the file, then
// record the new cluster count in the format record (synced). A crash in
// between leaves a larger file than recorded, which the next growth
// reuses. false if the area cannot grow. Requires s.al.mu.
// growStep bounds one growth of a file area: 256 MiB, so a 16 GiB area
// holds at most 1.6% of its size ahead of the data (an eighth would be 2
// GiB); a growth (an fallocate and a synced format record) costs a few
// ms, once per 256 MiB of first writes.
const growStep = 256 << 20

func (s *Store) grow() (bool, error) {
	g, ok := s.area.(Grower)
	if !ok || s.cfg.ReadOnly || s.format.device { // a device is the whole area
		return false, nil
	}
	old := s.al.clusters
	// An eighth of the area, at most growStep (the space taken ahead of
	// the data stays under 1/8 of a small area and growStep of a large
	// one), at least a ready pool's worth.
	n := max(min(old/8, growStep>>s.cshift), uint64(s.cfg.ReadyClusters))
	if m := s.cfg.AreaMaxBytes; m > 0 {
		n = min(n, max(uint64(m)>>s.cshift, old)-old)
	}
	if s.spaceMonitored.Load() {
		free, reserve := s.freeBytes.Load(), s.reserve.Load()
		if free <= reserve {
			return false, nil
		}
		n = min(n, (free-reserve)>>s.cshift)
	}
	if n == 0 {
		return false, nil
	}
	size := int64(old+n) << s.cshift
	if err := g.Grow(size); err != nil {
		s.log.Errorf("store: the data area could not grow to %d bytes: %v", size, err)
		return false, nil
	}
	s.hook(hookGrown)
	f := s.format
	f.clusters = old + n
	if err := s.db.Set(formatKey, f.record(), pebble.Sync); err != nil {
		return false, fmt.Errorf("store: record the area's growth: %w: %w", ErrIO, err)
	}
	if err := s.err(); err != nil {
		return false, err
	}
	s.format = f
	s.al.grow(old + n)
	if !f.lazy {
		s.al.zeroed = s.al.clusters // the new bytes read zeros (Grower)
	}
	s.log.Infof("store: data area grown from %d to %d clusters of %d bytes", old, old+n, s.cmask+1)
	return true, nil
}

// refill tops the ready pool up to target clusters from the free ones,
// unless it holds enough already (the first write that found it empty
// asks for inlineRefill with enough 1; the background refill for
// ReadyClusters with enough its low-water mark). Their 'R' keys are
// committed synced before any of them is written, so Open finds and zeroes
// any that a crash left written but unmapped. Clusters picked at or past
// the zeroed watermark (a lazy area) are zeroed first, one Area.Zero for
// the run [watermark, highest picked], the area synced, and the new
// watermark committed with the 'R' keys: a crash before that commit
// leaves the watermark where it was and the run is zeroed again next
// time. The zeroing, the sync and the commit run without s.al.mu (tens
// of ms for 64 MiB where the device writes the zeros, a WAL sync
// anyway: flushes, frees, Stats and the first writes that find a ready
// cluster go on meanwhile); the picked clusters are marked used, so
// nobody else takes them. One refill runs so at a time (refilling):
// another waits for it before it picks (its run would start at the same
// watermark and could zero, late, a cluster the first had handed out and
// a write filled; or commit a watermark above a run not yet synced), then
// returns if the pool holds enough. Requires s.al.mu (released and taken
// again). n is the clusters it reserved.
func (s *Store) refill(target, enough int) (n int, err error) {
	for s.al.refilling {
		s.al.awaitRefill()
	}
	have := s.al.readyLen()
	if have >= enough || have >= target {
		return 0, nil
	}
	ps := s.al.pickFree(uint64(target - have))
	if len(ps) == 0 {
		return 0, nil
	}
	from, w := s.al.zeroed, s.al.zeroed
	for _, p := range ps {
		w = max(w, p+1)
	}
	s.al.refilling = true
	s.al.mu.Unlock()
	err = s.reserveRun(ps, from, w)
	s.al.mu.Lock()
	s.al.refilling = false
	s.al.refillEnd.Broadcast()
	if err != nil {
		for _, p := range ps {
			s.al.release(p)
		}
		return 0, fmt.Errorf("reserve clusters: %w", err)
	}
	s.c.refills.Add(1)
	s.c.zeroedAhead.Add(w - from)
	s.al.zeroed = w
	s.al.pushReady(ps)
	return len(ps), nil
}

// reserveRun is a refill's work without s.al.mu: zero and sync the clusters
// [from, w) past the zeroed watermark from (none unless w > from), then
// commit the 'R' keys of ps and the new watermark w in one synced batch.
func (s *Store) reserveRun(ps []uint64, from, w uint64) error {
	if w > from {
		if err := s.zeroAhead(from, w); err != nil {
			return err
		}
	}
	b := s.db.NewBatch()
	var key [reservedKeyLen]byte
	for _, p := range ps {
		putReservedKey(key[:], p)
		_ = b.Set(key[:], nil, nil)
	}
	if w > from {
		_ = b.Set(zeroedKey, zeroedValue(w), nil)
	}
	return s.commit(b, true)
}

// zeroAhead zeroes clusters [from, to), which lie at or past the zeroed
// watermark (all free, holding anything), and syncs the area.
func (s *Store) zeroAhead(from, to uint64) error {
	if err := s.area.Zero(int64(from)<<s.cshift, int64(to-from)<<s.cshift); err != nil {
		return fmt.Errorf("zero clusters %d-%d: %w: %w", from, to-1, ErrIO, err)
	}
	s.hook(hookAheadZeroed)
	if err := s.syncArea(); err != nil {
		return err
	}
	s.hook(hookAheadSynced)
	return nil
}

// Close waits for requests in flight, flushes, releases the ready pool
// (releaseReady: the next Open has nothing to zero) and closes pebble and
// the area. Every handle fails with ErrClosed afterwards.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.stopSpaceGuard()
	for _, v := range s.vols {
		v.mu.Lock()
		v.gone = ErrClosed
		v.mu.Unlock()
	}
	s.stopRefiller()
	s.stopSyncer()
	var err error
	if s.err() == nil && !s.cfg.ReadOnly {
		if err = s.flush(); err == nil {
			err = s.releaseReady()
		}
	}
	s.flushMu.Lock()
	s.dbClosed = true
	s.flushMu.Unlock()
	if cerr := s.db.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("store: close: %w: %w", ErrIO, cerr)
	}
	if cerr := s.area.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("store: close: %w: %w", ErrIO, cerr)
	}
	if ferr := s.err(); ferr != nil && err == nil {
		err = fmt.Errorf("store: close: %w", ferr)
	}
	return err
}

// adminCheck is the precondition of administrative calls. Requires s.mu.
func (s *Store) adminCheck(id ID, op string) error {
	if s.closed {
		return fmt.Errorf("volume %d: %s: %w", id, op, ErrClosed)
	}
	if s.cfg.ReadOnly {
		return fmt.Errorf("volume %d: %s: store opened read-only: %w", id, op, ErrReadOnly)
	}
	if err := s.err(); err != nil {
		return fmt.Errorf("volume %d: %s: %w", id, op, err)
	}
	return nil
}

// commit applies b (synced if sync), and releases it on success; ErrIO if
// pebble failed, including a fatal error pebble reported to its logger.
// commit commits b, after the deferred map keys waiting (deferred.go) if
// there are any. It always takes drainMu: a drain in progress (a flush's)
// holds keys it took, not yet committed, that must land before b (a free
// of the same index after them, say); seeing none waiting is not enough.
func (s *Store) commit(b *pebble.Batch, sync bool) error {
	s.def.drainMu.Lock()
	defer s.def.drainMu.Unlock()
	return s.commitWithDeferred(b, sync)
}

// apply commits b alone.
func (s *Store) apply(b *pebble.Batch, sync bool) error {
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	if err := s.db.Apply(b, opts); err != nil {
		return fmt.Errorf("%w: %w", ErrIO, err)
	}
	if err := s.err(); err != nil {
		return err
	}
	return b.Close()
}

// Health returns nil while the store is usable, else the error that
// failed it.
func (s *Store) Health() error { return s.err() }

func (s *Store) err() error {
	if p := s.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *Store) fail(err error) {
	if s.fatal.CompareAndSwap(nil, &err) {
		s.log.Errorf("store: failed, every request now fails until a reopen: %v", err)
	}
}

// Stats is the store's space and its counters.
type Stats struct {
	ClusterBytes uint64
	// Clusters in the area (the header's included); Free, Ready (reserved,
	// zero, next to be handed out), Limbo (freed, waiting for a flush),
	// Mapped (named by a volume's map).
	Clusters, Free, Ready, Limbo, Mapped uint64
	// Refills of the ready pool (one synced commit each), MapCommits (first
	// writes), Frees (free batches), Flushes that synced, AreaSyncs,
	// BounceCopies (requests whose buffer was not aligned), BackgroundSyncs
	// (flushes of the background syncer).
	Refills, MapCommits, Frees, Flushes, AreaSyncs, BounceCopies, BackgroundSyncs uint64
	// ZeroedAtOpen: clusters Open zeroed (and synced) before reuse, the
	// reservations and interrupted deletes or shrinks a crash left; 0
	// after a clean Close, which releases the ready pool.
	ZeroedAtOpen uint64
	// Zeroed is the zeroed watermark (docs/store.md): every cluster below
	// it reads zeros when free; Clusters on a file area, where every new
	// cluster does. ZeroedAhead counts the clusters refills zeroed (and
	// synced) at or past it, on a lazily zeroed area (a block device),
	// before first handing them out.
	Zeroed, ZeroedAhead uint64
	// BackgroundRefills are the Refills the background refill made (a
	// first write left the pool below Config.ReadyLowClusters; the rest
	// were made by a first write that found the pool empty, on its path);
	// BackgroundRefillErrors the rounds that failed (logged; the pool is
	// then refilled by first writes, as without it, until one succeeds).
	BackgroundRefills, BackgroundRefillErrors uint64
	// CopiesOnWrite: first writes (and partial write zeroes) that replaced
	// a parent's cluster with one of the object's own (docs/snapshots.md
	// §1.3): covering it whole, or redirected into a partial cluster
	// (Redirects of them; a flatten's copies are redirects too).
	CopiesOnWrite, Redirects uint64
	// DeferredKeys: map keys of such writes (and of partial clusters
	// written again) committed after an area sync, by a flush or another
	// commit (docs/snapshots.md §1.3).
	DeferredKeys uint64
}

// Stats returns the store's space and counters.
func (s *Store) Stats() Stats {
	s.al.mu.Lock()
	st := Stats{ClusterBytes: s.cmask + 1, Clusters: s.al.clusters, Free: s.al.free,
		Ready: uint64(s.al.readyLen()), Limbo: uint64(len(s.al.limbo)), Mapped: s.al.mapped, Zeroed: s.al.zeroed}
	s.al.mu.Unlock()
	st.Refills, st.MapCommits, st.Frees = s.c.refills.Load(), s.c.mapCommits.Load(), s.c.frees.Load()
	st.Flushes, st.AreaSyncs, st.BounceCopies = s.c.flushes.Load(), s.c.areaSyncs.Load(), s.c.bounces.Load()
	st.BackgroundSyncs, st.ZeroedAtOpen, st.ZeroedAhead = s.c.bgSyncs.Load(), s.c.zeroedAtOpen.Load(), s.c.zeroedAhead.Load()
	st.BackgroundRefills, st.BackgroundRefillErrors = s.c.bgRefills.Load(), s.c.bgRefillErrors.Load()
	st.Redirects = s.c.redirects.Load()
	st.CopiesOnWrite = s.c.cows.Load() + st.Redirects
	st.DeferredKeys = s.c.deferredCommits.Load()
	return st
}

// pebbleLogger is the pebble.Logger the store runs pebble with. Pebble
// calls Fatalf where it cannot continue (a failed WAL write or sync in the
// commit pipeline, a failed MANIFEST write) and expects it not to return;
// its default exits the process. A storage node must not exit because one
// disk failed, so Fatalf fails the store instead; commit checks the
// store's state after pebble returns, so a commit that pebble went on to
// report as successful is still reported as failed.
type pebbleLogger struct {
	s   *Store
	out Logger
}

func (l pebbleLogger) Infof(format string, args ...any)  { l.out.Infof(format, args...) }
func (l pebbleLogger) Errorf(format string, args ...any) { l.out.Errorf(format, args...) }
func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.s.fail(fmt.Errorf("store: pebble fatal error: %s: %w", fmt.Sprintf(format, args...), ErrIO))
}

// openHook, when set (tests), is called by Open before it loads the store:
// the upgrade's crash test sets testHook there.
var openHook func(*Store)

// useArea makes a the store's data area, saying in the log when it is a
// file the filesystem would not open with O_DIRECT.
func (s *Store) useArea(a Area) {
	s.area, s.align = a, a.Align()
	if d, ok := a.(interface{ Direct() bool }); ok && !d.Direct() && s.cfg.AreaDevice == "" {
		s.log.Infof("store: data area %s: its filesystem does not support O_DIRECT (tmpfs before Linux 6.6?): reads and writes go through the page cache, Flush and FUA still fdatasync it", s.cfg.AreaPath)
	}
}

// AreaInfo describes the data area, for the operator (blkd's start-up
// log) and for capacity planning.
type AreaInfo struct {
	// Path is the file or the block device; "" for an area a test
	// injected (Config.Area).
	Path string
	// Device says the area is a block device: Bytes is all it will ever
	// hold. A file grows (Config.AreaMaxBytes).
	Device bool
	// Bytes is the area's size now.
	Bytes int64
	// Align is its direct-I/O alignment.
	Align int
	// Direct says reads and writes bypass the page cache (O_DIRECT).
	Direct bool
}

// AreaInfo describes the data area.
func (s *Store) AreaInfo() AreaInfo {
	ai := AreaInfo{Device: s.format.device, Bytes: s.area.Size(), Align: s.align}
	if d, ok := s.area.(interface{ Direct() bool }); ok {
		ai.Direct = d.Direct()
		ai.Path = s.cfg.AreaPath
		if ai.Device {
			ai.Path = s.cfg.AreaDevice
		}
	}
	return ai
}

package volume

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Store is one storage node's pebble instance and every volume in it.
// Its methods are safe for concurrent use. Administrative calls (Create,
// Delete, Resize, SetState, Close) are serialised by one mutex and
// synchronous: each is durable when it returns. Block I/O goes through a
// *Volume handle and never takes the store's mutex.
type Store struct {
	cfg Config
	db  *pebble.DB

	// fatal holds the first error pebble reported as fatal (a failed WAL
	// write or sync, a failed MANIFEST write, detected corruption). Once
	// set the store is failed: every request returns ErrIO. See fail.
	fatal atomic.Pointer[error]
	// bgErrors counts pebble's background errors (failed flushes and
	// compactions, which pebble retries).
	bgErrors atomic.Uint64
	// log receives the store's own messages (Config.Logger).
	log Logger
	// The space guard (space.go): noSpace while free space is under the
	// reserve; the last free and total bytes read.
	noSpace               atomic.Bool
	freeBytes, totalBytes atomic.Uint64
	reserve               atomic.Uint64
	spaceMonitored        atomic.Bool
	spaceStop, spaceDone  chan struct{}
	// writeStalls counts pebble's write stalls (writes held back while
	// flushes or compactions catch up); stallNanos their total time.
	writeStalls, stallNanos atomic.Uint64
	stallStart              atomic.Int64 // UnixNano of the stall in progress, 0 if none

	// plainSeq counts plain (not FUA) mutations acknowledged; flushedSeq
	// is the plainSeq value the last successful flush covered. Flush skips
	// the WAL sync when they are equal. See Store.flush.
	plainSeq   atomic.Uint64
	flushedSeq atomic.Uint64
	// The background syncer (sync.go): syncArmed is set by the first
	// plain commit since the syncer's last round, which wakes it through
	// syncKick; bgSyncs counts the WAL syncs it made.
	syncArmed          atomic.Bool
	syncKick           chan struct{}
	syncStop, syncDone chan struct{}
	bgSyncs            atomic.Uint64
	syncRounds         atomic.Uint64 // rounds the syncer finished, synced or not (tests wait on it)
	testBeforeSync     func()        // tests only: called by the syncer before each sync
	// syncedAt is the clock() reading taken before the latest flush or
	// background sync read plainSeq: every mutation acknowledged before
	// it is synced. opened is the store's time zero.
	syncedAt atomic.Int64
	opened   time.Time

	// scratch recycles per-request key buffers and iterator options: pebble
	// keeps a pointer to the keys until the iterator or Get closer is
	// closed, so they cannot live on the caller's stack.
	scratch sync.Pool

	// batchOpts is passed to every NewBatch: it lets pebble's own batch
	// pool retain a buffer large enough for the largest write.
	batchOpts []pebble.BatchOption

	mu     sync.Mutex // guards closed and vols; serialises administrative calls
	closed bool
	vols   map[ID]*Volume
}

// scratch is the per-request state that must outlive a stack frame.
type scratch struct {
	lo, hi [dataKeyLen]byte
	iter   pebble.IterOptions
	// filters backs iter.PointKeyFilters (empty, one slot free): pebble
	// appends a filter of its own there when an sstable may hold
	// obsolete points, and with no room it would allocate on every read.
	filters [1]pebble.BlockPropertyFilter
}

var (
	syncWrite   = pebble.Sync
	noSyncWrite = pebble.NoSync
)

// Open opens (creating if needed) the store in cfg.Dir on cfg.FS and loads
// the metadata of every volume.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	s := &Store{cfg: cfg, vols: make(map[ID]*Volume), opened: time.Now()}
	s.scratch.New = func() any { return new(scratch) }
	// Every batch this package makes is at most maxBatch bytes (the
	// largest write, in 512-byte blocks: the most per-block overhead; the
	// largest point-delete batch is smaller, see Config.Validate), so
	// pebble's batch pool keeps every batch's buffer for reuse.
	maxBatch := batchBytes(cfg.MaxTransferBytes/BlockSize512, BlockSize512)
	s.batchOpts = []pebble.BatchOption{pebble.WithMaxRetainedSizeBytes(maxBatch)}

	var out Logger = pebble.DefaultLogger
	if cfg.Logger != nil {
		out = cfg.Logger
	}
	s.log = out
	cache := pebble.NewCache(cfg.CacheBytes)
	defer cache.Unref() // the DB holds its own reference
	opts := &pebble.Options{
		FS:                 cfg.FS,
		Cache:              cache,
		MemTableSize:       uint64(cfg.MemTableBytes),
		FormatMajorVersion: pebble.FormatNewest,
		ReadOnly:           cfg.ReadOnly,
		Logger:             pebbleLogger{s: s, out: out},
		EventListener: &pebble.EventListener{
			BackgroundError: func(err error) {
				s.bgErrors.Add(1)
				out.Errorf("volume: pebble background error: %v", err)
			},
			WriteStallBegin: func(pebble.WriteStallBeginInfo) {
				s.writeStalls.Add(1)
				s.stallStart.Store(time.Now().UnixNano())
			},
			WriteStallEnd: func() {
				if t := s.stallStart.Swap(0); t != 0 {
					s.stallNanos.Add(uint64(time.Now().UnixNano() - t))
				}
			},
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				s.fail(fmt.Errorf("volume: pebble: %s: %w", info, ErrCorrupt))
			},
		},
	}
	// Index blocks of 64 KiB instead of pebble's 4 KiB. A table holds one
	// data block per 4 KiB volume block, so its index has ~25 bytes per
	// 4 KiB of data: 64 KiB indexes ~10 MiB of table. Tables up to that
	// size (all of them, in a store of a few GiB) get a single-level
	// index, and a point read looks up two cached blocks instead of three
	// (measured: 4 KiB random reads from the cache 5-8% faster). Larger
	// tables keep a two-level index, with second-level blocks covering
	// ~10 MiB each, so a cold read never has to load a table's whole index.
	for i := range opts.Levels {
		opts.Levels[i].IndexBlockSize = 64 << 10
	}
	// Queue up to 4 memtables (pebble's default: 2) before stalling
	// writes, so a burst of up to 4 × MemTableBytes is absorbed at memory
	// speed while flushes catch up. Measured: sustained 4 KiB random writes
	// ~20% faster.
	opts.MemTableStopWritesThreshold = 4
	// Not value separation (block data in blob files), although it makes
	// sustained writes 1.2-1.7x faster in BenchmarkOptions: through blkd,
	// a 1 GiB volume overwritten by 20 s of 4 KiB random writes used
	// 2994 MiB of disk with it against 1999 without, 2180 against 1800
	// once idle (blob files keep overwritten blocks until a rewrite, 1898
	// with rewrites at 5% garbage after 1 s), and random writes were no
	// faster there (docs/volume.md). Compression stays pebble's default
	// (Snappy): on random data it costs nothing measurable, and a volume's
	// zero or text blocks compress.
	if tuneOptions != nil {
		tuneOptions(opts)
	}
	db, err := pebble.Open(cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("volume: open %q: %w: %w", cfg.Dir, ErrIO, err)
	}
	s.db = db
	// The first Flush after Open always syncs: pebble may have replayed WAL
	// records that the previous process wrote and never synced. The
	// syncer, once started, makes that sync at once, so that an idle
	// store is a synced store (flushedSeq == plainSeq).
	s.plainSeq.Store(1)
	s.syncArmed.Store(true)
	if err := s.load(); err != nil {
		_ = db.Close()
		return nil, err
	}
	s.startSpaceGuard()
	s.startSyncer()
	return s, nil
}

// load checks the format key and reads every volume's metadata.
func (s *Store) load() error {
	v, closer, err := s.db.Get(formatKey)
	switch {
	case err == nil:
		ok := string(v) == string(formatValue)
		_ = closer.Close()
		if !ok {
			return fmt.Errorf("volume: %q: format %q, want %q: %w", s.cfg.Dir, v, formatValue, ErrCorrupt)
		}
	case errors.Is(err, pebble.ErrNotFound):
		it, err := s.db.NewIter(nil)
		if err != nil {
			return fmt.Errorf("volume: %q: %w: %w", s.cfg.Dir, ErrIO, err)
		}
		empty := !it.First()
		err = it.Close()
		if err != nil {
			return fmt.Errorf("volume: %q: %w: %w", s.cfg.Dir, ErrIO, err)
		}
		if !empty {
			return fmt.Errorf("volume: %q holds keys but no format key: not a volume store: %w", s.cfg.Dir, ErrCorrupt)
		}
		if !s.cfg.ReadOnly {
			if err := s.db.Set(formatKey, formatValue, syncWrite); err != nil {
				return fmt.Errorf("volume: %q: write format key: %w: %w", s.cfg.Dir, ErrIO, err)
			}
		}
	default:
		return fmt.Errorf("volume: %q: read format key: %w: %w", s.cfg.Dir, ErrIO, err)
	}

	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte{familyMeta},
		UpperBound: []byte{familyMeta + 1},
	})
	if err != nil {
		return fmt.Errorf("volume: %q: %w: %w", s.cfg.Dir, ErrIO, err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		id, ok := metaKeyID(it.Key())
		if !ok {
			_ = it.Close()
			return fmt.Errorf("volume: metadata key %x: %w", it.Key(), ErrCorrupt)
		}
		raw, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("volume %d: read metadata: %w: %w", id, ErrIO, err)
		}
		info, err := decodeMeta(id, raw)
		if err != nil {
			_ = it.Close()
			return err
		}
		s.vols[id] = newVolume(s, info)
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("volume: %q: read metadata: %w: %w", s.cfg.Dir, ErrIO, err)
	}
	return s.err()
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Health returns nil while the store is usable, and the error that failed
// it (wrapping ErrIO or ErrCorrupt) once pebble reported a fatal error.
func (s *Store) Health() error { return s.err() }

// EngineStats is the health of the store's pebble instance, read from
// its own metrics (no key is read): what an operator watches for a store
// falling behind its writes.
type EngineStats struct {
	// L0Files and L0Sublevels: tables waiting in level 0; many sublevels
	// slow reads and, past pebble's thresholds, stall writes.
	L0Files     int64
	L0Sublevels int32
	// CompactionDebtBytes is pebble's estimate of the bytes compactions
	// must rewrite to bring the levels back into shape.
	CompactionDebtBytes uint64
	// Compactions and Flushes completed since Open.
	Compactions, Flushes int64
	// WriteStalls counts stalls; WriteStallSeconds their total length.
	WriteStalls       uint64
	WriteStallSeconds float64
	// DiskBytes is the store's total on-disk size (tables, WAL, ...).
	DiskBytes uint64
	// MemtableBytes is the memory the memtables hold.
	MemtableBytes uint64
	// BackgroundSyncs counts the WAL syncs of the background syncer
	// (Config.SyncInterval): at most one per interval under plain writes,
	// none while the store is idle.
	BackgroundSyncs uint64
}

// Engine returns the pebble instance's health (cheap: pebble's counters).
func (s *Store) Engine() EngineStats {
	m := s.db.Metrics()
	return EngineStats{
		L0Files:             m.Levels[0].TablesCount,
		L0Sublevels:         m.Levels[0].Sublevels,
		CompactionDebtBytes: m.Compact.EstimatedDebt,
		Compactions:         m.Compact.Count,
		Flushes:             m.Flush.Count,
		WriteStalls:         s.writeStalls.Load(),
		WriteStallSeconds:   float64(s.stallNanos.Load()) / 1e9,
		DiskBytes:           m.DiskSpaceUsage(),
		MemtableBytes:       m.MemTable.Size,
		BackgroundSyncs:     s.bgSyncs.Load(),
	}
}

// BackgroundErrors returns how many background errors (failed memtable
// flushes or compactions, which pebble retries) pebble has reported since
// Open. They lose no acknowledged data: the data is still in the WAL.
func (s *Store) BackgroundErrors() uint64 { return s.bgErrors.Load() }

// CreateOptions describes a new volume.
type CreateOptions struct {
	// SizeBytes is the capacity: a positive multiple of BlockSize, at most
	// MaxSizeBytes. Nothing is allocated: the volume is thin.
	SizeBytes uint64
	// BlockSize is BlockSize4K or BlockSize512. Zero means DefaultBlockSize.
	BlockSize uint32
}

// Create makes a new, empty volume and returns its handle. It fails with
// ErrExists if the ID is in use and ErrInvalid for a bad size or block
// size. The volume reads as zeros: besides its metadata key, Create
// writes one range deletion over the ID's whole key range, so that no
// block left by anything else can ever show through.
func (s *Store) Create(id ID, o CreateOptions) (*Volume, error) {
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if err := checkShape(o.SizeBytes, o.BlockSize); err != nil {
		return nil, fmt.Errorf("volume %d: create: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(id, "create"); err != nil {
		return nil, err
	}
	if _, ok := s.vols[id]; ok {
		return nil, fmt.Errorf("volume %d: create: %w", id, ErrExists)
	}
	info := Info{ID: id, SizeBytes: o.SizeBytes, BlockSize: o.BlockSize, State: StateOnline}
	b := s.db.NewBatch()
	var lo, hi [dataKeyLen]byte
	putDataKey(lo[:], id, 0)
	putDataEnd(hi[:], id)
	// Clear blocks a previous volume of this ID left, if any. Only when
	// there are some: a range deletion in the memtable makes every
	// iterator over it allocate (pebble builds a range-deletion iterator
	// per memtable), which would cost every multi-block read an
	// allocation until the memtable is flushed.
	stale, err := s.anyKey(lo[:], hi[:])
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("volume %d: create: %w", id, err)
	}
	if stale {
		_ = b.DeleteRange(lo[:], hi[:], nil)
	}
	var meta [metaValueLen]byte
	encodeMeta(meta[:], info)
	_ = b.Set(metaKey(id), meta[:], nil)
	if err := s.commit(b, true); err != nil {
		return nil, fmt.Errorf("volume %d: create: %w", id, err)
	}
	v := newVolume(s, info)
	s.vols[id] = v
	return v, nil
}

// Volume returns the handle of an existing volume. Every call for the
// same ID returns the same handle until the volume is deleted.
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
		return nil, fmt.Errorf("volume: list: %w", ErrClosed)
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

// Delete removes a volume and all its data: one atomic batch of a range
// deletion over the volume's keys and a point deletion of its metadata,
// synced. Pebble reclaims the space in compactions; sstables wholly under
// the range deletion are dropped without being rewritten. It waits for
// the volume's requests in flight; later ones fail with ErrNotFound.
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
	v.mu.Lock()
	defer v.mu.Unlock()
	b := s.db.NewBatch()
	var lo, hi [dataKeyLen]byte
	putDataKey(lo[:], id, 0)
	putDataEnd(hi[:], id)
	_ = b.DeleteRange(lo[:], hi[:], nil)
	_ = b.Delete(metaKey(id), nil)
	if err := s.commit(b, true); err != nil {
		return fmt.Errorf("volume %d: delete: %w", id, err)
	}
	v.gone = ErrNotFound
	v.gen++
	delete(s.vols, id)
	return nil
}

// Resize changes a volume's size. Growing always succeeds (the new blocks
// read as zeros). Shrinking fails with ErrWouldLoseData if any block at or
// past the new end was written, unless force is set; then those blocks
// are removed by one range deletion in the same batch as the new size.
// It waits for the volume's requests in flight.
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
	info := v.info
	if err := checkShape(sizeBytes, info.BlockSize); err != nil {
		return fmt.Errorf("volume %d: resize: %w", id, err)
	}
	b := s.db.NewBatch()
	if sizeBytes < info.SizeBytes {
		var lo, hi [dataKeyLen]byte
		putDataKey(lo[:], id, sizeBytes/uint64(info.BlockSize))
		putDataEnd(hi[:], id)
		written, err := s.anyKey(lo[:], hi[:])
		if err != nil {
			_ = b.Close()
			return fmt.Errorf("volume %d: resize: %w", id, err)
		}
		if written && !force {
			_ = b.Close()
			return fmt.Errorf("volume %d: resize from %d to %d bytes: %w",
				id, info.SizeBytes, sizeBytes, ErrWouldLoseData)
		}
		if written {
			_ = b.DeleteRange(lo[:], hi[:], nil)
		}
	}
	info.SizeBytes = sizeBytes
	if err := s.putMeta(b, info); err != nil {
		return fmt.Errorf("volume %d: resize: %w", id, err)
	}
	v.setInfo(info)
	return nil
}

// SetState sets a volume's persisted state (online or read-only). It
// waits for the volume's requests in flight.
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
	v.mu.Lock()
	defer v.mu.Unlock()
	info := v.info
	info.State = state
	if err := s.putMeta(s.db.NewBatch(), info); err != nil {
		return fmt.Errorf("volume %d: set state: %w", id, err)
	}
	v.setInfo(info)
	return nil
}

// Flush makes every write acknowledged before the call durable, on every
// volume of the store (the WAL is shared, so one sync covers them all).
// It holds the store's mutex, so that Close cannot close pebble under it.
func (s *Store) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("volume: flush: %w", ErrClosed)
	}
	if err := s.err(); err != nil {
		return fmt.Errorf("volume: flush: %w", err)
	}
	if s.cfg.ReadOnly {
		return nil // nothing can have been written
	}
	return s.flush()
}

// Close waits for requests in flight on every volume, flushes (so every
// acknowledged write is durable) and closes pebble. Every handle fails with
// ErrClosed afterwards. On a failed store Close skips the flush, closes
// pebble and returns the store's error.
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
		v.gen++
		v.mu.Unlock()
	}
	// No request is in flight now; the flush below covers whatever the
	// syncer had not synced yet.
	s.stopSyncer()
	var err error
	if s.err() == nil && !s.cfg.ReadOnly {
		err = s.flush()
	}
	if cerr := s.db.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("volume: close: %w: %w", ErrIO, cerr)
	}
	if ferr := s.err(); ferr != nil && err == nil {
		err = fmt.Errorf("volume: close: %w", ferr)
	}
	return err
}

// adminCheck is the common precondition of administrative calls.
// Requires s.mu.
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

// putMeta adds info's metadata to b and commits b synchronously.
func (s *Store) putMeta(b *pebble.Batch, info Info) error {
	var meta [metaValueLen]byte
	encodeMeta(meta[:], info)
	_ = b.Set(metaKey(info.ID), meta[:], nil)
	return s.commit(b, true)
}

// anyKey reports whether any key exists in [lo, hi).
func (s *Store) anyKey(lo, hi []byte) (bool, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrIO, err)
	}
	found := it.First()
	if err := it.Close(); err != nil {
		return false, fmt.Errorf("%w: %w", ErrIO, err)
	}
	return found, nil
}

// commit applies b, synced if sync is set, and releases b on success.
// It returns ErrIO if pebble failed, including the case where pebble
// reported a fatal error through the logger and then returned nil (see
// pebbleLogger): an acknowledgement is never given for a commit that
// pebble could not write.
func (s *Store) commit(b *pebble.Batch, sync bool) error {
	opts := noSyncWrite
	if sync {
		opts = syncWrite
	}
	if err := s.db.Apply(b, opts); err != nil {
		// Like pebble's own DB.Set: a batch that failed is not recycled,
		// as the commit pipeline may still refer to it.
		return fmt.Errorf("%w: %w", ErrIO, err)
	}
	if err := s.err(); err != nil {
		return err
	}
	if !sync {
		s.plainSeq.Add(1)
		s.markUnsynced()
	}
	return b.Close()
}

// flush syncs the WAL unless no plain mutation was acknowledged since the
// last successful flush or background sync. A mutation is counted in
// plainSeq after pebble queued it in the WAL and before it is
// acknowledged, and a flush reads plainSeq before it queues its own sync
// record, so a sync covers every mutation counted by the value it read:
// if flushedSeq is at least that value, an earlier successful sync
// already covered all of them.
func (s *Store) flush() error { return s.syncUnsynced(false) }

// syncUnsynced is flush; background says the syncer calls it, which counts
// the sync in bgSyncs before it is published in flushedSeq (so a test
// that waits for flushedSeq then reads a final count).
func (s *Store) syncUnsynced(background bool) error {
	start := s.clock()
	seq := s.plainSeq.Load()
	if s.flushedSeq.Load() < seq {
		if err := s.db.LogData(nil, syncWrite); err != nil {
			return fmt.Errorf("volume: flush: %w: %w", ErrIO, err)
		}
		if err := s.err(); err != nil {
			return fmt.Errorf("volume: flush: %w", err)
		}
		if background {
			s.bgSyncs.Add(1)
		}
		maxStore(&s.flushedSeq, seq)
	}
	// Every mutation counted before start is synced now: the syncer need
	// not sync again for interval after start (syncLoop).
	maxStore(&s.syncedAt, int64(start))
	return nil
}

// maxStore raises a to v unless it is already at least v.
func maxStore[T int64 | uint64](a interface {
	Load() T
	CompareAndSwap(old, new T) bool
}, v T) {
	for {
		old := a.Load()
		if old >= v || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// clock is the time since Open, from the monotonic clock.
func (s *Store) clock() time.Duration { return time.Since(s.opened) }

// err returns the store's fatal error, or nil.
func (s *Store) err() error {
	if p := s.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records the first fatal error; the store is failed from then on.
func (s *Store) fail(err error) {
	s.fatal.CompareAndSwap(nil, &err)
}

// pebbleLogger is the pebble.Logger the store runs pebble with. Pebble
// calls Fatalf where it cannot continue (a failed WAL write or sync in the
// commit pipeline, a failed MANIFEST write) and expects it not to return;
// its default exits the process. A storage node must not exit because one
// disk failed, so Fatalf records the error and fails the store instead;
// every path that could have acknowledged data checks the store's state
// after pebble returns, so a commit that pebble went on to report as
// successful is still reported as failed.
type pebbleLogger struct {
	s   *Store
	out Logger
}

func (l pebbleLogger) Infof(format string, args ...any)  { l.out.Infof(format, args...) }
func (l pebbleLogger) Errorf(format string, args ...any) { l.out.Errorf(format, args...) }
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.s.fail(fmt.Errorf("volume: pebble fatal error: %s: %w", msg, ErrIO))
	l.out.Errorf("volume: pebble fatal error, store failed: %s", msg)
}

// Batch sizes. Pebble's deferred operations reserve room for the worst
// case (both varint lengths 5 bytes) before shrinking the record to fit,
// so these are the capacities that let a batch take all its records
// without growing: header, then per record a kind byte, up to 2 × 5 bytes
// of varint lengths, and the key(s) and value.
const batchHeader = 12

// batchBytes bounds a batch that writes n blocks of blockSize.
func batchBytes(n, blockSize int) int {
	return batchHeader + n*(1+2*5+dataKeyLen+blockSize)
}

// deleteBatchBytes bounds a batch of n point deletions.
func deleteBatchBytes(n int) int {
	return batchHeader + n*(1+5+dataKeyLen)
}

// rangeDeleteBatchBytes bounds a batch of one range deletion.
const rangeDeleteBatchBytes = batchHeader + 1 + 2*5 + 2*dataKeyLen

// tuneOptions, when set, adjusts pebble's options last: BenchmarkOptions
// compares the store's options with value separation through it.
var tuneOptions func(*pebble.Options)

// syncerDisabled, when set, opens stores without the background syncer:
// BenchmarkSyncInterval's baseline, the write cost of today's main.
var syncerDisabled bool

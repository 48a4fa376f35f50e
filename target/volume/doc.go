// Package volume is blk's block store: the volumes (NVMe namespaces) that
// the target serves, kept in one pebble instance per storage node. It knows
// nothing of NVMe, transports or the cluster: the target calls it with
// LBAs and buffers, and turns its errors into NVMe status codes.
//
// A Store is the node's pebble directory, opened on an injectable vfs.FS
// (the OS, or in tests pebble's in-memory, crashable and error-injecting
// filesystems). It holds any number of volumes. A volume has a stable ID
// chosen by the caller, a size in bytes, a logical block size (4096 by
// default, or 512) and a state (online or read-only), all persisted in
// pebble next to the data. Volumes are thin: a block never written, or
// zeroed, or deallocated, has no key, reads as zeros and costs no space.
//
// # Key layout
//
// Every key starts with a family byte, so families never interleave:
//
//	'd' | volume ID (8 bytes, big-endian) | LBA (8 bytes, big-endian)  -> block data (exactly block size bytes)
//	'f'                                                                -> "blk-volume/1", the layout version
//	'm' | volume ID (8 bytes, big-endian)                              -> metadata: version, log2 block size, state, size
//
// Big-endian fields make pebble's bytewise order (volume, LBA) order: one
// volume's blocks are one contiguous key range, in LBA order. A multi-block
// request is one bounded iterator or one batch over adjacent keys; delete
// and shrink are one range deletion; pebble's sstables and block cache hold
// neighbouring blocks together. The range of volume id is
// ['d'|id|0, 'd'|id+1|0) ('e' after the largest ID), so no request of one
// volume can name a key of another, and every read also checks the ID in
// the keys it gets back.
//
// # Durability contract
//
// A volume behaves as an NVMe namespace with a volatile write cache, which
// the target advertises (VWC), and the store bounds how long that cache
// holds a write:
//
//   - A plain write (or write-zeroes, or deallocate) is acknowledged when
//     it is in pebble's memtable and in the WAL writer's buffer, before any
//     sync. It is visible to every later read at once. Within
//     Config.SyncInterval (10 ms by default) of its acknowledgement, plus
//     the time of at most two WAL syncs (one may be in progress) and of
//     the scheduler waking the store's background syncer, the syncer
//     syncs the WAL (sync.go): from then on the write survives a crash of
//     the process and of the machine. Until then either crash may lose
//     it, because the WAL's last, partial block is process memory until
//     it fills or a sync is requested; what is lost is a suffix of the
//     acknowledged operations, never part of one. An idle store holds no
//     acknowledged write unsynced past that window, and makes no sync and
//     no wake-up once it has synced.
//   - Flush (Volume.Flush, Store.Flush) makes every write acknowledged
//     before it durable: one WAL sync, which covers every volume of the
//     store since they share the WAL. A flush when nothing was written
//     since the last one (or since the syncer's last sync) costs nothing.
//   - A write with FUA (and write-zeroes with FUA) is durable when it is
//     acknowledged: its batch is committed with a WAL sync (pebble groups
//     concurrent syncs).
//   - Create, Delete, Resize and SetState are durable when they return.
//   - Close flushes.
//
// Every write, of any length up to the maximum transfer, is one pebble
// batch, so it is atomic: after a crash it is wholly present or wholly
// absent, and concurrent readers see all of it or none of it. Of two
// overlapping writes racing, every block ends up with the later batch's
// data: never a torn block, never a mix within a write's range. A
// multi-block read comes from one pebble iterator, so from one point in
// time. After a crash the store holds a prefix of the acknowledged
// operations (pebble recovers its WAL up to the first incomplete record),
// which the crash test checks.
//
// # Removing blocks
//
// WriteZeroes and Deallocate delete keys. Up to Config.PointDeleteMaxBlocks
// blocks (64 by default) they are point deletions, one per block, and past
// that one range deletion. A range deletion costs two keys whatever its
// length, so it is the only sane way to trim a terabyte; but every
// iterator and point read over a memtable or sstable holding range
// deletions must fragment them and check each key against them, and
// pebble's memtable re-fragments all of its range deletions after each new
// one (its cache is invalidated; measured as an allocation per range
// deletion and more on the next read). A file system issues many small
// discards, and a point deletion of a 17-byte key costs less than that and
// touches no other read. Either way, pebble drops the deleted data in
// compactions; sstables wholly under a range deletion (a deleted volume, a
// forced shrink) are dropped without being rewritten.
//
// # Copies and allocations
//
// Write copies the caller's buffer once, straight into the pebble batch
// (Batch.SetDeferred); Read fills the caller's buffer once from pebble's
// block cache or memtable, and clears the holes; View hands out pebble's
// own memory, valid during a callback, with no copy at all. What pebble
// does after that is pebble's: the batch is copied into the WAL's buffer
// and into the memtable's arena, and later into sstables by flushes and
// compactions (docs/volume.md measures it). Batches come from pebble's
// batch pool, sized so it keeps them; keys and iterator bounds come from a
// pool of scratch buffers. A request allocates nothing in the steady
// state, except where pebble does (TestSteadyStateAllocs lists them).
//
// # Failures
//
// Pebble treats a failed WAL write or sync, or a failed MANIFEST write, as
// fatal and calls its logger's Fatalf, whose default exits the process.
// The store's logger instead marks the store failed, and the store checks
// for that after each commit, so a write that pebble could not log is
// never acknowledged. A failed store answers ErrIO to everything until it
// is closed and reopened, when pebble recovers from its WAL. A failed
// sstable write (flush, compaction) is retried by pebble and loses nothing
// (the data is in the WAL); it is counted in Store.BackgroundErrors. A
// failed sstable read fails the request with ErrIO: never zeros.
//
// # What this package must never do
//
//   - Acknowledge a FUA write, a flush or an administrative change before
//     pebble has synced it; disable or bypass pebble's WAL.
//   - Leave an acknowledged plain write unsynced past Config.SyncInterval
//     (and the syncs in progress); wake or sync when nothing was written.
//   - Acknowledge anything after pebble reported a fatal error.
//   - Read, write or delete a key outside the volume a request names, or
//     return a block that is not the volume's own (another volume's, a
//     torn one, or zeros for a block it failed to read).
//   - Panic on any input, or let a request reach pebble after Close
//     (pebble panics on a closed DB).
//   - Keep a reference to a caller's buffer after the call returns.
//   - Allocate or take a store-wide lock per request; the only per-request
//     lock is the volume's own, shared, to exclude resize and delete (a
//     plain write tells the syncer with one atomic load, and a
//     compare-and-swap at most once per interval).
//   - Import the transport, the NVMe target or the cluster's meta layer;
//     register itself in init(); keep a Prometheus registry (counters are
//     plain and exposed by Volume.Stats).
package volume

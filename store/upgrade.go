package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// The upgrade from target/volume's layout (docs/store.md, "Upgrade"). A
// pebble directory written by it holds:
//
//	'f'                  -> "blk-volume/1"
//	'm' | ID (8 B BE)    -> [0] 1, [1] log2(block size), [2] state, [8:16] size bytes BE
//	'd' | ID | LBA (BE)  -> one block's data
//
// Open on such a directory (read-write) creates the store beside it in
// the same pebble instance and migrates every volume before it returns,
// logging its progress: per batch of clusters, their blocks are gathered
// from the 'd' keys into aligned cluster buffers, written to clusters
// taken from the ready pool, the area synced, then one batch commits
// their map keys, deletes their reservations and range-deletes the 'd'
// keys it copied. A crash loses nothing: a cluster's blocks are either
// all in 'd' keys (the batch was lost; the clusters are reserved, so
// zeroed at the next Open) or mapped with their data durable; the next
// Open resumes. A volume is done when its 'm' key goes; the store when
// 'f' goes.

const (
	legacyFormat = 'f'
	legacyMeta   = 'm'
	legacyData   = 'd'
)

// migrateClusters is the clusters written per area sync and commit (a
// variable: the crash test makes batches small).
var migrateClusters = 64

var legacyFormatValue = []byte("blk-volume/1")

// isLegacy says whether the directory holds target/volume's format key.
func (s *Store) isLegacy() (bool, error) {
	v, closer, err := s.db.Get([]byte{legacyFormat})
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: %q: %w: %w", s.cfg.Dir, ErrIO, err)
	}
	ok := string(v) == string(legacyFormatValue)
	_ = closer.Close()
	if !ok {
		return false, fmt.Errorf("store: %q: format %q is not one this release upgrades: %w", s.cfg.Dir, v, ErrCorrupt)
	}
	return true, nil
}

func decodeLegacyMeta(k, v []byte) (Info, error) {
	if len(k) != 9 || len(v) != 16 || v[0] != 1 {
		return Info{}, fmt.Errorf("store: target/volume metadata %x = %x: %w", k, v, ErrCorrupt)
	}
	info := Info{ID: ID(binary.BigEndian.Uint64(k[1:])), BlockSize: 1 << (v[1] & 31), State: State(v[2]),
		SizeBytes: binary.BigEndian.Uint64(v[8:16])}
	if err := checkShape(info.SizeBytes, info.BlockSize); err != nil || !info.State.valid() {
		return Info{}, fmt.Errorf("store: target/volume metadata of volume %d: %+v: %w", info.ID, info, ErrCorrupt)
	}
	return info, nil
}

// legacyClusters counts the clusters of size 1<<shift that the old
// layout's blocks will take (a key-only pass), so that an upgrade that
// cannot fit is refused before anything is written.
func (s *Store) legacyClusters(shift uint8) (uint64, error) {
	bs := map[ID]uint64{}
	err := s.scan(legacyMeta, func(k, v []byte) error {
		info, err := decodeLegacyMeta(k, v)
		bs[info.ID] = uint64(info.BlockSize)
		return err
	})
	if err != nil {
		return 0, err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{legacyData}, UpperBound: []byte{legacyData + 1}})
	if err != nil {
		return 0, fmt.Errorf("store: %w: %w", ErrIO, err)
	}
	var n, lastID, lastIdx uint64
	first := true
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != 17 {
			_ = it.Close()
			return 0, fmt.Errorf("store: target/volume block key %x: %w", k, ErrCorrupt)
		}
		id, lba := binary.BigEndian.Uint64(k[1:9]), binary.BigEndian.Uint64(k[9:17])
		b := bs[ID(id)]
		if b == 0 {
			continue // no metadata: a deleted volume's leftovers, range-deleted with it
		}
		idx := lba * b >> shift
		if first || id != lastID || idx != lastIdx {
			n++
			first, lastID, lastIdx = false, id, idx
		}
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("store: %w: %w", ErrIO, err)
	}
	return n, nil
}

// migrate moves every target/volume volume into the store, then removes
// the legacy format key. Requires the store loaded and writable.
func (s *Store) migrate() error {
	start := time.Now()
	var legacy []Info
	err := s.scan(legacyMeta, func(k, v []byte) error {
		info, err := decodeLegacyMeta(k, v)
		legacy = append(legacy, info)
		return err
	})
	if err != nil {
		return err
	}
	s.log.Infof("store: upgrading %q from target/volume's layout: %d volumes to migrate", s.cfg.Dir, len(legacy))
	var total uint64
	for i, info := range legacy {
		if int(info.BlockSize) < s.align {
			return fmt.Errorf("store: upgrade: volume %d has %d-byte blocks, below the data area's direct-I/O alignment %d: %w",
				info.ID, info.BlockSize, s.align, ErrInvalid)
		}
		v := s.vols[info.ID]
		if v == nil {
			r := volumeRecord{info: info, mapID: uint64(info.ID)}
			if err := s.putRecord(r); err != nil {
				return fmt.Errorf("store: upgrade: volume %d: %w", info.ID, err)
			}
			v = newVolume(s, r)
			s.vols[info.ID] = v
		} else if v.info != info {
			return fmt.Errorf("store: upgrade: volume %d is %+v in the store and %+v in target/volume's layout: %w", info.ID, v.info, info, ErrCorrupt)
		}
		n, err := s.migrateVolume(v)
		if err != nil {
			return fmt.Errorf("store: upgrade: volume %d: %w", info.ID, err)
		}
		total += n
		b := s.db.NewBatch()
		_ = b.Delete(legacyKey(legacyMeta, uint64(info.ID)), nil)
		lo, hi := legacyDataRange(info.ID)
		_ = b.DeleteRange(lo, hi, nil)
		if err := s.commit(b, true); err != nil {
			return fmt.Errorf("store: upgrade: volume %d: %w", info.ID, err)
		}
		s.log.Infof("store: upgrade: volume %d done (%d of %d), %d bytes of data moved", info.ID, i+1, len(legacy), n)
	}
	if err := s.db.Delete([]byte{legacyFormat}, pebble.Sync); err != nil {
		return fmt.Errorf("store: upgrade: %w: %w", ErrIO, err)
	}
	s.log.Infof("store: upgrade of %q done: %d volumes, %d bytes of data moved into the data area in %v",
		s.cfg.Dir, len(legacy), total, time.Since(start).Round(time.Millisecond))
	return s.err()
}

func legacyKey(family byte, id uint64) []byte {
	k := make([]byte, 9)
	k[0] = family
	binary.BigEndian.PutUint64(k[1:], id)
	return k
}

// legacyDataRange is the key range of a volume's 'd' keys.
func legacyDataRange(id ID) (lo, hi []byte) {
	lo = append(legacyKey(legacyData, uint64(id)), make([]byte, 8)...)
	if id == ^ID(0) {
		return lo, []byte{legacyData + 1}
	}
	return lo, append(legacyKey(legacyData, uint64(id)+1), make([]byte, 8)...)
}

// migrateCluster is one cluster being gathered.
type migrateCluster struct {
	idx  uint64
	buf  []byte
	phys uint64
	lo   uint64 // first LBA of the cluster
}

// migrateVolume copies v's 'd' keys into clusters, migrateBatch clusters
// at a time, and returns the bytes of data it moved.
func (s *Store) migrateVolume(v *Volume) (uint64, error) {
	bs := uint64(v.info.BlockSize)
	perCluster := (s.cmask + 1) / bs
	bufs := make([][]byte, migrateClusters)
	for i := range bufs {
		bufs[i] = alignedBuf(int(s.cmask+1), s.align)
	}
	var batch []migrateCluster
	var moved, lastLog uint64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := s.migrateBatch(v, batch, perCluster); err != nil {
			return err
		}
		moved += uint64(len(batch)) << s.cshift
		if moved-lastLog >= 256<<20 {
			lastLog = moved
			s.log.Infof("store: upgrade: volume %d: %d MiB of clusters written", v.id, moved>>20)
		}
		batch = batch[:0]
		return nil
	}
	lo, hi := legacyDataRange(v.id)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrIO, err)
	}
	defer func() { _ = it.Close() }()
	var data uint64
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		val, err := it.ValueAndErr()
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrIO, err)
		}
		lba := binary.BigEndian.Uint64(k[9:17])
		if len(k) != 17 || uint64(len(val)) != bs || lba >= v.info.Blocks() {
			return 0, fmt.Errorf("target/volume block key %x (%d bytes): %w", k, len(val), ErrCorrupt)
		}
		idx := lba / perCluster
		if len(batch) == 0 || batch[len(batch)-1].idx != idx {
			if len(batch) == migrateClusters {
				if err := flush(); err != nil {
					return 0, err
				}
			}
			if v.m.get(idx) != 0 {
				// The batch that maps a cluster deletes its 'd' keys, and
				// no host writes before the upgrade is done.
				return 0, fmt.Errorf("cluster %d is mapped and still has target/volume blocks: %w", idx, ErrCorrupt)
			}
			c := migrateCluster{idx: idx, buf: bufs[len(batch)], lo: idx * perCluster}
			clear(c.buf)
			batch = append(batch, c)
		}
		c := &batch[len(batch)-1]
		copy(c.buf[(lba-c.lo)*bs:], val)
		data += bs
	}
	if err := flush(); err != nil {
		return 0, err
	}
	return data, nil
}

// migrateBatch writes the gathered clusters into new ones, syncs the
// area, then commits their map keys with the deletion of their
// reservations and of the 'd' keys they hold. On an error the clusters
// taken go to limbo (reserved: zeroed before reuse).
func (s *Store) migrateBatch(v *Volume, batch []migrateCluster, perCluster uint64) error {
	taken := 0
	fail := func(err error) error {
		for _, c := range batch[:taken] {
			s.toLimbo(c.phys)
		}
		return err
	}
	for i := range batch {
		p, err := s.takeCluster()
		if err != nil {
			return fail(err)
		}
		batch[i].phys = p
		taken++
		if err := s.area.WriteAt(batch[i].buf, int64(p<<s.cshift)); err != nil {
			return fail(fmt.Errorf("%w: %w", ErrIO, err))
		}
	}
	if err := s.syncArea(); err != nil {
		return fail(err)
	}
	b := s.db.NewBatch()
	var key [mapKeyLen]byte
	var val [8]byte
	for _, c := range batch {
		putMapKey(key[:], v.mapID, c.idx)
		putPhys(val[:], c.phys)
		_ = b.Set(key[:], val[:], nil)
		putReservedKey(key[:], c.phys)
		_ = b.Delete(key[:reservedKeyLen], nil)
		lo := append(legacyKey(legacyData, uint64(v.id)), make([]byte, 8)...)
		hi := slices.Clone(lo)
		binary.BigEndian.PutUint64(lo[9:], c.lo)
		binary.BigEndian.PutUint64(hi[9:], c.lo+perCluster)
		_ = b.DeleteRange(lo, hi, nil)
	}
	if err := s.commit(b, false); err != nil {
		return fail(err)
	}
	s.hook(hookMigrated)
	for _, c := range batch {
		v.m.set(c.idx, c.phys)
	}
	v.allocated.Add(int64(len(batch)))
	s.al.mu.Lock()
	s.al.mapped += uint64(len(batch))
	s.al.mu.Unlock()
	s.seq.Add(1)
	return nil
}

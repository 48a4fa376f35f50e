package store

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// Deferred map keys (docs/snapshots.md §1.3, "Sub-cluster redirect").
//
// A write that replaces what an index read through the parent (a
// redirect into a new partial cluster, a whole cluster written over a
// parent's, a partial cluster's new sub-blocks) must not have its map key
// durable before its bytes: the index would then read zeros where it read
// the parent's bytes, and pebble makes an unsynced key durable with
// anyone's later synced commit (or a memtable flush). Rather than sync the
// area before each such key (a sync per round of writes: 0.15× of the
// overwrite rate measured), the key waits in memory: the write publishes
// its entry in the table at once (reads see it), and the key is committed
// by the next flush after its area sync (the background syncer's, within
// Config.SyncInterval, or a Flush or FUA write), or by any other commit
// of the store, which syncs the area and puts the waiting keys first in
// its own batch (so a free, a merge or a revert that follows a deferred
// key in memory follows it in pebble too). A crash before that commit
// loses the key: the index reads the parent's bytes, the value before
// the write, which was not flushed; the cluster taken keeps its 'R' key
// and Open zeroes it.

// defKey names a deferred map key.
type defKey struct{ m, i uint64 }

// deferred is the store's waiting keys.
type deferred struct {
	mu   sync.Mutex
	keys map[defKey]uint64 // the map value (physOf plus partial and mask)
	rdel []uint64          // clusters taken from the ready pool: their 'R' keys go with the map keys
	n    atomic.Int64      // len(keys) + len(rdel), read without mu

	// spare is the other pair, swapped in by take: no allocation once both
	// have grown.
	spareKeys map[defKey]uint64
	spareRdel []uint64

	// drainMu orders drains: one takes, syncs and commits at a time, so
	// an older value of a key never lands after a newer one.
	drainMu sync.Mutex
}

// deferKey makes map m's key i hold e (an own entry) at the next drain;
// fresh, if not 0, is the cluster the write took from the ready pool.
// Past maxDeferred waiting it drains them itself, unless it runs on a
// poll group (EndDirect: poll false), which must never wait for a sync;
// there the refill's commit, which the direct path's pops of ready
// clusters bring about, or the next slow write drains them.
func (s *Store) deferKey(m, i, e, fresh uint64, poll bool) {
	d := &s.def
	d.mu.Lock()
	if d.keys == nil {
		d.keys, d.spareKeys = map[defKey]uint64{}, map[defKey]uint64{}
	}
	d.keys[defKey{m, i}] = e
	if fresh != 0 {
		d.rdel = append(d.rdel, fresh)
	}
	n := len(d.keys) + len(d.rdel)
	d.n.Store(int64(n))
	d.mu.Unlock()
	if n >= maxDeferred && !poll {
		// No flush came (a store with no background syncer, whose hosts
		// do not flush): the writer commits them, so memory stays
		// bounded. An error fails the store; the write's own comes later.
		_ = s.drainDeferred()
	}
}

// maxDeferred bounds the keys waiting (about 40 bytes each): one area
// sync per 8192 redirects at most, when nothing else commits them.
const maxDeferred = 8192

// takeDeferred moves the waiting keys into b (sets first, in no order:
// each key once) and returns how many it moved; the caller holds
// drainMu and must sync the area before b commits. The maps are recycled
// by doneDeferred.
func (s *Store) takeDeferred(b *pebble.Batch) int {
	d := &s.def
	d.mu.Lock()
	keys, rdel := d.keys, d.rdel
	d.keys, d.rdel = d.spareKeys, d.spareRdel[:0]
	d.spareKeys, d.spareRdel = nil, nil
	d.n.Store(0)
	d.mu.Unlock()
	var key [mapKeyLen]byte
	var val [8]byte
	for k, e := range keys {
		putMapKey(key[:], k.m, k.i)
		putPhys(val[:], e)
		_ = b.Set(key[:], val[:], nil)
	}
	for _, p := range rdel {
		putReservedKey(key[:], p)
		_ = b.Delete(key[:reservedKeyLen], nil)
	}
	n := len(keys) + len(rdel)
	clear(keys)
	d.mu.Lock()
	d.spareKeys, d.spareRdel = keys, rdel[:0]
	d.mu.Unlock()
	return n
}

// commitWithDeferred commits b (sync as asked) after the waiting keys: it
// syncs the area, then commits {waiting keys, then b's} as one batch. A
// failure fails the store (the keys taken are lost to this run; Open
// finds what was durable). Requires drainMu.
func (s *Store) commitWithDeferred(b *pebble.Batch, sync bool) error {
	if s.def.n.Load() == 0 {
		// None waiting, and none taken by a drain not yet committed (drainMu
		// is held): a key deferred from now on is of a write concurrent
		// with b, which orders nothing before b.
		return s.apply(b, sync)
	}
	d := s.db.NewBatch()
	n := s.takeDeferred(d)
	if n == 0 {
		_ = d.Close()
		return s.apply(b, sync)
	}
	// On an error b is left to the caller, as apply leaves it.
	if err := s.syncArea(); err != nil {
		_ = d.Close()
		return err
	}
	alone := b.Count() == 0 // the hook is this commit's only when it carries nothing else
	if !alone {
		if err := d.Apply(b, nil); err != nil {
			_ = d.Close()
			err = fmt.Errorf("store: deferred map keys: %w: %w", ErrIO, err)
			s.fail(err)
			return err
		}
	}
	if err := s.apply(d, sync); err != nil {
		s.fail(err)
		return err
	}
	_ = b.Close()
	s.c.deferredCommits.Add(uint64(n))
	if alone {
		s.hook(hookDeferredCommitted)
	}
	return nil
}

// drainDeferred commits the waiting keys (not synced): for what reads the
// map keys from pebble (Check).
func (s *Store) drainDeferred() error {
	s.def.drainMu.Lock()
	defer s.def.drainMu.Unlock()
	return s.commitWithDeferred(s.db.NewBatch(), false)
}

package store

import (
	"fmt"
	"slices"
)

// releaseRunsPerBatch bounds the range deletions of one releaseReady
// batch: a ready pool after a large deallocate can name every cluster of
// the area, in as many runs when they alternate with mapped ones.
const releaseRunsPerBatch = 1024

// releaseReady deletes the 'R' keys of the ready pool, synced, so that a
// clean Close leaves nothing for the next Open to zero (without it every
// start of blkd zeroed and synced up to ReadyClusters clusters, 64 MiB by
// default, that had never been written).
//
// Safe because a ready cluster reads zeros on durable media and nothing
// wrote it since (alloc.go): it came from free clusters (fresh or
// released after a synced zeroing), from Open's zeroing (synced), or from
// limbo through a flush, which zeroed it, synced the area and then the WAL
// that holds its free. Once its 'R' key is gone it is free, which has the
// same meaning. Limbo and taken clusters may hold bytes no map names: they
// keep their keys. Close calls it after its flush succeeded, with no
// request in flight (every volume is gone), so the pool is what that flush
// left plus what refills reserved; a failed store or a failed flush
// releases nothing, and a crash before the final sync leaves keys that the
// next Open zeroes, as it always did. Under flushMu: a concurrent
// Store.Flush moves limbo into the pool.
func (s *Store) releaseReady() error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	if s.dbClosed || s.cfg.ReadOnly || s.err() != nil {
		return nil
	}
	s.al.mu.Lock()
	defer s.al.mu.Unlock()
	ps := slices.Clone(s.al.ready[s.al.head:])
	if len(ps) == 0 {
		return nil
	}
	slices.Sort(ps)
	var lo, hi [reservedKeyLen]byte
	b, runs := s.db.NewBatch(), 0
	for i := 0; i < len(ps); {
		j := i + 1
		for j < len(ps) && ps[j] == ps[j-1]+1 {
			j++
		}
		putReservedKey(lo[:], ps[i])
		putReservedKey(hi[:], ps[j-1]+1) // a cluster number, never past 2^64-1: the area is smaller
		_ = b.DeleteRange(lo[:], hi[:], nil)
		runs++
		i = j
		if last := i == len(ps); last || runs == releaseRunsPerBatch {
			// Unsynced but the last: its sync makes every earlier batch
			// durable with it (one WAL).
			if err := s.commit(b, last); err != nil {
				_ = b.Close()
				return fmt.Errorf("store: close: release the ready pool: %w", err)
			}
			b, runs = s.db.NewBatch(), 0
		}
	}
	_ = b.Close()
	for _, p := range ps {
		s.al.release(p)
	}
	s.al.ready, s.al.head = s.al.ready[:0], 0
	s.log.Infof("store: close: %d ready clusters released (the next open has none to zero)", len(ps))
	return nil
}

package volume

import (
	"time"
)

// The background syncer bounds how long an acknowledged plain write stays
// unsynced. Pebble commits a plain (NoSync) batch into its memtable and
// into the WAL writer's current 32 KiB block, which is process memory: the
// WAL's flush loop is woken only when a block fills or a sync is requested
// (record.LogWriter.flushLoop), so what was appended while it waited stays
// in memory; no pebble API writes it to the kernel without a sync. An idle store would therefore
// keep its last acknowledged writes in memory indefinitely, and a process
// crash (SIGKILL, OOM kill, panic) would lose them: issue 21 measured 3 of
// 3 plain writes lost after 10 s idle.
//
// So a goroutine syncs the WAL within Config.SyncInterval of the first
// plain mutation acknowledged since the last sync (its own or a flush's),
// plus the time it takes to be scheduled and to finish a sync already in
// progress. The data path only marks the store dirty: a plain commit
// loads one atomic flag, and the first commit after a sync (at most one
// per interval) sets it and wakes the syncer through a channel of one
// slot; no lock, no allocation, no timer per I/O. When no plain write was
// acknowledged since the last sync, the syncer is blocked on that
// channel: an idle store neither wakes nor syncs.
//
// Ordering. A committer counts its mutation in plainSeq, then loads the
// flag (arming it if clear). The syncer clears the flag, then reads
// plainSeq and syncs (Store.syncUnsynced). If a committer found the flag set,
// its load came before the syncer cleared it, so its count came before the
// syncer's read of plainSeq and that sync covers the mutation; if it found
// the flag clear, it armed it and woke the syncer for another round. The
// channel is always empty when the flag is armed (the syncer takes the
// token before it clears the flag), so the wake-up is never lost.

// DefaultSyncInterval is Config.SyncInterval's default: see there for why.
const DefaultSyncInterval = 10 * time.Millisecond

// MaxSyncInterval bounds Config.SyncInterval: the window in which a
// process crash may lose acknowledged plain writes stays short.
const MaxSyncInterval = time.Second

// markUnsynced notes that a plain mutation was acknowledged (counted in
// plainSeq) and wakes the syncer if it is not already due to run.
func (s *Store) markUnsynced() {
	if s.syncArmed.Load() || !s.syncArmed.CompareAndSwap(false, true) {
		return
	}
	select {
	case s.syncKick <- struct{}{}:
	default: // cannot happen (see the ordering note), and must not block
	}
}

// startSyncer starts the background syncer of a writable store.
func (s *Store) startSyncer() {
	if s.cfg.ReadOnly || syncerDisabled {
		return
	}
	s.syncKick = make(chan struct{}, 1)
	s.syncStop, s.syncDone = make(chan struct{}), make(chan struct{})
	if s.syncArmed.Load() { // armed by Open: see there
		s.syncKick <- struct{}{}
	}
	go s.syncLoop(s.cfg.SyncInterval)
}

// stopSyncer stops the syncer and waits for it, before Close's own flush
// and pebble's close: the syncer never calls pebble after Close.
func (s *Store) stopSyncer() {
	if s.syncStop != nil {
		close(s.syncStop)
		<-s.syncDone
		s.syncStop = nil
	}
}

// syncLoop waits for a plain write, lets every write of the next interval
// join it, and syncs them all at once. A negative interval syncs at once.
func (s *Store) syncLoop(interval time.Duration) {
	defer close(s.syncDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-s.syncStop:
			return
		case <-s.syncKick:
		}
		if interval > 0 && !s.waitSyncDue(s.clock(), interval, timer) {
			return
		}
		if s.testBeforeSync != nil {
			s.testBeforeSync()
		}
		s.syncArmed.Store(false)
		if err := s.syncUnsynced(true); err != nil {
			// Pebble treats a failed WAL sync as fatal: the store is
			// failed (pebbleLogger), and no later write is acknowledged.
			s.log.Errorf("volume: background WAL sync of %s: %v", s.cfg.Dir, err)
		}
		s.syncRounds.Add(1)
	}
}

// waitSyncDue waits until interval has passed since the later of kicked
// (when a plain write woke the syncer) and the start of the latest
// successful flush (syncedAt): every mutation acknowledged before that
// start is synced, so the oldest unsynced one is younger. A host that
// flushes often thereby spares the syncer its syncs (the flush32 rows of
// BenchmarkSyncInterval). It returns false if the syncer was stopped.
func (s *Store) waitSyncDue(kicked, interval time.Duration, timer *time.Timer) bool {
	from := kicked
	for {
		from = max(from, time.Duration(s.syncedAt.Load()))
		wait := from + interval - s.clock()
		if wait <= 0 {
			return true
		}
		timer.Reset(wait)
		select {
		case <-s.syncStop:
			timer.Stop()
			return false
		case <-timer.C:
		}
	}
}

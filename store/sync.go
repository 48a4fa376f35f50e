package store

import (
	"time"
)

// The background syncer bounds how long an acknowledged plain write stays
// volatile (docs/volume.md, "Durability"): within Config.SyncInterval of the first mutation since its last
// round it runs a flush (zero limbo, sync the area, sync the WAL), so a
// plain write survives a crash of the process or the machine from then
// on, and clusters freed since the last round become reusable. Idle, it
// sleeps on a channel: no wake-up, no sync.
//
// A write costs one atomic load (syncArmed, already true under load) and
// at most one compare-and-swap and channel send per round.

// DefaultSyncInterval is Config.SyncInterval's default; MaxSyncInterval
// its bound.
const (
	DefaultSyncInterval = 10 * time.Millisecond
	MaxSyncInterval     = time.Second
)

// markUnsynced is called after each acknowledged mutation was counted in
// seq: it wakes the syncer once per round.
func (s *Store) markUnsynced() {
	if s.syncKick == nil || s.syncArmed.Load() || !s.syncArmed.CompareAndSwap(false, true) {
		return
	}
	select {
	case s.syncKick <- struct{}{}:
	default:
	}
}

func (s *Store) startSyncer() {
	if s.cfg.ReadOnly || s.cfg.SyncInterval < 0 {
		return
	}
	s.syncKick = make(chan struct{}, 1)
	s.syncStop, s.syncDone = make(chan struct{}), make(chan struct{})
	go s.syncLoop(s.cfg.SyncInterval)
}

func (s *Store) syncLoop(every time.Duration) {
	defer close(s.syncDone)
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-s.syncStop:
			return
		case <-s.syncKick:
		}
		t.Reset(every)
		select {
		case <-s.syncStop:
			t.Stop()
			return
		case <-t.C:
		}
		// Disarm before the flush reads seq: a mutation counted after
		// that read finds the syncer disarmed and wakes it again.
		s.syncArmed.Store(false)
		if synced, err := s.flushRound(); err == nil && synced {
			s.c.bgSyncs.Add(1)
		}
	}
}

func (s *Store) stopSyncer() {
	if s.syncStop != nil {
		close(s.syncStop)
		<-s.syncDone
		s.syncStop = nil
	}
}

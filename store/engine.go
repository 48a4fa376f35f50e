package store

import (
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Pebble's health, for the node's metrics: pebble holds only metadata
// here, but a write stall still holds back every first write of a
// cluster (its map commit), and a background error is worth an alert.

// events counts pebble's background errors and write stalls, and fails
// the store on data corruption.
func (s *Store) events() *pebble.EventListener {
	return &pebble.EventListener{
		BackgroundError: func(err error) {
			s.c.bgErrors.Add(1)
			s.log.Errorf("store: pebble background error: %v", err)
		},
		WriteStallBegin: func(pebble.WriteStallBeginInfo) {
			s.c.writeStalls.Add(1)
			s.c.stallStart.Store(time.Now().UnixNano())
		},
		WriteStallEnd: func() {
			if t := s.c.stallStart.Swap(0); t != 0 {
				s.c.stallNanos.Add(uint64(time.Now().UnixNano() - t))
			}
		},
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			s.fail(fmt.Errorf("store: pebble: %s: %w", info, ErrCorrupt))
		},
	}
}

// EngineStats is the health of the store's pebble instance.
type EngineStats struct {
	// L0Files and L0Sublevels: tables waiting in level 0.
	L0Files     int64
	L0Sublevels int32
	// CompactionDebtBytes is pebble's estimate of the bytes compactions
	// must rewrite.
	CompactionDebtBytes uint64
	// Compactions and Flushes (of memtables) completed since Open.
	Compactions, Flushes int64
	// WriteStalls counts stalls; WriteStallSeconds their total length.
	WriteStalls       uint64
	WriteStallSeconds float64
	// BackgroundErrors: failed flushes and compactions (pebble retries).
	BackgroundErrors uint64
	// DiskBytes is pebble's on-disk size (tables, WAL; not the area).
	DiskBytes uint64
	// MemtableBytes is the memory the memtables hold.
	MemtableBytes uint64
}

// Engine returns the pebble instance's health (cheap: pebble's counters).
// Zero after Close.
func (s *Store) Engine() EngineStats {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	if s.dbClosed {
		return EngineStats{}
	}
	m := s.db.Metrics()
	return EngineStats{
		L0Files:             m.Levels[0].TablesCount,
		L0Sublevels:         m.Levels[0].Sublevels,
		CompactionDebtBytes: m.Compact.EstimatedDebt,
		Compactions:         m.Compact.Count,
		Flushes:             m.Flush.Count,
		WriteStalls:         s.c.writeStalls.Load(),
		WriteStallSeconds:   float64(s.c.stallNanos.Load()) / 1e9,
		BackgroundErrors:    s.c.bgErrors.Load(),
		DiskBytes:           m.DiskSpaceUsage(),
		MemtableBytes:       m.MemTable.Size,
	}
}

package volume

import (
	"time"
)

// The space guard keeps the store off a full filesystem. Pebble treats a
// failed WAL write as fatal: on a full disk the store would fail (every
// read too) until reopened. Instead, a goroutine reads the filesystem's
// free space every Config.SpaceCheckInterval; under the reserve, writes
// (Write and WriteGroup) fail with ErrNoSpace while reads, write-zeroes
// and deallocates (which free space) go on, and pebble keeps the room it
// needs to flush and compact. Once free space is back above 1.25 × the
// reserve (the margin keeps it from flapping), writes resume. Nothing
// needs a restart.

// Space reserve bounds (Config.ReserveBytes' default: 5% of the disk).
const (
	minReserve           = 128 << 20
	maxReserve           = 4 << 30
	defaultSpaceInterval = 100 * time.Millisecond
)

// SpaceStats is the space guard's view of the store's filesystem.
type SpaceStats struct {
	// Monitored is false when the filesystem cannot say its free space
	// (an in-memory one in tests): then writes are never refused.
	Monitored bool
	// FreeBytes and TotalBytes are the last reading; ReserveBytes the
	// free space under which writes are refused.
	FreeBytes, TotalBytes, ReserveBytes uint64
	// Full says writes are being refused (ErrNoSpace).
	Full bool
}

// Space returns the space guard's last reading.
func (s *Store) Space() SpaceStats {
	return SpaceStats{
		Monitored: s.spaceMonitored.Load(), FreeBytes: s.freeBytes.Load(), TotalBytes: s.totalBytes.Load(),
		ReserveBytes: s.reserve.Load(), Full: s.noSpace.Load(),
	}
}

// startSpaceGuard reads the free space once (a store opened on a full disk
// starts refusing writes) and starts the goroutine that keeps reading it.
func (s *Store) startSpaceGuard() {
	if s.cfg.ReadOnly || !s.checkSpace() {
		return
	}
	s.spaceMonitored.Store(true)
	s.spaceStop, s.spaceDone = make(chan struct{}), make(chan struct{})
	every := s.cfg.SpaceCheckInterval
	if every <= 0 {
		every = defaultSpaceInterval
	}
	go func() {
		defer close(s.spaceDone)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.spaceStop:
				return
			case <-t.C:
				s.checkSpace()
			}
		}
	}()
}

func (s *Store) stopSpaceGuard() {
	if s.spaceStop != nil {
		close(s.spaceStop)
		<-s.spaceDone
		s.spaceStop = nil
	}
}

// checkSpace reads the free space and moves the guard; false if the
// filesystem cannot say.
func (s *Store) checkSpace() bool {
	du, err := s.cfg.FS.GetDiskUsage(s.cfg.Dir)
	if err != nil {
		return false
	}
	reserve := s.cfg.ReserveBytes
	if reserve == 0 {
		reserve = min(max(du.TotalBytes/20, minReserve), maxReserve)
	}
	s.freeBytes.Store(du.AvailBytes)
	s.totalBytes.Store(du.TotalBytes)
	s.reserve.Store(reserve)
	full := s.noSpace.Load()
	switch {
	case !full && du.AvailBytes < reserve:
		s.noSpace.Store(true)
		s.log.Errorf("volume: filesystem of %s nearly full: %d bytes free, under the reserve of %d: writes are refused (ENOSPC to hosts) until space returns; reads go on", s.cfg.Dir, du.AvailBytes, reserve)
	case full && du.AvailBytes >= reserve+reserve/4:
		s.noSpace.Store(false)
		s.log.Infof("volume: filesystem of %s has %d bytes free again: writes resume", s.cfg.Dir, du.AvailBytes)
	}
	return true
}

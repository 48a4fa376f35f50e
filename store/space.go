package store

import "time"

// The space guard keeps pebble off a full filesystem. The data area is
// preallocated, so overwrites need no space at all; but pebble does (its
// WAL, memtable flushes, compactions), and a failed WAL write fails the
// store. A goroutine reads the filesystem's free space every
// Config.SpaceCheckInterval; under Config.ReserveBytes, writes that need a
// new cluster (a map key in pebble) fail with ErrNoSpace, while reads,
// overwrites of allocated clusters, write-zeroes and deallocates go on.
// Once free space is back above 1.25 × the reserve, first writes resume.

const (
	minReserve           = 64 << 20
	maxReserve           = 1 << 30
	defaultSpaceInterval = 100 * time.Millisecond
)

// SpaceStats is the space guard's view of pebble's filesystem.
type SpaceStats struct {
	// Monitored is false when the filesystem cannot say its free space.
	Monitored bool
	// FreeBytes, TotalBytes: the last reading; ReserveBytes: the free
	// space under which first writes are refused.
	FreeBytes, TotalBytes, ReserveBytes uint64
	// Full: first writes are being refused.
	Full bool
}

// Space returns the guard's last reading.
func (s *Store) Space() SpaceStats {
	return SpaceStats{Monitored: s.spaceMonitored.Load(), FreeBytes: s.freeBytes.Load(),
		TotalBytes: s.totalBytes.Load(), ReserveBytes: s.reserve.Load(), Full: s.noSpace.Load()}
}

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
		reserve = min(max(du.TotalBytes/50, minReserve), maxReserve)
	}
	s.freeBytes.Store(du.AvailBytes)
	s.totalBytes.Store(du.TotalBytes)
	s.reserve.Store(reserve)
	full := s.noSpace.Load()
	switch {
	case !full && du.AvailBytes < reserve:
		s.noSpace.Store(true)
		s.log.Errorf("store: filesystem of %s nearly full: %d bytes free, under the reserve of %d: writes to unallocated clusters are refused (ENOSPC to hosts); reads and overwrites go on", s.cfg.Dir, du.AvailBytes, reserve)
	case full && du.AvailBytes >= reserve+reserve/4:
		s.noSpace.Store(false)
		s.log.Infof("store: filesystem of %s has %d bytes free again: writes to unallocated clusters resume", s.cfg.Dir, du.AvailBytes)
	}
	return true
}

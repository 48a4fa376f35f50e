package store

// The background refill keeps the ready pool from running dry under a
// stream of first writes (Config.ReadyLowClusters). Without it the first
// write that finds the pool empty refills it on its own path: a synced
// pebble commit, and on a lazily zeroed device the zeroing of up to
// ReadyClusters clusters and an area sync (~60–100 ms per 1024 clusters of
// 64 KiB where the device writes its zeros), with every first write
// queued behind it waiting too. With it, a first write that leaves the
// pool below the low-water mark wakes one goroutine owned by the store,
// which tops the pool up to ReadyClusters through the same refill (same
// order, same crash story: the 'R' keys, and the watermark with them,
// committed synced before any of its clusters is handed out; one refill
// zeroes at a time). A first write that still finds the pool empty (the
// round is slower than the writes, or it failed) refills inline as before.
//
// The round never grows the area or flushes limbo: those stay with the
// first write that finds nothing free. A failed round is logged and
// counted, and the refill is not woken again until a first write has
// refilled inline successfully (a disk that fails every zeroing would
// otherwise log once per first write).

func (s *Store) startRefiller() {
	if s.cfg.ReadOnly || s.cfg.ReadyLowClusters < 0 {
		return
	}
	s.refillKick = make(chan struct{}, 1)
	s.refillStop, s.refillDone = make(chan struct{}), make(chan struct{})
	go s.refillLoop()
}

func (s *Store) refillLoop() {
	defer close(s.refillDone)
	for {
		select {
		case <-s.refillStop:
			return
		case <-s.refillKick:
		}
		if _, err := s.refillAhead(s.cfg.ReadyLowClusters); err != nil {
			s.log.Errorf("store: background refill of the ready pool failed (first writes refill it until one succeeds): %v", err)
		}
	}
}

// stopRefiller stops the background refill, waiting for a round in
// progress (Close: before the final flush and the release of the pool).
func (s *Store) stopRefiller() {
	if s.refillStop != nil {
		close(s.refillStop)
		<-s.refillDone
		s.refillStop = nil
	}
}

// kickRefill wakes the background refill if the pool is below its
// low-water mark and free clusters exist: once per round (refillKicked),
// not after a failed round. Requires s.al.mu.
func (s *Store) kickRefill() {
	if s.refillKick == nil || s.al.refillKicked || s.al.refillFailed ||
		s.al.readyLen() >= s.cfg.ReadyLowClusters || s.al.free == 0 {
		return
	}
	s.al.refillKicked = true
	select {
	case s.refillKick <- struct{}{}:
	default:
	}
}

// refillAhead is one round of the background refill: if the pool holds
// fewer than low clusters and free clusters exist, it tops the pool up to
// ReadyClusters (refill). refilled says it reserved clusters. The crash
// tests call it directly, at chosen points, with the goroutine off.
func (s *Store) refillAhead(low int) (refilled bool, err error) {
	s.al.mu.Lock()
	s.al.refillKicked = false
	if s.err() != nil || s.al.free == 0 || s.al.readyLen() >= low {
		s.al.mu.Unlock()
		return false, nil
	}
	n, err := s.refill(s.cfg.ReadyClusters, low)
	refilled = n > 0
	if err != nil {
		s.al.refillFailed = true
		s.c.bgRefillErrors.Add(1)
	} else if refilled {
		s.c.bgRefills.Add(1)
	}
	s.al.mu.Unlock()
	if refilled {
		s.hook(hookReserved)
	}
	return refilled, err
}

package target

// LockWords returns the sum of the stripe words of namespace nsid's range
// lock and the requests parked on it: both 0 once nothing is in flight.
func LockWords(s *Subsystem, nsid uint32) (words uint64, parked int) {
	ns := s.table().find(nsid)
	if ns == nil {
		return 0, 0
	}
	for i := range ns.locks.stripes {
		st := &ns.locks.stripes[i]
		words += st.w.Load()
		st.mu.Lock()
		for r := st.head; r != nil; r = r.lockNext {
			parked++
		}
		st.mu.Unlock()
	}
	return words, parked
}

// FusedEntries returns the entries of q's pairing table: waiting halves
// and verdicts not yet taken (0 once every pair is done; negative when
// the table's count of them disagrees).
func FusedEntries(q *Queue) int {
	q.fused.mu.Lock()
	defer q.fused.mu.Unlock()
	n := 0
	for _, e := range q.fused.slots {
		if e.used {
			n++
		}
	}
	if n != q.fused.n {
		return -1 - n // the count the look-ups stop by is wrong
	}
	return n
}

// Package connset is the live connections of a transport binding's port
// (target/tcp, target/rdma), kept for the port's Close: a connection is
// added when accepted, unless Close already ran, and removed once it is
// gone; Close takes what is left to disconnect it and then waits until
// every one was removed.
package connset

import "sync"

// Set is a port's live connections. The zero value is an empty, open
// set.
type Set[T comparable] struct {
	mu     sync.Mutex
	m      map[T]struct{}
	closed bool
	wg     sync.WaitGroup // one count per connection in m
}

// Add adds c unless Close ran (then the port refuses c).
func (s *Set[T]) Add(c T) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.m == nil {
		s.m = make(map[T]struct{})
	}
	s.m[c] = struct{}{}
	s.wg.Add(1)
	return true
}

// Remove takes c out once it is gone; a c not in the set (never added, or
// removed already) changes nothing.
func (s *Set[T]) Remove(c T) {
	s.mu.Lock()
	_, ok := s.m[c]
	delete(s.m, c)
	s.mu.Unlock()
	if ok {
		s.wg.Done()
	}
}

// Close closes the set to new connections and returns those in it; first
// is false if Close had run before (the caller has nothing to do).
func (s *Set[T]) Close() (conns []T, first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false
	}
	s.closed = true
	conns = make([]T, 0, len(s.m))
	for c := range s.m {
		conns = append(conns, c)
	}
	return conns, true
}

// Closed reports whether Close ran.
func (s *Set[T]) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Wait waits until every connection added was removed.
func (s *Set[T]) Wait() { s.wg.Wait() }

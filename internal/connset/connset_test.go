package connset

import (
	"slices"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/importtest"
)

// TestSet: Close returns the connections added and not removed, once;
// Add is refused afterwards; Wait returns only when the last is removed;
// removing twice, or what was never added, counts nothing.
func TestSet(t *testing.T) {
	var s Set[int]
	for c := range 3 {
		if !s.Add(c) {
			t.Fatalf("Add(%d) refused on an open set", c)
		}
	}
	s.Remove(1)
	s.Remove(1)
	s.Remove(7)
	conns, first := s.Close()
	slices.Sort(conns)
	if !first || !slices.Equal(conns, []int{0, 2}) || !s.Closed() {
		t.Fatalf("Close = %v, %v; want [0 2], true", conns, first)
	}
	if again, first := s.Close(); first || again != nil {
		t.Fatalf("second Close = %v, %v", again, first)
	}
	if s.Add(3) {
		t.Fatal("Add after Close accepted")
	}
	done := make(chan struct{})
	go func() { s.Wait(); close(done) }()
	s.Remove(0)
	select {
	case <-done:
		t.Fatal("Wait returned with a connection left")
	case <-time.After(20 * time.Millisecond):
	}
	s.Remove(2)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return once every connection was removed")
	}
}

// TestImports: a leaf below the bindings.
func TestImports(t *testing.T) { importtest.Only(t, ".") }

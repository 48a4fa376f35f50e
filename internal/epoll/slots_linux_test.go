//go:build linux

package epoll

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestSlots: a freed slot is reused with another generation, and an
// event of the old generation finds nothing.
func TestSlots(t *testing.T) {
	var s Slots[int]
	a, b, c := new(int), new(int), new(int)
	sa, ga := s.Put(a)
	sb, _ := s.Put(b)
	if sa == sb {
		t.Fatalf("two objects in slot %d", sa)
	}
	old := unix.EpollEvent{Fd: sa, Pad: ga}
	if s.Get(&old) != a || !s.Holds(sa, a) {
		t.Fatal("slot does not give back what was put")
	}
	s.Free(sa)
	if s.Get(&old) != nil || s.Holds(sa, a) {
		t.Fatal("freed slot still gives its object")
	}
	sc, gc := s.Put(c)
	if sc != sa || gc == ga || gc != s.Gen(sc) {
		t.Fatalf("Put after Free: slot %d gen %d, want slot %d with a new generation", sc, gc, sa)
	}
	if s.Get(&old) != nil {
		t.Error("an event of the old generation finds the new owner")
	}
	for _, ev := range []unix.EpollEvent{{Fd: -1}, {Fd: 99}} {
		if s.Get(&ev) != nil || s.Holds(ev.Fd, a) {
			t.Errorf("slot %d outside the table gives an object", ev.Fd)
		}
	}
}

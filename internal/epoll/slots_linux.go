//go:build linux

package epoll

import "golang.org/x/sys/unix"

// Slots is a poll group's table of what its Loop's fds belong to (a
// connection, a QP), indexed by the slot their events carry. Each slot
// has a generation, changed when the slot is freed: an event of a socket
// taken out of the set may still be in the batch a Wait returned, and
// must not be taken for the slot's next owner. Freed slots are reused,
// so the table is as large as the most fds the group held at once. The
// loop's goroutine only.
type Slots[T any] struct {
	objs []*T
	gens []uint32
	free []int32
}

// Put stores x in a free slot and returns the slot and its generation,
// for Loop.Add.
func (s *Slots[T]) Put(x *T) (slot, gen int32) {
	if n := len(s.free); n > 0 {
		slot = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		slot = int32(len(s.objs))
		s.objs = append(s.objs, nil)
		s.gens = append(s.gens, 0)
	}
	s.objs[slot] = x
	return slot, int32(s.gens[slot])
}

// Gen is slot's generation, for Loop.Mod.
func (s *Slots[T]) Gen(slot int32) int32 { return int32(s.gens[slot]) }

// Holds reports whether slot holds x.
func (s *Slots[T]) Holds(slot int32, x *T) bool {
	return slot >= 0 && int(slot) < len(s.objs) && s.objs[slot] == x
}

// Free empties slot, to be reused with the next generation.
func (s *Slots[T]) Free(slot int32) {
	s.objs[slot] = nil
	s.gens[slot]++
	s.free = append(s.free, slot)
}

// Get is what ev is for: nil if its slot was freed since it was added
// (another generation) or holds nothing.
func (s *Slots[T]) Get(ev *unix.EpollEvent) *T {
	if ev.Fd < 0 || int(ev.Fd) >= len(s.objs) || s.gens[ev.Fd] != uint32(ev.Pad) {
		return nil
	}
	return s.objs[ev.Fd]
}

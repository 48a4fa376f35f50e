// Package lfstack is the hand-over used between goroutines on blk's data
// paths: a lock-free intrusive stack that any goroutine pushes onto and
// one consumer empties at once (a Treiber stack without a single-element
// pop, so it has no ABA problem). The elements carry their own link
// field, so a push allocates nothing; the consumer gets the elements
// newest first and reverses them if it needs arrival order.
//
// Users: the poll groups of target/tcp (new connections, completions,
// disconnects) and transport/soft (QPs with work), and the NVMe/TCP
// initiator's sender.
package lfstack

import "sync/atomic"

// Stack is a lock-free stack of *T linked through a field of T. The zero
// value is empty.
type Stack[T any] struct {
	top atomic.Pointer[T]
}

// Push puts v on top; next is v's link field, which Push sets. Any
// goroutine, no lock, no allocation. v must not be on the stack already.
func (s *Stack[T]) Push(v *T, next **T) {
	for {
		old := s.top.Load()
		*next = old
		if s.top.CompareAndSwap(old, v) {
			return
		}
	}
}

// PushPair puts a, then b on top of it, in one step: no other Push lands
// between them, so a taker that reverses the stack finds b right after
// a. aNext and bNext are their link fields, which PushPair sets.
func (s *Stack[T]) PushPair(a *T, aNext **T, b *T, bNext **T) {
	*bNext = a
	for {
		old := s.top.Load()
		*aNext = old
		if s.top.CompareAndSwap(old, b) {
			return
		}
	}
}

// TakeAll empties the stack and returns its former top (nil if it was
// empty); the rest follow through the link fields, newest first.
func (s *Stack[T]) TakeAll() *T { return s.top.Swap(nil) }

// Empty reports whether the stack holds nothing now.
func (s *Stack[T]) Empty() bool { return s.top.Load() == nil }

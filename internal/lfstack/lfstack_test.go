package lfstack

import (
	"sync"
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

// TestImports: the package is a leaf; the transports and the initiator
// import it, so it may import no blk package.
func TestImports(t *testing.T) { importtest.Only(t, ".") }

type item struct {
	v    int
	next *item
}

// TestConcurrentPush: 8 goroutines push 10,000 items each while a
// consumer takes everything, over and over; every item is taken exactly
// once, and each goroutine's items arrive in the order it pushed them
// once a batch is reversed.
func TestConcurrentPush(t *testing.T) {
	const writers, per = 8, 10000
	var s Stack[item]
	items := make([]item, writers*per)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				it := &items[w*per+i]
				it.v = w*per + i
				s.Push(it, &it.next)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	seen := make([]bool, len(items))
	last := make([]int, writers)
	for i := range last {
		last[i] = -1
	}
	n := 0
	take := func() {
		for it := takeInOrder(&s); it != nil; it = it.next {
			if seen[it.v] {
				t.Fatalf("item %d taken twice", it.v)
			}
			seen[it.v] = true
			n++
			w, i := it.v/per, it.v%per
			if i <= last[w] {
				t.Fatalf("writer %d: item %d after %d", w, i, last[w])
			}
			last[w] = i
		}
	}
	for {
		select {
		case <-done:
			take()
			if n != len(items) || !s.Empty() {
				t.Fatalf("took %d of %d items; empty %v", n, len(items), s.Empty())
			}
			return
		default:
			take()
		}
	}
}

func TestPushAllocs(t *testing.T) {
	var s Stack[item]
	it := &item{}
	if n := testing.AllocsPerRun(1000, func() {
		s.Push(it, &it.next)
		s.TakeAll()
	}); n != 0 {
		t.Fatalf("%v allocations per push and take", n)
	}
}

// takeInOrder takes everything off s and links it in the order it was
// pushed (oldest first).
func takeInOrder(s *Stack[item]) *item {
	var rev *item
	for it := s.TakeAll(); it != nil; {
		next := it.next
		it.next = rev
		rev = it
		it = next
	}
	return rev
}

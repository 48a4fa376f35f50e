package lfstack

import (
	"sync"
	"testing"
)

// TestPushPairAdjacent: writers push pairs (PushPair) and single items
// (Push) at once; taken and reversed, every pair's second item comes
// right after its first, and nothing is lost.
func TestPushPairAdjacent(t *testing.T) {
	const writers, per = 6, 5000
	var s Stack[item]
	items := make([]item, writers*per*2)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				a, b := &items[(w*per+i)*2], &items[(w*per+i)*2+1]
				a.v, b.v = (w*per+i)*2, (w*per+i)*2+1
				if w%2 == 0 {
					s.PushPair(a, &a.next, b, &b.next)
				} else {
					s.Push(a, &a.next) // singles: may interleave, they pair nothing
					s.Push(b, &b.next)
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	n := 0
	check := func() {
		for it := takeInOrder(&s); it != nil; it = it.next {
			n++
			w := it.v / 2 / per
			if w%2 == 0 && it.v%2 == 0 {
				if it.next == nil || it.next.v != it.v+1 {
					t.Fatalf("pair %d: its second is not right after it", it.v/2)
				}
			}
		}
	}
	for {
		select {
		case <-done:
			check()
			if n != len(items) {
				t.Fatalf("took %d of %d items", n, len(items))
			}
			return
		default:
			check()
		}
	}
}

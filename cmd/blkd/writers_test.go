package main

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// runWriters runs n writers until the returned stop, which waits for
// them and gives the first write error. Writer w calls write(r, w) over
// and over with a generator of its own, seeded from seed and base+w (a
// test's writers of distinct ranges keep the model's order per block the
// host's); count, if not nil, counts the writes that succeeded.
func runWriters(n int, seed int64, base uint64, count *atomic.Int64, write func(r *rand.Rand, w int) error) (stop func() error) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for w := range n {
		wg.Add(1)
		r := rand.New(rand.NewPCG(uint64(seed), base+uint64(w)))
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := write(r, w); err != nil {
					errc <- err
					return
				}
				if count != nil {
					count.Add(1)
				}
			}
		}()
	}
	return func() error {
		close(done)
		wg.Wait()
		close(errc)
		return <-errc
	}
}

package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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

// startZoned starts a cluster of n nodes, node1 … nodeN, each in a zone
// of its own (zoneOf), node1 bootstrapping and the others joining it,
// each with common's flags; it returns the cluster, the node IDs and the
// registry's leader once every node is up.
func startZoned(t *testing.T, n int, common ...string) (c *cluster, ids []string, leader string) {
	t.Helper()
	c = &cluster{t: t, nodes: map[string]*nodeAddrs{}, procs: map[string]*daemon{}, common: common}
	for i := range n {
		id := fmt.Sprintf("node%d", i+1)
		ids = append(ids, id)
		c.nodes[id] = &nodeAddrs{t.TempDir(), freeAddr(t), freeAddr(t), freeAddr(t)}
	}
	c.start("node1", "--zone", zoneOf("node1"))
	for _, id := range ids[1:] {
		c.start(id, "--join", c.nodes["node1"].api, "--zone", zoneOf(id))
	}
	return c, ids, c.settled(nil)
}

// zoneOf is startZoned's zone of node id: z1 for node1.
func zoneOf(id string) string { return "z" + strings.TrimPrefix(id, "node") }

package store

import (
	"math/bits"
	"sync"
)

// allocator hands out the area's clusters. Its state is memory only,
// rebuilt at Open from the maps and the 'R' keys (docs/store.md): a
// cluster is in exactly one of these states:
//
//   - free: bit clear in used; no map names it, no 'R' key; reads zeros
//     on durable media;
//   - ready: in ready; its 'R' key is durable; reads zeros on durable
//     media; the next first write takes it;
//   - mapped: named by exactly one map key (and the volume's clusterMap);
//   - limbo: freed by a commit that may not be durable yet; has an 'R'
//     key; waits for a Flush (zero, sync the area, sync the WAL) to become
//     ready;
//   - taken: popped from ready by a first write in progress (between the
//     pop and its map commit, or back to limbo if the write fails);
//   - cluster 0: the area header.
//
// Every state but free has its bit set in used. Check recomputes all of it
// from pebble and compares.
//
// zeroed is the area's zeroed watermark (docs/store.md): "free ⇒ reads
// zeros" holds for the clusters below it; every cluster at or above it is
// free and may hold anything (a block device's previous contents). A
// refill zeroes the clusters it picks at or above it (and syncs) before
// they become ready, and advances it in the commit of their 'R' keys. It
// is the area's end, always, on an area whose new bytes read zeros (a
// file: grow keeps it there); on a lazily zeroed one (format.lazy) it is
// the 'Z' key's value.
type allocator struct {
	mu       sync.Mutex
	clusters uint64   // in the area, cluster 0 included
	zeroed   uint64   // the zeroed watermark, in [1, clusters]
	used     []uint64 // bit per cluster: set unless free
	free     uint64   // clusters with their bit clear
	cursor   uint64   // where the next search for free clusters starts
	ready    []uint64 // ready[head:] is the ready pool, in handing-out order
	head     int
	limbo    []uint64
	mapped   uint64 // clusters named by a map
	// refilling says a refill is zeroing past zeroed, syncing and
	// committing its reservations without mu; refillEnd (on mu) wakes the
	// refills and takes that wait for it (Store.refill).
	refilling     bool
	refillEnd     sync.Cond
	refillWaiters int // refills and takes waiting on refillEnd (tests)
	// refillKicked: the background refill was woken and has not started
	// its round; refillFailed: its last round failed, and no first write
	// refilled since (it is not woken again until one did: refill.go).
	refillKicked, refillFailed bool
}

// awaitRefill waits once for the refill in progress (refilling) to end,
// counted in refillWaiters. Requires mu (released while it waits).
func (a *allocator) awaitRefill() {
	a.refillWaiters++
	a.refillEnd.Wait()
	a.refillWaiters--
}

func (a *allocator) init(clusters uint64) {
	a.clusters = clusters
	a.used = make([]uint64, (clusters+63)/64)
	a.free = clusters
	a.zeroed = clusters
	a.refillEnd.L = &a.mu
	a.cursor = 1
	a.markUsed(0)
}

// grow extends the allocator to clusters, the new ones free.
func (a *allocator) grow(clusters uint64) {
	if clusters <= a.clusters {
		return
	}
	words := (clusters + 63) / 64
	a.used = append(a.used, make([]uint64, int(words)-len(a.used))...)
	a.free += clusters - a.clusters
	a.clusters = clusters
}

func (a *allocator) isUsed(p uint64) bool { return a.used[p/64]&(1<<(p%64)) != 0 }

// markUsed sets p's bit; false if it was already set.
func (a *allocator) markUsed(p uint64) bool {
	if a.isUsed(p) {
		return false
	}
	a.used[p/64] |= 1 << (p % 64)
	a.free--
	return true
}

// release makes p free: its free commit is durable and it reads zeros on
// durable media.
func (a *allocator) release(p uint64) {
	if a.isUsed(p) {
		a.used[p/64] &^= 1 << (p % 64)
		a.free++
	}
}

// pickFree marks up to n free clusters used and returns them, lowest
// first from the cursor's word on (so a fresh area hands out contiguous
// runs, and a refill continues where the last one ended).
func (a *allocator) pickFree(n uint64) []uint64 {
	out := make([]uint64, 0, min(n, a.free))
	nw := uint64(len(a.used))
	start := a.cursor / 64
	for k := uint64(0); k <= nw && uint64(len(out)) < n && a.free > 0; k++ {
		w := (start + k) % nw
		for uint64(len(out)) < n {
			word := a.used[w]
			if w == nw-1 && a.clusters%64 != 0 {
				word |= ^uint64(0) << (a.clusters % 64) // bits past the end
			}
			if word == ^uint64(0) {
				break
			}
			p := w*64 + uint64(bits.TrailingZeros64(^word))
			a.markUsed(p)
			out = append(out, p)
		}
	}
	if len(out) > 0 {
		a.cursor = (out[len(out)-1] + 1) % a.clusters
	}
	return out
}

func (a *allocator) popReady() (uint64, bool) {
	if a.head == len(a.ready) {
		return 0, false
	}
	p := a.ready[a.head]
	a.head++
	if a.head == len(a.ready) {
		a.ready, a.head = a.ready[:0], 0
	}
	return p, true
}

func (a *allocator) readyLen() int { return len(a.ready) - a.head }

func (a *allocator) pushReady(ps []uint64) { a.ready = append(a.ready, ps...) }

// takeLimbo empties limbo and returns what it held.
func (a *allocator) takeLimbo() []uint64 {
	l := a.limbo
	a.limbo = nil
	return l
}

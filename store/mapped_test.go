package store

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestMapped: the runs Mapped reports are exactly the clusters written
// and not deallocated since, clipped to the range asked and to the
// volume's size, in LBA order, merged where consecutive (against a
// model, random writes and deallocates, random ranges).
func TestMapped(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	area := NewMemArea(512*(16<<10), 512, 4096)
	s := openStore(t, memConfig(vfs.NewMem(), area))
	const bs = 4096
	const per = (16 << 10) / bs // blocks per cluster
	const blocks = 300*per + 3  // the last cluster is partial
	v := mustCreate(t, s, 1, blocks, bs)
	clusters := uint64((blocks + per - 1) / per)
	mapped := make([]bool, clusters)
	buf := make([]byte, 4*bs)
	for range 400 {
		c := rng.Uint64N(clusters)
		if rng.IntN(3) == 0 {
			n := 1 + rng.Uint64N(4)
			if c+n > clusters {
				n = clusters - c
			}
			end := min((c+n)*per, blocks)
			if err := v.Deallocate(c*per, end-c*per); err != nil {
				t.Fatal(err)
			}
			for i := c; i < c+n; i++ {
				// A cluster the range covers whole is freed; the
				// volume's last one, partial, is zeroed in place.
				if (i+1)*per <= end {
					mapped[i] = false
				}
			}
			continue
		}
		lba := c*per + rng.Uint64N(per)
		n := min(uint64(1+rng.IntN(4)), blocks-lba)
		buf[0] = 1
		if err := v.Write(lba, buf[:n*bs], 0); err != nil {
			t.Fatal(err)
		}
		for b := lba; b < lba+n; b++ {
			mapped[b/per] = true
		}
	}
	check := func(from, to uint64) {
		t.Helper()
		var want [][2]uint64
		for b := from; b < min(to, blocks); b++ {
			if !mapped[b/per] {
				continue
			}
			if k := len(want); k > 0 && want[k-1][0]+want[k-1][1] == b {
				want[k-1][1]++
			} else {
				want = append(want, [2]uint64{b, 1})
			}
		}
		var got [][2]uint64
		err := v.Mapped(from, to, func(lba, n uint64) error {
			got = append(got, [2]uint64{lba, n})
			return nil
		})
		if err != nil {
			t.Fatalf("Mapped(%d, %d): %v", from, to, err)
		}
		if len(got) != len(want) {
			t.Fatalf("Mapped(%d, %d): %v, want %v", from, to, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("Mapped(%d, %d): %v, want %v", from, to, got, want)
			}
		}
	}
	check(0, ^uint64(0))
	check(0, blocks)
	check(blocks-1, blocks+10)
	check(blocks, blocks+10)
	for range 200 {
		a, b := rng.Uint64N(blocks+5), rng.Uint64N(blocks+5)
		check(min(a, b), max(a, b))
	}
	// fn's error stops the walk and comes back as is.
	stop := errors.New("stop")
	calls := 0
	if err := v.Mapped(0, blocks, func(uint64, uint64) error { calls++; return stop }); err != stop {
		t.Fatalf("Mapped: %v, want fn's error", err)
	}
	if calls > 1 {
		t.Fatalf("fn called %d times after its error", calls)
	}
	// fn may use the volume (no lock held).
	if err := v.Mapped(0, blocks, func(lba, n uint64) error {
		return v.Read(lba, make([]byte, min(n, 4)*bs))
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(1); err != nil {
		t.Fatal(err)
	}
	if err := v.Mapped(0, blocks, func(uint64, uint64) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Mapped of a deleted volume: %v, want ErrNotFound", err)
	}
}

// TestMappedConcurrent: a walk racing writes and deallocates (run with
// -race) reports runs in increasing LBA order, within the range, and
// every cluster mapped throughout the walk.
func TestMappedConcurrent(t *testing.T) {
	area := NewMemArea(512*(16<<10), 512, 4096)
	s := openStore(t, memConfig(vfs.NewMem(), area))
	const bs, per, blocks = 4096, 4, 256 * 4
	v := mustCreate(t, s, 1, blocks, bs)
	buf := make([]byte, bs)
	for c := uint64(0); c < blocks/per; c += 2 { // even clusters stay mapped
		if err := v.Write(c*per, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			c := uint64(i%(blocks/per/2))*2 + 1 // odd clusters come and go
			if i%2 == 0 {
				_ = v.Write(c*per, buf, 0)
			} else {
				_ = v.Deallocate(c*per, per)
			}
		}
	}()
	for range 50 {
		seen := make([]bool, blocks/per)
		next := uint64(0)
		if err := v.Mapped(0, blocks, func(lba, n uint64) error {
			if lba < next || n == 0 || lba+n > blocks {
				t.Errorf("run %d+%d after %d", lba, n, next)
			}
			next = lba + n
			for b := lba; b < lba+n; b++ {
				seen[b/per] = true
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for c := 0; c < len(seen); c += 2 {
			if !seen[c] {
				t.Fatalf("cluster %d, mapped throughout, not reported", c)
			}
		}
	}
	<-done
}

package store

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestConcurrentIO: writers racing over the same clusters (first writes of
// the same cluster from several goroutines, overwrites), deallocates of
// whole clusters and readers, on two volumes, with flushes. Each writer
// owns distinct blocks, so after all is done every block holds its
// writer's last tag, or zeros if its last operation deallocated it; no
// cluster is mapped twice or leaked. On an area full of a pattern
// ("unzeroed"), the refills of the two volumes zero their runs past the
// watermark concurrently. Run it under -race.
func TestConcurrentIO(t *testing.T) {
	for _, unzeroed := range []bool{false, true} {
		t.Run(map[bool]string{false: "zeroed", true: "unzeroed"}[unzeroed], func(t *testing.T) {
			seed := testSeed(t)
			area := NewMemArea(512*(16<<10), 512, 512)
			if unzeroed {
				area = NewUnzeroedMemArea(512*(16<<10), 512, 512, seed)
			}
			testConcurrentIO(t, seed, openStore(t, memConfig(vfs.NewMem(), area)))
		})
	}
}

func testConcurrentIO(t *testing.T, seed uint64, s *Store) {
	const writers, blocks = 4, 256 // 4 KiB blocks: 4 per 16 KiB cluster, one per writer
	vols := []*Volume{mustCreate(t, s, 1, blocks, BlockSize4K), mustCreate(t, s, 2, blocks, BlockSize4K)}
	final := make([][]uint64, len(vols))
	for i := range final {
		final[i] = make([]uint64, blocks)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			buf := alignedBuf(4096, 4096)
			for k := range 400 {
				vi := rng.IntN(len(vols))
				v := vols[vi]
				lba := uint64(rng.IntN(blocks/writers)*writers + w) // this writer's blocks only
				switch rng.IntN(10) {
				case 0: // flush
					if err := s.Flush(); err != nil {
						errs <- err
						return
					}
				default:
					tag := uint64(k+1)<<8 | uint64(w)
					fillTagged(buf, v.ID(), lba, tag)
					if err := v.Write(lba, buf, 0); err != nil {
						errs <- err
						return
					}
					final[vi][lba] = tag
					if err := v.Read(lba, buf); err != nil {
						errs <- err
						return
					}
					racy := vi == 1 && lba >= blocks*3/4 // the deallocator may have cleared it
					if got, err := readTag(buf, v.ID(), lba); err != nil || (got != tag && !(racy && got == 0)) {
						errs <- fmt.Errorf("writer %d: volume %d block %d: %d (%v), want %d", w, v.ID(), lba, got, err, tag)
						return
					}
				}
			}
		}()
	}
	// One goroutine deallocates whole clusters of volume 2's last quarter
	// only, which no writer's final state is checked against (below).
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 50 {
			if err := vols[1].Deallocate(blocks*3/4, blocks/4); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	buf := alignedBuf(4096, 4096)
	for vi, v := range vols {
		for lba := range uint64(blocks) {
			if vi == 1 && lba >= blocks*3/4 {
				continue
			}
			if err := v.Read(lba, buf); err != nil {
				t.Fatal(err)
			}
			if got, err := readTag(buf, v.ID(), lba); err != nil || got != final[vi][lba] {
				t.Fatalf("volume %d block %d: %d (%v), want %d", v.ID(), lba, got, err, final[vi][lba])
			}
		}
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	if err := drain(s); err != nil {
		t.Fatal(err)
	}
}

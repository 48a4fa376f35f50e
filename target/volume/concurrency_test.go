package volume

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestConcurrentOverlappingWrites: writers race on the same blocks while
// readers read. Blocks are grouped in fours and every write and
// write-zeroes covers whole groups, so at every moment each group must
// hold one write's data in all four blocks: a read that sees a group
// half from one write and half from another has seen a torn multi-block
// write, and a block that fails its checksum is a torn block.
func TestConcurrentOverlappingWrites(t *testing.T) {
	seed := testSeed(t)
	for _, bs := range blockSizes {
		t.Run(fmt.Sprint(bs), func(t *testing.T) {
			cfg := memConfig(vfs.NewMem())
			cfg.MemTableBytes = 256 << 10
			s := openStore(t, cfg)
			const groups, group = 16, 4
			v := mustCreate(t, s, 1, groups*group, bs)
			B := uint64(bs)
			ops := iterations(t, 600, 3, 3)
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for w := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, uint64(w)))
					buf := make([]byte, 2*group*B)
					for i := range ops {
						g := rng.Uint64N(groups - 1)
						n := group * (1 + rng.Uint64N(2))
						lba := g * group
						if rng.IntN(8) == 0 {
							if err := v.WriteZeroes(lba, n, WriteFlags(rng.IntN(2))); err != nil {
								errs <- err
								return
							}
							continue
						}
						tag := uint64(w+1)<<32 | uint64(i+1)
						for j := range n {
							fillTagged(buf[j*B:(j+1)*B], 1, lba+j, tag)
						}
						var flags WriteFlags
						if rng.IntN(10) == 0 {
							flags = FUA
						}
						if err := v.Write(lba, buf[:n*B], flags); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			check := func(buf []byte, lba uint64) error {
				for g := uint64(0); g < uint64(len(buf))/(group*B); g++ {
					var first uint64
					for j := range uint64(group) {
						b := lba + g*group + j
						off := (g*group + j) * B
						tag, err := readTag(buf[off:off+B], 1, b)
						if err != nil {
							return fmt.Errorf("block %d: %w", b, err)
						}
						if j == 0 {
							first = tag
						} else if tag != first {
							return fmt.Errorf("group at block %d mixes writes %x and %x: torn multi-block write", lba+g*group, first, tag)
						}
					}
				}
				return nil
			}
			for r := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, uint64(100+r)))
					buf := make([]byte, 3*group*B)
					for range ops {
						g := rng.Uint64N(groups - 2)
						n := group * (1 + rng.Uint64N(3))
						if err := v.Read(g*group, buf[:n*B]); err != nil {
							errs <- err
							return
						}
						if err := check(buf[:n*B], g*group); err != nil {
							errs <- err
							return
						}
						if rng.IntN(20) == 0 {
							if err := v.Flush(); err != nil {
								errs <- err
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			all := make([]byte, groups*group*B)
			for g := uint64(0); g < groups; g += 4 {
				if err := v.Read(g*group, all[:4*group*B]); err != nil {
					t.Fatal(err)
				}
				if err := check(all[:4*group*B], g*group); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestConcurrentVolumes: one goroutine per volume writes and verifies its
// own volume while an administrator creates, resizes, deletes and
// inspects other volumes: no request sees another volume's data.
func TestConcurrentVolumes(t *testing.T) {
	seed := testSeed(t)
	cfg := memConfig(vfs.NewMem())
	s := openStore(t, cfg)
	ops := iterations(t, 400, 3, 3)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 4 {
		id := ID(10 + w)
		bs := blockSizes[w%2]
		v := mustCreate(t, s, id, 32, bs)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(id)))
			B := uint64(bs)
			tags := make([]uint64, 32)
			buf := make([]byte, 8*B)
			for i := range ops {
				lba := rng.Uint64N(32 - 8)
				n := 1 + rng.Uint64N(8)
				switch rng.IntN(4) {
				case 0:
					if err := v.Deallocate(lba, n); err != nil {
						errs <- err
						return
					}
					clear(tags[lba : lba+n])
				case 1, 2:
					for j := range n {
						fillTagged(buf[j*B:(j+1)*B], id, lba+j, uint64(i+1))
						tags[lba+j] = uint64(i + 1)
					}
					if err := v.Write(lba, buf[:n*B], WriteFlags(rng.IntN(2))); err != nil {
						errs <- err
						return
					}
				default:
					if err := v.Read(lba, buf[:n*B]); err != nil {
						errs <- err
						return
					}
					for j := range n {
						tag, err := readTag(buf[j*B:(j+1)*B], id, lba+j)
						if err != nil || tag != tags[lba+j] {
							errs <- fmt.Errorf("volume %d block %d: tag %d, %v; want %d", id, lba+j, tag, err, tags[lba+j])
							return
						}
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 99))
		for i := range ops / 4 {
			id := ID(100 + rng.IntN(3))
			switch rng.IntN(4) {
			case 0:
				if _, err := s.Create(id, CreateOptions{SizeBytes: 64 * 4096}); err != nil && !errors.Is(err, ErrExists) {
					errs <- err
					return
				}
			case 1:
				if err := s.Delete(id); err != nil && !errors.Is(err, ErrNotFound) {
					errs <- err
					return
				}
			case 2:
				if err := s.Resize(id, uint64(64+i)*4096, false); err != nil && !errors.Is(err, ErrNotFound) {
					errs <- err
					return
				}
			default:
				if v, err := s.Volume(10); err == nil {
					if _, err := v.Stats(); err != nil {
						errs <- err
						return
					}
				}
				if _, err := s.List(); err != nil {
					errs <- err
					return
				}
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestDeleteDuringIO: writes racing with Delete either finish before it
// or fail with ErrNotFound; none lands after it, so a volume re-created
// with the same ID reads zeros.
func TestDeleteDuringIO(t *testing.T) {
	iters := iterations(t, 30, 3, 3)
	s := openStore(t, memConfig(vfs.NewMem()))
	buf := pattern(8*4096, 1)
	for range iters {
		v := mustCreate(t, s, 7, 64, BlockSize4K)
		var wg, started sync.WaitGroup
		var failed atomic.Value
		for w := range 3 {
			wg.Add(1)
			started.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					if i == 10 {
						started.Done()
					}
					err := v.Write(uint64((w*8+i)%56), buf, 0)
					if err != nil && i < 10 {
						started.Done()
					}
					if errors.Is(err, ErrNotFound) {
						return
					}
					if err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		started.Wait() // every writer is in full flow
		if err := s.Delete(7); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			t.Fatal(err)
		}
		v2 := mustCreate(t, s, 7, 64, BlockSize4K)
		st, err := v2.Stats()
		if err != nil || st.AllocatedBytes != 0 {
			t.Fatalf("re-created volume: %+v, %v: a write landed after Delete", st, err)
		}
		if err := s.Delete(7); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCloseDuringIO: requests racing with Close succeed or fail with
// ErrClosed, never panic (pebble panics on a closed DB; the store must
// never let a request reach it).
func TestCloseDuringIO(t *testing.T) {
	s, err := Open(memConfig(vfs.NewMem()))
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	buf := make([]byte, 4096)
	var wg, started sync.WaitGroup
	var failed atomic.Value
	for w := range 4 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 4096)
			for i := 0; ; i++ {
				if i == 10 {
					started.Done()
				}
				var err error
				switch (w + i) % 4 {
				case 0:
					err = v.Write(uint64(i%64), buf, FUA)
				case 1:
					err = v.Read(uint64(i%64), b)
				case 2:
					if i%8 == 2 {
						err = s.Flush()
					} else {
						err = v.Flush()
					}
				default:
					err = v.Deallocate(uint64(i%64), 1)
				}
				if err != nil && i < 10 {
					started.Done()
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	started.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
}

package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Administration and teardown racing with I/O, ported from target/volume's
// concurrency tests when it was retired. Run them under -race.

// TestConcurrentVolumes: one goroutine per volume (both block sizes)
// writes, deallocates and verifies its own volume while an administrator
// creates, resizes, deletes and inspects other volumes: no request sees
// another volume's data, and the allocator agrees with the maps after.
func TestConcurrentVolumes(t *testing.T) {
	seed := testSeed(t)
	s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(128*(16<<10), 512, 512)))
	ops := iterations(t, 400, 3, 3)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 4 {
		id := ID(10 + w)
		bs := []uint32{BlockSize4K, BlockSize512}[w%2]
		v := mustCreate(t, s, id, 32, bs)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(id)))
			B := uint64(bs)
			tags := make([]uint64, 32)
			buf := alignedBuf(int(8*B), 4096)
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
							errs <- fmt.Errorf("volume %d block %d: tag %d, %v; want %d (seed %d)", id, lba+j, tag, err, tags[lba+j], seed)
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
		buf := alignedBuf(4096, 4096)
		for i := range ops / 4 {
			id := ID(100 + rng.IntN(3))
			switch rng.IntN(5) {
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
			case 3: // the administered volumes take clusters too
				if v, err := s.Volume(id); err == nil {
					if err := v.Write(rng.Uint64N(64), buf, 0); err != nil && !errors.Is(err, ErrNotFound) {
						errs <- err
						return
					}
				}
			default:
				if v, err := s.Volume(10); err == nil {
					_ = v.Stats()
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
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestDeleteDuringIO: writes racing with Delete either finish before it
// or fail with ErrNotFound; none lands after it, so a volume re-created
// with the same ID holds no cluster and reads zeros.
func TestDeleteDuringIO(t *testing.T) {
	iters := iterations(t, 30, 3, 3)
	s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512)))
	buf := alignedBuf(8*4096, 4096)
	for i := range buf {
		buf[i] = byte(i%251) + 1
	}
	got := alignedBuf(16*4096, 4096)
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
		if st := v2.Stats(); st.AllocatedBytes != 0 {
			t.Fatalf("re-created volume: %+v: a write landed after Delete", st)
		}
		for lba := uint64(0); lba < 64; lba += 16 { // MaxTransferBytes: 64 KiB
			if err := v2.Read(lba, got); err != nil || !isZero(got) {
				t.Fatalf("re-created volume does not read zeros at %d (%v)", lba, err)
			}
		}
		if err := s.Delete(7); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestCloseDuringIO: requests racing with Close succeed or fail with
// ErrClosed, never panic nor hang (pebble panics on a closed DB; the store
// must never let a request reach it or the closed area).
func TestCloseDuringIO(t *testing.T) {
	s, err := Open(memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512)))
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	buf := alignedBuf(4096, 4096)
	var wg, started sync.WaitGroup
	var failed atomic.Value
	for w := range 4 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			b := alignedBuf(4096, 4096)
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

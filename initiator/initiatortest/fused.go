package initiatortest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
)

// FusedWorkload runs fused Compare and Write through blk's initiator
// against a target (TestFusedOverWire in both bindings):
//
//   - a 4 KiB pair (its data in the capsules) and a 64 KiB pair (data the
//     target fetches: R2T, RDMA READ), each written only when the blocks
//     hold the compare data, and refused with Compare Failure, writing
//     nothing, when they do not;
//   - 64 KiB pairs each followed at once by a plain write of other
//     blocks on the same queue, so that the command after a second runs
//     while the second's data is still coming;
//   - workers goroutines incrementing counters in a few hot blocks (read,
//     then Compare and Write old → old+1; 4 KiB and 64 KiB), while others
//     write blocks of their own: at the end each counter equals the pairs
//     that succeeded on it.
//
// The namespace needs 4096-byte blocks and at least 2048 of them. It
// returns the number of pairs that wrote and that miscompared.
func FusedWorkload(t testing.TB, ns *initiator.Namespace, seed uint64, workers int) (wrote, miscompared uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const bs = 4096
	var mu sync.Mutex
	count := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			wrote++
		case initiator.IsCompareFailure(err):
			miscompared++
		}
	}
	read := func(lba uint64, n int) []byte {
		b := make([]byte, n)
		if _, err := ns.ReadAt(b, int64(lba)*bs); err != nil {
			t.Fatalf("read %d: %v", lba, err)
		}
		return b
	}
	// One pair of each size: a match writes, a mismatch does not.
	for _, size := range []int{bs, 16 * bs} {
		lba := uint64(1024)
		old := bytes.Repeat([]byte{0x11}, size)
		if _, err := ns.WriteAt(old, int64(lba)*bs); err != nil {
			t.Fatal(err)
		}
		neu := bytes.Repeat([]byte{0x22}, size)
		err := ns.CompareAndWrite(ctx, lba, old, neu, 0)
		count(err)
		if err != nil {
			t.Fatalf("%d-byte pair over its own data: %v", size, err)
		}
		if got := read(lba, size); !bytes.Equal(got, neu) {
			t.Fatalf("%d-byte pair: the write did not land", size)
		}
		err = ns.CompareAndWrite(ctx, lba, old, bytes.Repeat([]byte{0x33}, size), initiator.FUA)
		count(err)
		if !initiator.IsCompareFailure(err) {
			t.Fatalf("%d-byte pair over other data: %v, want Compare Failure", size, err)
		}
		if got := read(lba, size); !bytes.Equal(got, neu) {
			t.Fatalf("%d-byte pair that miscompared wrote", size)
		}
	}
	// A 64 KiB pair, then a plain write right behind its second.
	for i := range 8 {
		lba := uint64(1100 + 16*i)
		cmp := make([]byte, 16*bs) // never written: zeros
		data := bytes.Repeat([]byte{byte(i + 1)}, 16*bs)
		pdone, wdone := make(initiator.DoneChan, 1), make(initiator.DoneChan, 1)
		for {
			err := ns.CompareAndWriteAsync(lba, cmp, data, 0, pdone)
			if err == nil {
				break
			}
			if !errors.Is(err, initiator.ErrQueueFull) {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		plain := bytes.Repeat([]byte{0xee}, bs)
		for {
			err := ns.WriteAsync(uint64(1300+i), plain, 0, wdone)
			if err == nil {
				break
			}
			if !errors.Is(err, initiator.ErrQueueFull) {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		err := <-pdone
		count(err)
		if err != nil {
			t.Fatalf("pair at %d: %v", lba, err)
		}
		if err := <-wdone; err != nil {
			t.Fatalf("the write behind the pair at %d: %v", lba, err)
		}
		if got := read(lba, 16*bs); !bytes.Equal(got, data) {
			t.Fatalf("pair at %d: the write did not land", lba)
		}
	}

	// Counters in hot blocks 0..3 (4 KiB pairs) and 16..31 (one 64 KiB
	// pair over 16 blocks, its counter in block 16).
	hot := []struct {
		lba  uint64
		size int
	}{{0, bs}, {1, bs}, {2, bs}, {3, bs}, {16, 16 * bs}}
	succ := make([]uint64, len(hot))
	const rounds = 60
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(2)
		go func(rng *rand.Rand) { // a pair worker
			defer wg.Done()
			for range rounds {
				i := rng.IntN(len(hot))
				h := hot[i]
				cur := make([]byte, h.size)
				if _, err := ns.ReadAt(cur, int64(h.lba)*bs); err != nil {
					t.Errorf("read: %v", err)
					return
				}
				next := bytes.Clone(cur)
				binary.LittleEndian.PutUint64(next, binary.LittleEndian.Uint64(cur)+1)
				err := ns.CompareAndWrite(ctx, h.lba, cur, next, 0)
				count(err)
				switch {
				case err == nil:
					mu.Lock()
					succ[i]++
					mu.Unlock()
				case initiator.IsCompareFailure(err):
				default:
					t.Errorf("pair on block %d: %v", h.lba, err)
					return
				}
			}
		}(rand.New(rand.NewPCG(seed, uint64(w))))
		go func(rng *rand.Rand) { // a plain writer, in the hot blocks' stripes
			defer wg.Done()
			b := make([]byte, bs)
			for range rounds {
				lba := uint64(4+w) + uint64(workers)*uint64(rng.IntN(2))
				if lba >= 16 {
					lba = 4 + uint64(w%12)
				}
				b[0] = byte(rng.Uint32())
				if _, err := ns.WriteAt(b, int64(lba)*bs); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		}(rand.New(rand.NewPCG(seed, uint64(100+w))))
	}
	wg.Wait()
	for i, h := range hot {
		got := binary.LittleEndian.Uint64(read(h.lba, bs))
		if got != succ[i] {
			t.Errorf("hot block %d: counter %d, %d pairs succeeded on it", h.lba, got, succ[i])
		}
	}
	return wrote, miscompared
}

// FusedFlood puts pairs fused Compare and Write pairs in flight at once
// through ns, each on blocks of its own (the compare data what the
// blocks hold: zeros, never written), alternating 4 KiB and 64 KiB, and
// waits for all (TestFusedBufferExhaustion: a target whose buffers the
// waiting halves could exhaust). Every pair must write; the blocks are
// read back. The namespace needs 4096-byte blocks, base+pairs×16 of them.
func FusedFlood(t testing.TB, ns *initiator.Namespace, base uint64, pairs int) {
	t.Helper()
	const bs = 4096
	done := make(initiator.DoneChan, pairs)
	datas := make([][]byte, pairs)
	for i := range pairs {
		size := bs
		if i%2 == 1 {
			size = 16 * bs
		}
		lba := base + uint64(i)*16
		datas[i] = bytes.Repeat([]byte{byte(i + 1)}, size)
		for {
			err := ns.CompareAndWriteAsync(lba, make([]byte, size), datas[i], 0, done)
			if err == nil {
				break
			}
			if !errors.Is(err, initiator.ErrQueueFull) {
				t.Fatalf("pair %d: %v", i, err)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	timeout := time.After(30 * time.Second)
	for i := range pairs {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a pair failed: %v", err)
			}
		case <-timeout:
			t.Fatalf("%d of %d pairs never completed", pairs-i, pairs)
		}
	}
	for i := range pairs {
		got := make([]byte, len(datas[i]))
		if _, err := ns.ReadAt(got, int64(base+uint64(i)*16)*bs); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, datas[i]) {
			t.Fatalf("pair %d: its write did not land", i)
		}
	}
}

// FusedAllocs checks that fused Compare and Write pairs (two of 4 KiB,
// two of 64 KiB, in flight at once, each comparing what its blocks hold
// and writing it back) allocate nothing in steady state: host, binding
// and core, all in this process (testing.AllocsPerRun counts every
// goroutine's).
func FusedAllocs(t *testing.T, ns *initiator.Namespace) {
	t.Helper()
	const bs = 4096
	sizes := []int{bs, bs, 16 * bs, 16 * bs}
	bufs := make([][]byte, len(sizes))
	for i, n := range sizes {
		bufs[i] = bytes.Repeat([]byte{byte(0x40 + i)}, n)
		if _, err := ns.WriteAt(bufs[i], int64(i)*64*bs); err != nil {
			t.Fatal(err)
		}
	}
	done := make(initiator.DoneChan, len(sizes))
	run := func() {
		for i := range sizes {
			if err := ns.CompareAndWriteAsync(uint64(i)*64, bufs[i], bufs[i], 0, done); err != nil {
				t.Fatal(err)
			}
		}
		for range sizes {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 100 { // warm every pool
		run()
	}
	if a := testing.AllocsPerRun(200, run) / float64(len(sizes)); a > 0.02 {
		t.Errorf("%.3f allocations per pair (host and target), want 0", a)
	} else {
		t.Logf("%.3f allocations per pair", a)
	}
}

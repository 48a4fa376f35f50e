package target_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// stampedQueue is an I/O queue driven by one goroutine that stamps its
// commands' arrival as a binding does (Seq, PrevFuse), so that the test
// may then execute a pair's halves in either order.
type stampedQueue struct {
	h    *harness
	q    *tq
	seq  uint32
	prev uint8
}

// arrive stamps cmd's arrival: its Seq and PrevFuse.
func (s *stampedQueue) arrive(cmd nvme.Command) (uint32, uint8) {
	seq, prev := s.seq, s.prev
	s.seq++
	s.prev = cmd.Fuse()
	return seq, prev
}

// one executes cmd alone and returns its call, not waited for.
func (s *stampedQueue) one(cmd nvme.Command, data []byte) *call {
	seq, prev := s.arrive(cmd)
	return s.h.submitStamped(s.q, cmd, data, seq, prev)
}

// pair sends a Compare of cmp and a Write of data at slba as a fused
// pair, executing the second first when swap; it returns both calls, not
// waited for.
func (s *stampedQueue) pair(slba uint64, cmp, data []byte, swap bool) (first, second *call) {
	blocks := uint32(len(data) / 4096)
	fc := fusedCmd(nvme.IOCompare, 1, slba, blocks, nvme.FlagFuseFirst)
	sc := fusedCmd(nvme.IOWrite, 1, slba, blocks, nvme.FlagFuseSecond)
	fseq, fprev := s.arrive(fc)
	sseq, sprev := s.arrive(sc)
	if swap {
		second = s.h.submitStamped(s.q, sc, data, sseq, sprev)
		first = s.h.submitStamped(s.q, fc, cmp, fseq, fprev)
	} else {
		first = s.h.submitStamped(s.q, fc, cmp, fseq, fprev)
		second = s.h.submitStamped(s.q, sc, data, sseq, sprev)
	}
	return first, second
}

// fusedTarget serves one namespace of blocks 4 KiB blocks (backend
// "mem": a MemBackend, synchronous with View; "delayed": a
// DelayedBackend, completing late and out of order on its goroutines)
// and connects n controllers of one I/O queue each.
func fusedTarget(t *testing.T, backend string, blocks uint64, n int, seed uint64) (*harness, *target.Subsystem, []*stampedQueue) {
	t.Helper()
	h := newHarness(t)
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subA, AllowAnyHost: true})
	if err != nil {
		t.Fatal(err)
	}
	nc := target.NamespaceConfig{NSID: 1}
	switch backend {
	case "mem":
		m, _ := target.NewMemBackend(4096, blocks)
		nc.Backend = m
	default:
		d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: blocks, Seed: seed,
			MaxDelay: 50 * time.Microsecond, Workers: 3})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
		nc.Async = d
	}
	if err := s.AddNamespace(nc); err != nil {
		t.Fatal(err)
	}
	qs := make([]*stampedQueue, n)
	for i := range qs {
		_, cntlid := h.adminConnect(fmt.Sprintf("admin%d", i), hostA, subA, 0)
		qs[i] = &stampedQueue{h: h, q: h.ioConnect(fmt.Sprintf("io%d", i), 1, hostA, subA, cntlid)}
	}
	return h, s, qs
}

// TestFusedAtomic: writer queues write blocks of their own, some in the
// stripes of the hot blocks, while pair queues increment counters held
// in a few hot blocks with Compare and Write (compare the value read,
// write it plus one), halves in either order. At the end each hot
// block's counter is the number of pairs that succeeded on it — a pair
// that was not atomic against another would lose an increment — and
// every writer's blocks hold its last write.
func TestFusedAtomic(t *testing.T) {
	for _, backend := range []string{"mem", "delayed"} {
		t.Run(backend, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			defer func() {
				if t.Failed() {
					t.Logf("seed %d", seed)
				}
			}()
			fusedAtomic(t, backend, seed)
		})
	}
}

func fusedAtomic(t *testing.T, backend string, seed uint64) {
	const (
		hot     = 4  // blocks 0..3 hold counters
		blocks  = 64 // 4..63 are the writers', 4..15 in the hot blocks' stripe
		writers = 2
		pairers = 3
		rounds  = 150
	)
	h, sub, qs := fusedTarget(t, backend, blocks, writers+pairers, seed)
	var succ [hot]atomic.Uint64
	model := make([][]byte, blocks)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func(sq *stampedQueue, rng *rand.Rand) {
			defer wg.Done()
			for range rounds {
				b := uint64(hot + w + writers*rng.IntN((blocks-hot)/writers))
				data := make([]byte, 4096)
				binary.LittleEndian.PutUint64(data, rng.Uint64())
				data[4095] = byte(b)
				var c *call
				if rng.IntN(8) == 0 {
					c = sq.one(ioCmd(nvme.IOWriteZeroes, 1, b, 1, 0), nil)
					data = make([]byte, 4096)
				} else {
					c = sq.one(ioCmd(nvme.IOWrite, 1, b, 1, 0), data)
				}
				c.wait(t)
				if s := c.status(); s != nvme.StatusSuccess {
					t.Errorf("write of block %d: %s", b, fmtStatus(s))
					return
				}
				model[b] = data
			}
		}(qs[w], rand.New(rand.NewPCG(seed, uint64(w))))
	}
	for p := range pairers {
		wg.Add(1)
		go func(sq *stampedQueue, rng *rand.Rand) {
			defer wg.Done()
			for range rounds {
				b := uint64(rng.IntN(hot))
				rc := sq.one(ioCmd(nvme.IORead, 1, b, 1, 0), make([]byte, 4096))
				rc.wait(t)
				if s := rc.status(); s != nvme.StatusSuccess {
					t.Errorf("read of block %d: %s", b, fmtStatus(s))
					return
				}
				cur := rc.data
				next := bytes.Clone(cur)
				binary.LittleEndian.PutUint64(next, binary.LittleEndian.Uint64(cur)+1)
				f, s := sq.pair(b, cur, next, rng.IntN(2) == 0)
				f.wait(t)
				s.wait(t)
				fs, ss := f.status(), s.status()
				switch {
				case fs == nvme.StatusSuccess && ss == nvme.StatusSuccess:
					succ[b].Add(1)
				case fs == nvme.StatusCompareFailure.WithDNR() && ss == nvme.StatusAbortFusedFail:
					// another pair got there first
				default:
					t.Errorf("pair on block %d: %s, %s", b, fmtStatus(fs), fmtStatus(ss))
					return
				}
			}
		}(qs[writers+p], rand.New(rand.NewPCG(seed, uint64(100+p))))
	}
	wg.Wait()
	sq := qs[0]
	var total uint64
	for b := range uint64(hot) {
		c := sq.one(ioCmd(nvme.IORead, 1, b, 1, 0), make([]byte, 4096))
		c.wait(t)
		if got, want := binary.LittleEndian.Uint64(c.data), succ[b].Load(); got != want {
			t.Errorf("hot block %d: counter %d, %d pairs succeeded", b, got, want)
		}
		total += succ[b].Load()
	}
	for b := uint64(hot); b < blocks; b++ {
		if model[b] == nil {
			continue
		}
		c := sq.one(ioCmd(nvme.IORead, 1, b, 1, 0), make([]byte, 4096))
		c.wait(t)
		if !bytes.Equal(c.data, model[b]) {
			t.Errorf("block %d differs from its writer's last write", b)
		}
	}
	st := h.tgt.Stats()
	if st.FusedPairs != total || total == 0 {
		t.Errorf("Stats.FusedPairs %d, %d pairs succeeded", st.FusedPairs, total)
	}
	if w, n := target.LockWords(sub, 1); w != 0 || n != 0 {
		t.Errorf("range lock not released: words %#x, %d parked", w, n)
	}
	checkFusedTables(t, qs)
	t.Logf("%s: %d pairs, %d miscompares, %d lock waits", backend, total, st.FusedMiscompares, st.LockWaits)
}

// TestRangeLockNoDeadlock: queues send random overlapping plain writes
// (Write, Write Zeroes wide and narrow, deallocating DSMs of several
// ranges) and pairs of up to 128 KiB, many in flight at once, through a
// DelayedBackend completing out of order: everything completes, and the
// stripe words return to 0.
func TestRangeLockNoDeadlock(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	defer func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	}()
	const (
		blocks   = 4096 // 16 MiB: 256 regions, every stripe
		queues   = 4
		rounds   = 20
		inflight = 12
	)
	h, sub, qs := fusedTarget(t, "delayed", blocks, queues, seed)
	var wg sync.WaitGroup
	for i, sq := range qs {
		wg.Add(1)
		go func(sq *stampedQueue, rng *rand.Rand) {
			defer wg.Done()
			for range rounds {
				var calls []*call
				for range inflight {
					calls = append(calls, randomLockOp(sq, rng, blocks)...)
				}
				for _, c := range calls {
					c.wait(t)
					switch s := c.status(); s {
					case nvme.StatusSuccess, nvme.StatusCompareFailure.WithDNR(), nvme.StatusAbortFusedFail:
					default:
						t.Errorf("opcode %#x: %s", c.req.Cmd.Opcode, fmtStatus(s))
					}
				}
			}
		}(sq, rand.New(rand.NewPCG(seed, uint64(i))))
	}
	wg.Wait()
	if w, n := target.LockWords(sub, 1); w != 0 || n != 0 {
		t.Errorf("range lock not released: words %#x, %d parked", w, n)
	}
	checkFusedTables(t, qs)
	t.Logf("%d lock waits, %d pairs", h.tgt.Stats().LockWaits, h.tgt.Stats().FusedPairs)
}

// randomLockOp sends one random command or pair, not waited for.
func randomLockOp(sq *stampedQueue, rng *rand.Rand, blocks uint64) []*call {
	// Most ranges land in the first 1 MiB, so that they overlap.
	slba := uint64(rng.IntN(256))
	if rng.IntN(4) == 0 {
		slba = uint64(rng.IntN(int(blocks) - 32))
	}
	n := uint32(1 + rng.IntN(32))
	switch rng.IntN(6) {
	case 0, 1:
		cmp := make([]byte, int(n)*4096) // zeros: matches where nothing was written
		data := make([]byte, int(n)*4096)
		data[0] = byte(rng.Uint32())
		f, s := sq.pair(slba, cmp, data, rng.IntN(2) == 0)
		return []*call{f, s}
	case 2:
		return []*call{sq.one(ioCmd(nvme.IOWrite, 1, slba, n, 0), make([]byte, int(n)*4096))}
	case 3:
		// Write Zeroes over up to the whole namespace (every stripe).
		if rng.IntN(3) == 0 {
			return []*call{sq.one(ioCmd(nvme.IOWriteZeroes, 1, 0, uint32(blocks), nvme.RWDEAC), nil)}
		}
		return []*call{sq.one(ioCmd(nvme.IOWriteZeroes, 1, slba, n, 0), nil)}
	case 4:
		var buf []byte
		for range 1 + rng.IntN(4) {
			r := nvme.DSMRange{SLBA: uint64(rng.IntN(int(blocks) - 64)), NLB: uint32(1 + rng.IntN(64))}
			var b [nvme.DSMRangeSize]byte
			r.Marshal(&b)
			buf = append(buf, b[:]...)
		}
		cmd := nvme.Command{Opcode: uint8(nvme.IODatasetManagement), Flags: nvme.FlagSGLMetaBuf, NSID: 1,
			CDW10: uint32(len(buf)/nvme.DSMRangeSize - 1), CDW11: nvme.DSMAD}
		return []*call{sq.one(cmd, buf)}
	default:
		return []*call{sq.one(ioCmd(nvme.IOWrite, 1, slba, n, nvme.RWFUA), make([]byte, int(n)*4096))}
	}
}

// checkFusedTables fails if a queue's pairing table holds anything once
// every command completed.
func checkFusedTables(t *testing.T, qs []*stampedQueue) {
	t.Helper()
	for i, sq := range qs {
		if n := target.FusedEntries(sq.q.q); n != 0 {
			t.Errorf("queue %d: %d entries left in its pairing table", i, n)
		}
	}
}

// Package initiatortest holds workloads that tests of targets run
// through blk's initiator: written once here, run by the NVMe/TCP and
// NVMe/RDMA bindings' tests alike. It is for tests only.
package initiatortest

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
)

// slot is one of the workload's commands in flight: it owns a
// region of the namespace, so that no two commands in flight overlap and
// the model needs no order.
type slot struct {
	idx        int
	lo, blocks uint64 // its region
	model      []byte // the region's expected contents
	buf        []byte
	op         byte // 'r', 'w', 'f', 'z'
	lba, n     uint64
	res        chan<- result
}

type result struct {
	s   *slot
	err error
}

func (s *slot) IODone(err error) { s.res <- result{s, err} }

// RandomWorkload issues ops seeded random reads, writes (some FUA),
// write zeroes and flushes with depth commands in flight, checks every
// read against the model as it completes, then reads the whole namespace
// back; it returns the namespace's contents. Each command in flight owns
// a region of the namespace, so the model needs no order between them.
func RandomWorkload(t testing.TB, ns *initiator.Namespace, seed uint64, depth, ops int) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 22))
	bs := uint64(ns.BlockSize())
	per := ns.Blocks() / uint64(depth)
	res := make(chan result, depth)
	slots := make([]*slot, depth)
	initial := make([]byte, ns.Size())
	if _, err := ns.ReadAt(initial, 0); err != nil {
		t.Fatal(err)
	}
	for i := range slots {
		slots[i] = &slot{idx: i, lo: uint64(i) * per, blocks: per, buf: make([]byte, 16*bs), res: res}
		slots[i].model = append([]byte(nil), initial[uint64(i)*per*bs:uint64(i+1)*per*bs]...)
	}
	start := func(s *slot) error {
		s.n = 1 + rng.Uint64N(16)
		s.lba = s.lo + rng.Uint64N(s.blocks-s.n+1)
		buf := s.buf[:s.n*bs]
		switch p := rng.IntN(100); {
		case p < 40:
			s.op = 'r'
			return ns.ReadAsync(s.lba, buf, s)
		case p < 85:
			s.op = 'w'
			for i := range buf {
				buf[i] = byte(rng.Uint32())
			}
			var f initiator.IOFlags
			if rng.IntN(8) == 0 {
				f = initiator.FUA
			}
			return ns.WriteAsync(s.lba, buf, f, s)
		case p < 92:
			s.op = 'z'
			return ns.WriteZeroesAsync(s.lba, uint32(s.n), s)
		default:
			s.op = 'f'
			return ns.FlushAsync(s)
		}
	}
	for _, s := range slots {
		if err := start(s); err != nil {
			t.Fatal(err)
		}
	}
	for done := 0; done < ops+depth; done++ {
		var r result
		select {
		case r = <-res:
		case <-time.After(30 * time.Second):
			t.Fatalf("no completion in 30 s (%d done)", done)
		}
		s := r.s
		if r.err != nil {
			t.Fatalf("slot %d op %c LBA %d+%d: %v", s.idx, s.op, s.lba, s.n, r.err)
		}
		off := (s.lba - s.lo) * bs
		m := s.model[off : off+s.n*bs]
		switch s.op {
		case 'r':
			if !bytes.Equal(s.buf[:len(m)], m) {
				t.Fatalf("slot %d: read LBA %d+%d differs from what was written", s.idx, s.lba, s.n)
			}
		case 'w':
			copy(m, s.buf)
		case 'z':
			clear(m)
		}
		if done < ops {
			if err := start(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Everything back, in one model.
	all := initial
	for _, s := range slots {
		copy(all[s.lo*bs:], s.model)
	}
	got := make([]byte, len(all))
	if _, err := ns.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, all) {
		t.Fatal("the namespace differs from what was written")
	}
	return all
}

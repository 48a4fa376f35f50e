package volume

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestModel runs thousands of random operations (data and administrative,
// valid and invalid, with reopens) against a Store and against a plain
// in-memory model, and requires the same result from both: the same data
// on every read, the same sentinel error on every failure, the same space
// use. The same seed runs under several configurations, pebble-style:
// the results must not depend on them.
func TestModel(t *testing.T) {
	seed := testSeed(t)
	ops := iterations(t, 6000, 2, 4)
	for _, c := range []struct {
		name   string
		tweak  func(*Config)
		ops    int
		reopen bool
	}{
		{"point-deletes", func(c *Config) { c.PointDeleteMaxBlocks = 1; c.MemTableBytes = 256 << 10 }, ops, true},
		{"range-deletes", func(c *Config) { c.PointDeleteMaxBlocks = 64 }, ops, true},
		{"small-transfer", func(c *Config) { c.MaxTransferBytes = 4096; c.PointDeleteMaxBlocks = 8 }, ops / 2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := memConfig(vfs.NewMem())
			c.tweak(&cfg)
			runModel(t, seed, cfg, c.ops, c.reopen)
		})
	}
}

type modelVol struct {
	info   Info
	blocks map[uint64][]byte // written blocks; absent reads as zeros
	handle *Volume           // the store's current handle
}

func runModel(t *testing.T, seed uint64, cfg Config, nops int, reopen bool) {
	rng := rand.New(rand.NewPCG(seed, 0x30de1))
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	model := map[ID]*modelVol{}
	stale := map[ID]*Volume{} // handles kept across delete and re-create
	maxBytes := cfg.MaxTransferBytes
	stats := map[string]int{} // outcomes, logged to show what the run covered
	defer func() { t.Logf("%d ops: %v", nops, stats) }()

	// expect is the error the model predicts for a data request on id,
	// following the store's order of checks.
	expect := func(id ID, h *Volume, write bool, lba uint64, length int, n uint64) error {
		m := model[id]
		if m == nil || h != m.handle {
			return ErrNotFound // no volume, or a handle kept from before a delete
		}
		bs := int(m.info.BlockSize)
		if length >= 0 {
			if length%bs != 0 {
				return ErrMisaligned
			}
			if length > maxBytes {
				return ErrTooLarge
			}
			n = uint64(length / bs)
		}
		if blocks := m.info.Blocks(); lba > blocks || n > blocks-lba {
			return ErrOutOfRange
		}
		if write && n > 0 && m.info.State == StateReadOnly {
			return ErrReadOnly
		}
		return nil
	}
	check := func(k int, what string, got, want error) {
		t.Helper()
		if want == nil {
			stats[what[:min(len(what), 5)]+" ok"]++
		} else {
			stats[want.Error()[8:]]++
		}
		if want == nil && got != nil || want != nil && !errors.Is(got, want) {
			t.Fatalf("op %d: %s: got %v, want %v", k, what, got, want)
		}
	}
	pickLBA := func(m *modelVol, n uint64) uint64 {
		blocks := m.info.Blocks()
		switch rng.IntN(20) {
		case 0, 1:
			return blocks - min(n, blocks) // ends at the last block
		case 2:
			return blocks + uint64(rng.IntN(3)) - 1 // around the end
		case 3:
			return rng.Uint64() // anywhere
		default:
			if n >= blocks {
				return 0
			}
			return rng.Uint64N(blocks - n + 1)
		}
	}
	handle := func(id ID) *Volume {
		if h, ok := stale[id]; ok && rng.IntN(4) == 0 {
			return h
		}
		h, err := s.Volume(id)
		if err != nil {
			return nil
		}
		stale[id] = h
		return h
	}

	for k := range nops {
		id := ID(rng.IntN(3))
		m := model[id]
		r := rng.IntN(100)
		if m == nil && rng.IntN(2) == 0 {
			r = 0 // mostly create what is missing
		}
		switch {
		case r < 2: // create
			bs := []uint32{512, 4096, 4096, 1024}[rng.IntN(4)]
			size := uint64(1+rng.IntN(300)) * uint64(bs)
			if rng.IntN(10) == 0 {
				size += 512 // misaligned for 4 KiB blocks
			}
			h, err := s.Create(id, CreateOptions{SizeBytes: size, BlockSize: bs})
			var want error
			switch {
			case bs == 1024 || size%uint64(bs) != 0:
				want = ErrInvalid
			case m != nil:
				want = ErrExists
			}
			check(k, fmt.Sprintf("create %d size %d bs %d", id, size, bs), err, want)
			if want == nil {
				model[id] = &modelVol{Info{ID: id, SizeBytes: size, BlockSize: bs, State: StateOnline}, map[uint64][]byte{}, h}
			}
		case r < 3: // delete
			err := s.Delete(id)
			check(k, fmt.Sprintf("delete %d", id), err, map[bool]error{true: ErrNotFound}[m == nil])
			delete(model, id)
		case r < 9: // resize
			if m == nil {
				check(k, "resize missing", s.Resize(id, 4096, false), ErrNotFound)
				continue
			}
			bs := uint64(m.info.BlockSize)
			nb := uint64(1 + rng.IntN(250))
			size := nb * bs
			if rng.IntN(10) == 0 {
				size++ // misaligned
			}
			force := rng.IntN(2) == 0
			var want error
			lose := false
			for lba := range m.blocks {
				if lba >= nb {
					lose = true
				}
			}
			switch {
			case size%bs != 0:
				want = ErrInvalid
			case lose && !force:
				want = ErrWouldLoseData
			}
			check(k, fmt.Sprintf("resize %d to %d force %v", id, size, force), s.Resize(id, size, force), want)
			if want == nil {
				m.info.SizeBytes = size
				for lba := range m.blocks {
					if lba >= nb {
						delete(m.blocks, lba)
					}
				}
			}
		case r < 11: // state
			st := []State{StateOnline, StateOnline, StateOnline, StateReadOnly}[rng.IntN(4)]
			err := s.SetState(id, st)
			check(k, "set state", err, map[bool]error{true: ErrNotFound}[m == nil])
			if m != nil {
				m.info.State = st
			}
		case r < 13: // flush
			if h := handle(id); h != nil {
				check(k, "flush", h.Flush(), expect(id, h, false, 0, 0, 0))
			}
		case r < 14 && reopen: // close and reopen: everything acknowledged survives
			stats["reopen"]++
			if err := s.Close(); err != nil {
				t.Fatalf("op %d: close: %v", k, err)
			}
			if s, err = Open(cfg); err != nil {
				t.Fatalf("op %d: reopen: %v", k, err)
			}
			clear(stale)
			list, err := s.List()
			if err != nil || len(list) != len(model) {
				t.Fatalf("op %d: after reopen List = %v, %v; model has %d volumes", k, list, err, len(model))
			}
			for _, info := range list {
				if model[info.ID] == nil || model[info.ID].info != info {
					t.Fatalf("op %d: after reopen volume %+v, model %+v", k, info, model[info.ID])
				}
				model[info.ID].handle, _ = s.Volume(info.ID)
			}
		default: // data requests
			h := handle(id)
			if h == nil {
				continue
			}
			if m == nil || h != m.handle {
				// A handle kept from before a delete.
				check(k, "read on deleted", h.Read(0, make([]byte, 512)), ErrNotFound)
				stats["stale"]++
				continue
			}
			bs := int(m.info.BlockSize)
			n := 1 + rng.IntN(min(maxBytes/bs, int(m.info.Blocks())))
			switch rng.IntN(20) {
			case 0:
				n = 0
			case 1:
				n = maxBytes / bs // the maximum
			case 2:
				n = maxBytes/bs + 1 // one too many
			}
			length := n * bs
			if rng.IntN(20) == 0 {
				length += 1 + rng.IntN(bs-1) // misaligned
			}
			lba := pickLBA(m, uint64(n))
			switch op := rng.IntN(10); {
			case op < 4: // write
				data := make([]byte, length)
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				var flags WriteFlags
				if rng.IntN(4) == 0 {
					flags = FUA
				}
				want := expect(id, h, true, lba, length, 0)
				check(k, fmt.Sprintf("write %d@%d+%d bytes", id, lba, length), h.Write(lba, data, flags), want)
				if want == nil {
					for i := 0; i < length/bs; i++ {
						m.blocks[lba+uint64(i)] = data[i*bs : (i+1)*bs]
					}
				}
			case op < 7: // read
				buf := bytes.Repeat([]byte{0xEE}, length)
				want := expect(id, h, false, lba, length, 0)
				check(k, fmt.Sprintf("read %d@%d+%d bytes", id, lba, length), h.Read(lba, buf), want)
				if want == nil {
					for i := 0; i < length/bs; i++ {
						exp := m.blocks[lba+uint64(i)]
						if exp == nil {
							exp = make([]byte, bs)
						}
						if !bytes.Equal(buf[i*bs:(i+1)*bs], exp) {
							t.Fatalf("op %d: read %d block %d differs from the model", k, id, lba+uint64(i))
						}
					}
				}
			case op < 8: // view
				want := expect(id, h, false, lba, n*bs, 0)
				next := lba
				err := h.View(lba, uint64(n), func(l uint64, b []byte) {
					if l != next {
						t.Fatalf("op %d: view visited %d, want %d", k, l, next)
					}
					next++
					if !bytes.Equal(b, m.blocks[l]) {
						t.Fatalf("op %d: view %d block %d differs from the model", k, id, l)
					}
				})
				check(k, "view", err, want)
			default: // write zeroes, deallocate
				cnt := uint64(rng.IntN(int(m.info.Blocks()) + 2))
				lba = pickLBA(m, cnt)
				want := expect(id, h, true, lba, -1, cnt)
				var err error
				if op == 8 {
					err = h.WriteZeroes(lba, cnt, WriteFlags(rng.IntN(2)))
				} else {
					err = h.Deallocate(lba, cnt)
				}
				check(k, fmt.Sprintf("remove %d@%d+%d", id, lba, cnt), err, want)
				if want == nil {
					for i := range cnt {
						delete(m.blocks, lba+i)
					}
				}
			}
			if rng.IntN(50) == 0 {
				st, err := h.Stats()
				if err != nil {
					t.Fatalf("op %d: stats: %v", k, err)
				}
				if want := uint64(len(m.blocks)) * uint64(bs); st.AllocatedBytes != want {
					t.Fatalf("op %d: volume %d AllocatedBytes %d, model %d", k, id, st.AllocatedBytes, want)
				}
			}
		}
	}
	// Finally, every volume equals the model, block by block.
	for id, m := range model {
		h, err := s.Volume(id)
		if err != nil {
			t.Fatal(err)
		}
		bs := int(m.info.BlockSize)
		buf := make([]byte, bs)
		for lba := range m.info.Blocks() {
			if err := h.Read(lba, buf); err != nil {
				t.Fatal(err)
			}
			exp := m.blocks[lba]
			if exp == nil {
				exp = make([]byte, bs)
			}
			if !bytes.Equal(buf, exp) {
				t.Fatalf("end: volume %d block %d differs from the model", id, lba)
			}
		}
	}
}

package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestModel runs seeded random operations on several volumes against a
// model that says what every block must read: writes (some FUA, some
// across clusters, some on unaligned buffers), overwrites, write-zeroes
// and deallocates (partial and whole clusters, long runs), reads, flushes,
// resizes (grow, refused and forced shrink), deletes and re-creates, and
// clean reopens, on an area small enough to fill (ErrNoSpace, after which
// the written range holds old or new blocks only). Check runs every few
// dozen operations; at the end every volume is read whole, then deleted,
// and every cluster must be free or ready again.
func TestModel(t *testing.T) {
	seed := testSeed(t)
	for it := range iterations(t, 20, 4, 4) {
		s := seed + uint64(it)
		if err := modelOnce(s, 1500); err != nil {
			t.Fatalf("iteration %d: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, err, s)
		}
	}
}

type mvol struct {
	id   ID
	bs   uint32
	tags []uint64
}

func modelOnce(seed uint64, nops int) error {
	rng := rand.New(rand.NewPCG(seed, 0x40de1))
	fs := vfs.NewMem()
	area := NewMemArea(int64(48+rng.IntN(64))*(16<<10), 512, 512)
	cfg := memConfig(fs, area)
	cfg.AreaMaxBytes = area.Size() + int64(rng.IntN(32))*(16<<10) // grows a little, then ErrNoSpace
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	vols := map[ID]*mvol{}
	create := func(id ID) error {
		bs := []uint32{BlockSize512, BlockSize4K}[rng.IntN(2)]
		blocks := uint64(8 + rng.IntN(300))
		if bs == BlockSize512 {
			blocks *= 4
		}
		if _, err := s.Create(id, CreateOptions{SizeBytes: blocks * uint64(bs), BlockSize: bs}); err != nil {
			return err
		}
		vols[id] = &mvol{id, bs, make([]uint64, blocks)}
		return nil
	}
	for id := ID(1); id <= 3; id++ {
		if err := create(id); err != nil {
			return err
		}
	}
	buf := alignedBuf(64<<10+512, 4096)
	verify := func(k int, m *mvol, lba, n uint64) error {
		v, err := s.Volume(m.id)
		if err != nil {
			return err
		}
		B := uint64(m.bs)
		for lba0 := lba; lba0 < lba+n; {
			c := min(lba+n-lba0, uint64(64<<10)/B)
			if err := v.Read(lba0, buf[:c*B]); err != nil {
				return fmt.Errorf("op %d: read volume %d at %d: %w", k, m.id, lba0, err)
			}
			for i := range c {
				got, err := readTag(buf[i*B:(i+1)*B], m.id, lba0+i)
				if err != nil || got != m.tags[lba0+i] {
					return fmt.Errorf("op %d: volume %d block %d: tag %d (%v), want %d", k, m.id, lba0+i, got, err, m.tags[lba0+i])
				}
			}
			lba0 += c
		}
		return nil
	}
	pick := func() *mvol {
		ids := make([]ID, 0, len(vols))
		for id := range vols {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return vols[ids[rng.IntN(len(ids))]]
	}
	for k := range nops {
		m := pick()
		v, err := s.Volume(m.id)
		if err != nil {
			return fmt.Errorf("op %d: %w", k, err)
		}
		blocks := uint64(len(m.tags))
		B := uint64(m.bs)
		tag := uint64(k + 1)
		switch r := rng.IntN(100); {
		case r < 45: // write, sometimes unaligned in memory, sometimes FUA
			maxN := min(blocks, uint64(64<<10)/B)
			n := 1 + rng.Uint64N(maxN)
			lba := rng.Uint64N(blocks - n + 1)
			b := buf[:n*B]
			if rng.IntN(8) == 0 {
				b = buf[512 : 512+n*B] // aligned to 512 only: may bounce
			}
			for i := range n {
				fillTagged(b[i*B:(i+1)*B], m.id, lba+i, tag)
			}
			var f WriteFlags
			if rng.IntN(6) == 0 {
				f = FUA
			}
			old := slices.Clone(m.tags[lba : lba+n])
			err := v.Write(lba, b, f)
			switch {
			case err == nil:
				for i := range n {
					m.tags[lba+i] = tag
				}
			case errors.Is(err, ErrNoSpace):
				// Each block holds the old or the new data: adopt what it holds.
				rb := make([]byte, n*B)
				if err := v.Read(lba, rb); err != nil {
					return fmt.Errorf("op %d: read after ErrNoSpace: %w", k, err)
				}
				for i := range n {
					got, err := readTag(rb[i*B:(i+1)*B], m.id, lba+i)
					if err != nil || (got != old[i] && got != tag) {
						return fmt.Errorf("op %d: after a failed write, block %d holds tag %d (%v), want %d or %d", k, lba+i, got, err, old[i], tag)
					}
					m.tags[lba+i] = got
				}
			default:
				return fmt.Errorf("op %d: write: %w", k, err)
			}
		case r < 55, r < 62: // write zeroes, deallocate
			n := 1 + rng.Uint64N(blocks)
			if rng.IntN(2) == 0 {
				n = 1 + rng.Uint64N(min(blocks, 40))
			}
			lba := rng.Uint64N(blocks - n + 1)
			if r < 55 {
				err = v.WriteZeroes(lba, n, WriteFlags(rng.IntN(2)))
			} else {
				err = v.Deallocate(lba, n)
			}
			if err != nil {
				return fmt.Errorf("op %d: remove: %w", k, err)
			}
			clear(m.tags[lba : lba+n])
		case r < 75: // read back
			n := 1 + rng.Uint64N(min(blocks, uint64(64<<10)/B))
			if err := verify(k, m, rng.Uint64N(blocks-n+1), n); err != nil {
				return err
			}
		case r < 80:
			if err := s.Flush(); err != nil {
				return fmt.Errorf("op %d: flush: %w", k, err)
			}
		case r < 86: // resize
			nb := uint64(4 + rng.IntN(400))
			force := rng.IntN(2) == 0
			err := s.Resize(m.id, nb*B, force)
			if nb < blocks && !force {
				if err == nil {
					// allowed only if nothing past nb was written
					for _, tg := range m.tags[nb:] {
						if tg != 0 {
							return fmt.Errorf("op %d: shrink over written blocks succeeded without force", k)
						}
					}
				} else if !errors.Is(err, ErrWouldLoseData) {
					return fmt.Errorf("op %d: resize: %w", k, err)
				} else {
					break
				}
			} else if err != nil {
				return fmt.Errorf("op %d: resize: %w", k, err)
			}
			if nb < blocks {
				m.tags = m.tags[:nb]
			} else {
				m.tags = append(m.tags, make([]uint64, nb-blocks)...)
			}
		case r < 89: // delete and re-create
			if err := s.Delete(m.id); err != nil {
				return fmt.Errorf("op %d: delete: %w", k, err)
			}
			delete(vols, m.id)
			if _, err := v.Read(0, buf[:B]), v.Read(0, buf[:B]); !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("op %d: read of a deleted volume: %v", k, err)
			}
			if err := create(m.id); err != nil {
				return fmt.Errorf("op %d: re-create: %w", k, err)
			}
		case r < 91: // clean reopen
			if err := s.Close(); err != nil {
				return fmt.Errorf("op %d: close: %w", k, err)
			}
			if s, err = Open(cfg); err != nil {
				return fmt.Errorf("op %d: reopen: %w", k, err)
			}
		default:
			if err := s.Check(); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
		}
	}
	if err := s.Check(); err != nil {
		return err
	}
	for _, m := range vols {
		if err := verify(nops, m, 0, uint64(len(m.tags))); err != nil {
			return err
		}
	}
	return drain(s)
}

// drain deletes every volume and flushes: every cluster but the header
// must then be free or ready (none leaked), and Check must pass.
func drain(s *Store) error {
	// Children before their parents (a snapshot with children refuses).
	for {
		infos, err := s.List()
		if err != nil {
			return err
		}
		if len(infos) == 0 {
			break
		}
		parents := map[ID]bool{}
		for _, in := range infos {
			parents[in.Parent] = true
		}
		for _, in := range infos {
			if parents[in.ID] {
				continue
			}
			if err := s.Delete(in.ID); err != nil {
				return err
			}
		}
	}
	if err := s.Flush(); err != nil {
		return err
	}
	if err := s.Check(); err != nil {
		return err
	}
	st := s.Stats()
	if st.Free+st.Ready != st.Clusters-1 || st.Mapped != 0 || st.Limbo != 0 {
		return fmt.Errorf("after deleting every volume: %+v: clusters leaked", st)
	}
	return nil
}

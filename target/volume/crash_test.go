package volume

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestCrashRecovery runs a random sequence of writes (some FUA),
// write-zeroes, deallocates, flushes and resizes against two volumes on
// pebble's crashable in-memory filesystem, then crashes: the filesystem
// is cloned keeping only what was synced (and, in some iterations, a
// random part of what was not), and the store is reopened on the clone.
// The stores run the background syncer with a 1 ms interval (memConfig).
//
// Every block written is tagged with its writer and a checksum. After
// recovery, each block must be whole (never torn, never another block's)
// and the volumes must equal the model after some prefix of the
// operations that includes every operation acknowledged before the last
// successful flush, every FUA write, every resize, and every operation
// before an idle period that ended when the store reported its background
// syncer had synced past it. That is the durability contract (flushed and
// FUA writes survive, and plain ones once the syncer has synced them;
// nothing is torn), plus atomicity: a multi-block write survives whole or
// not at all.
func TestCrashRecovery(t *testing.T) {
	seed := testSeed(t)
	iters := iterations(t, 300, 3, 6)
	for it := range iters {
		s := seed + uint64(it)
		if err := crashOnce(s); err != nil {
			t.Fatalf("iteration %d: %v\nreplay this iteration alone with BLK_SEED=%d BLK_ITERS=1", it, err, s)
		}
	}
}

// crashVol is the model of one volume: each block's tag (0: zeros).
type crashVol struct {
	id   ID
	bs   uint32
	tags []uint64
}

type crashState []crashVol

func (s crashState) clone() crashState {
	out := make(crashState, len(s))
	for i, v := range s {
		out[i] = crashVol{v.id, v.bs, slices.Clone(v.tags)}
	}
	return out
}

func (s crashState) equal(o crashState) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i].id != o[i].id || s[i].bs != o[i].bs || !slices.Equal(s[i].tags, o[i].tags) {
			return false
		}
	}
	return true
}

func crashOnce(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0xc4a54))
	fs := vfs.NewCrashableMem()
	cfg := memConfig(fs)
	cfg.MemTableBytes = 256 << 10 // flushes and compactions every few dozen ops
	cfg.PointDeleteMaxBlocks = []int{1, 4, 64}[rng.IntN(3)]
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()

	bs := []uint32{BlockSize512, BlockSize4K}
	if rng.IntN(2) == 0 {
		bs[0], bs[1] = bs[1], bs[0]
	}
	cur := crashState{}
	vols := []*Volume{}
	for i, b := range bs {
		id := ID(i + 1)
		blocks := 16 + rng.IntN(48)
		v, err := s.Create(id, CreateOptions{SizeBytes: uint64(blocks) * uint64(b), BlockSize: b})
		if err != nil {
			return err
		}
		vols = append(vols, v)
		cur = append(cur, crashVol{id, b, make([]uint64, blocks)})
	}
	// states[k] is the model after the first k operations; minPrefix is
	// the least k that recovery may show.
	states := []crashState{cur.clone()}
	minPrefix := 0
	nops := 20 + rng.IntN(300)
	buf := make([]byte, 16*4096)
	for k := range nops {
		vi := rng.IntN(len(vols))
		v, m := vols[vi], &cur[vi]
		blocks := uint64(len(m.tags))
		B := uint64(m.bs)
		tag := uint64(k + 1)
		switch r := rng.IntN(100); {
		case r < 55: // write
			n := 1 + rng.Uint64N(min(16, blocks))
			lba := rng.Uint64N(blocks - n + 1)
			for i := range n {
				fillTagged(buf[i*B:(i+1)*B], m.id, lba+i, tag)
				m.tags[lba+i] = tag
			}
			var flags WriteFlags
			if rng.IntN(5) == 0 {
				flags = FUA
			}
			if err := v.Write(lba, buf[:n*B], flags); err != nil {
				return fmt.Errorf("op %d: write: %w", k, err)
			}
			if flags&FUA != 0 {
				minPrefix = k + 1
			}
		case r < 65, r < 72: // write zeroes (sometimes FUA), deallocate
			n := 1 + rng.Uint64N(blocks)
			lba := rng.Uint64N(blocks - n + 1)
			clear(m.tags[lba : lba+n])
			var err error
			if r < 65 {
				fua := rng.IntN(3) == 0
				err = v.WriteZeroes(lba, n, map[bool]WriteFlags{true: FUA}[fua])
				if fua {
					minPrefix = k + 1
				}
			} else {
				err = v.Deallocate(lba, n)
			}
			if err != nil {
				return fmt.Errorf("op %d: remove: %w", k, err)
			}
		case r < 82: // flush, of the volume or of the store
			var err error
			if rng.IntN(2) == 0 {
				err = v.Flush()
			} else {
				err = s.Flush()
			}
			if err != nil {
				return fmt.Errorf("op %d: flush: %w", k, err)
			}
			minPrefix = k + 1
		case r < 86: // resize: grow, or shrink dropping the tail
			nb := uint64(8 + rng.IntN(72))
			if err := s.Resize(m.id, nb*B, true); err != nil {
				return fmt.Errorf("op %d: resize: %w", k, err)
			}
			if nb < blocks {
				m.tags = m.tags[:nb]
			} else {
				m.tags = append(m.tags, make([]uint64, nb-blocks)...)
			}
			minPrefix = k + 1
		case r < 88: // idle until the background syncer has synced every plain write
			if err := waitSynced(s); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
			minPrefix = k + 1
		default: // read back while running
			n := 1 + rng.Uint64N(min(16, blocks))
			lba := rng.Uint64N(blocks - n + 1)
			if err := v.Read(lba, buf[:n*B]); err != nil {
				return fmt.Errorf("op %d: read: %w", k, err)
			}
			for i := range n {
				got, err := readTag(buf[i*B:(i+1)*B], m.id, lba+i)
				if err != nil || got != m.tags[lba+i] {
					return fmt.Errorf("op %d: live read of volume %d block %d: tag %d, %v; want %d",
						k, m.id, lba+i, got, err, m.tags[lba+i])
				}
			}
		}
		states = append(states, cur.clone())
	}

	unsynced := 0
	if rng.IntN(2) == 0 {
		unsynced = rng.IntN(101)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{
		UnsyncedDataPercent: unsynced,
		RNG:                 rand.New(rand.NewPCG(seed, 0x5eed)),
	})
	_ = s.Close() // the original goes on; the clone is what survived

	cfg.FS = crashed
	s2, err := Open(cfg)
	if err != nil {
		return fmt.Errorf("reopen after crash: %w", err)
	}
	defer func() { _ = s2.Close() }()
	got := crashState{}
	for _, want := range cur {
		v, err := s2.Volume(want.id)
		if err != nil {
			return fmt.Errorf("after crash: %w", err)
		}
		info, _ := v.Info()
		rv := crashVol{id: info.ID, bs: info.BlockSize, tags: make([]uint64, info.Blocks())}
		one := make([]byte, info.BlockSize)
		for lba := range info.Blocks() {
			if err := v.Read(lba, one); err != nil {
				return fmt.Errorf("after crash: read volume %d block %d: %w", info.ID, lba, err)
			}
			tag, err := readTag(one, info.ID, lba)
			if errors.Is(err, errTorn) {
				return fmt.Errorf("after crash: volume %d block %d is torn", info.ID, lba)
			}
			rv.tags[lba] = tag
		}
		got = append(got, rv)
	}
	for k := minPrefix; k < len(states); k++ {
		if states[k].equal(got) {
			return nil
		}
	}
	// Say how far off the nearest candidate is.
	best, bestDiff := -1, 1<<30
	for k := range states {
		d := 0
		for i := range got {
			if i >= len(states[k]) || len(states[k][i].tags) != len(got[i].tags) {
				d += 1000
				continue
			}
			for j := range got[i].tags {
				if states[k][i].tags[j] != got[i].tags[j] {
					d++
				}
			}
		}
		if d < bestDiff {
			best, bestDiff = k, d
		}
	}
	return fmt.Errorf("after crash (unsynced kept %d%%, %d ops): recovered state matches no prefix ≥ %d; nearest is prefix %d with %d blocks different",
		unsynced, nops, minPrefix, best, bestDiff)
}

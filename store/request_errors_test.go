package store

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestRequestErrors checks every data-path error against every operation,
// at both block sizes, and that a failed request changes nothing on its
// volume or its neighbour and is counted. (target/volume's test, ported
// when it was retired; TestErrors covers the administrative errors.)
func TestRequestErrors(t *testing.T) {
	for _, bs := range []uint32{BlockSize4K, BlockSize512} {
		s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512)))
		const blocks = 40
		v := mustCreate(t, s, 1, blocks, bs)
		other := mustCreate(t, s, 2, blocks, bs)
		B := int(bs)
		all := make([]byte, blocks*B)
		for i := range all {
			all[i] = byte(i*7+i>>12) + 9
		}
		for _, vol := range []*Volume{v, other} {
			for lba := uint64(0); lba < blocks; lba += 8 {
				if err := vol.Write(lba, all[lba*uint64(bs):(lba+8)*uint64(bs)], 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		max := s.cfg.MaxTransferBytes
		type req struct {
			name string
			lba  uint64
			len  int // bytes for read/write; blocks for zeroes/deallocate
			want error
		}
		for _, r := range []req{
			{"zero length at start", 0, 0, nil},
			{"zero length at end", blocks, 0, nil},
			{"zero length past end", blocks + 1, 0, ErrOutOfRange},
			{"at capacity", blocks, B, ErrOutOfRange},
			{"crosses the end", blocks - 1, 2 * B, ErrOutOfRange},
			{"huge LBA", math.MaxUint64, B, ErrOutOfRange},
			{"LBA that overflows with length", math.MaxUint64 - 1, 4 * B, ErrOutOfRange},
			{"misaligned short", 0, B - 1, ErrMisaligned},
			{"misaligned long", 0, B + 1, ErrMisaligned},
			{"misaligned tiny", 0, 1, ErrMisaligned},
			{"too large", 0, max + B, ErrTooLarge},
		} {
			buf := make([]byte, r.len)
			if err := v.Read(r.lba, buf); !errors.Is(err, r.want) {
				t.Errorf("bs %d %s: Read = %v, want %v", bs, r.name, err, r.want)
			}
			if err := v.Write(r.lba, buf, 0); !errors.Is(err, r.want) {
				t.Errorf("bs %d %s: Write = %v, want %v", bs, r.name, err, r.want)
			}
			if err := v.Write(r.lba, buf, FUA); !errors.Is(err, r.want) {
				t.Errorf("bs %d %s: Write FUA = %v, want %v", bs, r.name, err, r.want)
			}
		}
		for _, r := range []req{
			{"zero blocks", 3, 0, nil},
			{"zero blocks at end", blocks, 0, nil},
			{"zero blocks past end", blocks + 1, 0, ErrOutOfRange},
			{"crosses the end", blocks - 1, 2, ErrOutOfRange},
			{"huge LBA", math.MaxUint64, 1, ErrOutOfRange},
		} {
			if err := v.WriteZeroes(r.lba, uint64(r.len), 0); !errors.Is(err, r.want) {
				t.Errorf("bs %d %s: WriteZeroes = %v, want %v", bs, r.name, err, r.want)
			}
			if err := v.Deallocate(r.lba, uint64(r.len)); !errors.Is(err, r.want) {
				t.Errorf("bs %d %s: Deallocate = %v, want %v", bs, r.name, err, r.want)
			}
		}
		if err := v.WriteZeroes(1, math.MaxUint64, FUA); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("WriteZeroes with overflowing count = %v", err)
		}
		// Nothing changed, on either volume.
		for _, vol := range []*Volume{v, other} {
			got := make([]byte, len(all))
			for lba := uint64(0); lba < blocks; lba += 8 {
				if err := vol.Read(lba, got[lba*uint64(bs):(lba+8)*uint64(bs)]); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, all) {
				t.Fatalf("bs %d: a failed request changed volume %d", bs, vol.info.ID)
			}
		}
		if st := v.Stats(); st.Errors == 0 {
			t.Error("Stats.Errors did not count the failures")
		}
		if err := s.Check(); err != nil {
			t.Fatal(err)
		}
	}
}

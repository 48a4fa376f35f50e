package volume

import (
	"bytes"
	"context"
	"errors"
	"math"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

var blockSizes = []uint32{BlockSize512, BlockSize4K}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
	return b
}

func TestCreateListReopen(t *testing.T) {
	fs := vfs.NewMem()
	cfg := memConfig(fs)
	s := openStore(t, cfg)
	mustCreate(t, s, 7, 100, BlockSize512)
	mustCreate(t, s, 3, 10, BlockSize4K)
	v0, err := s.Create(math.MaxUint64, CreateOptions{SizeBytes: 4096}) // default block size
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := v0.Info(); info.BlockSize != DefaultBlockSize || info.State != StateOnline || info.Blocks() != 1 {
		t.Fatalf("default create: %+v", info)
	}
	want, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 3 || want[0].ID != 3 || want[1].ID != 7 || want[2].ID != math.MaxUint64 {
		t.Fatalf("List = %+v", want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, cfg)
	got, err := s2.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("after reopen List = %+v, want %+v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("after reopen List[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	v, err := s2.Volume(7)
	if err != nil {
		t.Fatal(err)
	}
	if v2, _ := s2.Volume(7); v2 != v {
		t.Fatal("Volume returned two handles for one ID")
	}
	if _, err := s2.Volume(8); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Volume(8) = %v, want ErrNotFound", err)
	}
}

func TestCreateErrors(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	mustCreate(t, s, 1, 8, BlockSize4K)
	for _, tc := range []struct {
		name string
		id   ID
		o    CreateOptions
		want error
	}{
		{"exists", 1, CreateOptions{SizeBytes: 4096}, ErrExists},
		{"zero size", 2, CreateOptions{SizeBytes: 0}, ErrInvalid},
		{"size not a block multiple", 2, CreateOptions{SizeBytes: 4096 + 512}, ErrInvalid},
		{"512 multiple on 4K", 2, CreateOptions{SizeBytes: 512, BlockSize: 4096}, ErrInvalid},
		{"block size 1024", 2, CreateOptions{SizeBytes: 4096, BlockSize: 1024}, ErrInvalid},
		{"block size 8192", 2, CreateOptions{SizeBytes: 8192, BlockSize: 8192}, ErrInvalid},
		{"too big", 2, CreateOptions{SizeBytes: MaxSizeBytes + 4096}, ErrInvalid},
	} {
		if _, err := s.Create(tc.id, tc.o); !errors.Is(err, tc.want) {
			t.Errorf("%s: Create = %v, want %v", tc.name, err, tc.want)
		}
	}
	// The largest size is accepted, and costs nothing.
	v := mustCreate(t, s, 2, MaxSizeBytes/4096, BlockSize4K)
	last := uint64(MaxSizeBytes/4096 - 1)
	buf := pattern(4096, 1)
	if err := v.Write(last, buf, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := v.Read(last, got); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("last block of the largest volume: %v", err)
	}
}

func TestWriteReadBoundaries(t *testing.T) {
	for _, bs := range blockSizes {
		s := openStore(t, memConfig(vfs.NewMem()))
		const blocks = 300
		v := mustCreate(t, s, 1, blocks, bs)
		max := s.Config().MaxTransferBytes
		maxBlocks := uint64(max) / uint64(bs)
		for _, tc := range []struct {
			name string
			lba  uint64
			n    uint64
		}{
			{"first block", 0, 1},
			{"last block", blocks - 1, 1},
			{"two blocks at end", blocks - 2, 2},
			{"maximum length at start", 0, maxBlocks},
			{"maximum length at end", blocks - maxBlocks, maxBlocks},
			{"middle", 37, 5},
		} {
			data := pattern(int(tc.n)*int(bs), byte(tc.lba))
			if err := v.Write(tc.lba, data, 0); err != nil {
				t.Fatalf("bs %d %s: Write: %v", bs, tc.name, err)
			}
			got := bytes.Repeat([]byte{0xAA}, len(data))
			if err := v.Read(tc.lba, got); err != nil {
				t.Fatalf("bs %d %s: Read: %v", bs, tc.name, err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("bs %d %s: read back differs", bs, tc.name)
			}
			// Block by block, through the single-block path.
			one := make([]byte, bs)
			for i := range tc.n {
				if err := v.Read(tc.lba+i, one); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(one, data[i*uint64(bs):(i+1)*uint64(bs)]) {
					t.Fatalf("bs %d %s: block %d differs", bs, tc.name, tc.lba+i)
				}
			}
		}
	}
}

func TestUnwrittenReadsZero(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	if err := v.Write(10, pattern(4096, 3), 0); err != nil {
		t.Fatal(err)
	}
	buf := bytes.Repeat([]byte{0xAA}, 16*4096)
	if err := v.Read(2, buf); err != nil { // holes around block 10
		t.Fatal(err)
	}
	for i := range 16 {
		blk := buf[i*4096 : (i+1)*4096]
		if i == 8 {
			if !bytes.Equal(blk, pattern(4096, 3)) {
				t.Fatal("written block differs")
			}
		} else if !isZero(blk) {
			t.Fatalf("unwritten block %d is not zeros", 2+i)
		}
	}
	one := bytes.Repeat([]byte{0xAA}, 4096)
	if err := v.Read(63, one); err != nil || !isZero(one) {
		t.Fatalf("unwritten last block: %v, zero %v", err, isZero(one))
	}
	st, err := v.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.AllocatedBytes != 4096 {
		t.Fatalf("AllocatedBytes = %d, want 4096: thin provisioning", st.AllocatedBytes)
	}
}

// TestRequestErrors checks every data-path error against every operation,
// and that a failed request changes nothing.
func TestRequestErrors(t *testing.T) {
	for _, bs := range blockSizes {
		s := openStore(t, memConfig(vfs.NewMem()))
		const blocks = 40
		v := mustCreate(t, s, 1, blocks, bs)
		other := mustCreate(t, s, 2, blocks, bs)
		all := pattern(blocks*int(bs), 9)
		for _, vol := range []*Volume{v, other} {
			for lba := uint64(0); lba < blocks; lba += 8 {
				if err := vol.Write(lba, all[lba*uint64(bs):(lba+8)*uint64(bs)], 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		max := s.Config().MaxTransferBytes
		B := int(bs)
		type req struct {
			name string
			lba  uint64
			len  int // bytes for read/write; blocks for zeroes/deallocate
			want error
		}
		data := []req{
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
		}
		for _, r := range data {
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
			if r.len%B == 0 && r.len <= max {
				n := uint64(r.len / B)
				if err := v.View(r.lba, n, func(uint64, []byte) {}); !errors.Is(err, r.want) {
					t.Errorf("bs %d %s: View = %v, want %v", bs, r.name, err, r.want)
				}
			}
		}
		if err := v.View(0, uint64(max/B)+1, func(uint64, []byte) {}); !errors.Is(err, ErrTooLarge) {
			t.Errorf("View too large = %v", err)
		}
		if err := v.View(0, math.MaxUint64, func(uint64, []byte) {}); !errors.Is(err, ErrTooLarge) {
			t.Errorf("View of 2^64-1 blocks = %v", err)
		}
		removes := []req{
			{"zero blocks", 3, 0, nil},
			{"zero blocks at end", blocks, 0, nil},
			{"zero blocks past end", blocks + 1, 0, ErrOutOfRange},
			{"crosses the end", blocks - 1, 2, ErrOutOfRange},
			{"huge LBA", math.MaxUint64, 1, ErrOutOfRange},
		}
		for _, r := range removes {
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
				t.Fatalf("bs %d: a failed request changed volume %d", bs, vol.ID())
			}
		}
		st, _ := v.Stats()
		if st.Errors == 0 {
			t.Error("Stats.Errors did not count the failures")
		}
	}
}

func TestWriteZeroesAndDeallocate(t *testing.T) {
	for _, pointMax := range []int{1, 8, 64} {
		cfg := memConfig(vfs.NewMem())
		cfg.PointDeleteMaxBlocks = pointMax
		s := openStore(t, cfg)
		const blocks = 128
		v := mustCreate(t, s, 5, blocks, BlockSize512)
		neighbour := mustCreate(t, s, 6, blocks, BlockSize512)
		full := pattern(blocks*512, 4)
		for _, vol := range []*Volume{v, neighbour} {
			for lba := uint64(0); lba < blocks; lba += 64 {
				if err := vol.Write(lba, full[lba*512:(lba+64)*512], 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		want := bytes.Clone(full)
		zero := func(lba, n uint64) {
			clear(want[lba*512 : (lba+n)*512])
		}
		steps := []struct {
			lba, n  uint64
			dealloc bool
			flags   WriteFlags
		}{
			{0, 1, false, 0},
			{blocks - 1, 1, true, 0},
			{10, 8, false, FUA},
			{20, 9, true, 0},
			{40, 70, false, 0},
			{0, blocks, true, 0},
		}
		for _, st := range steps {
			var err error
			if st.dealloc {
				err = v.Deallocate(st.lba, st.n)
			} else {
				err = v.WriteZeroes(st.lba, st.n, st.flags)
			}
			if err != nil {
				t.Fatalf("point max %d: remove %d+%d: %v", pointMax, st.lba, st.n, err)
			}
			zero(st.lba, st.n)
			got := bytes.Repeat([]byte{0xAA}, len(want))
			for lba := uint64(0); lba < blocks; lba += 64 {
				if err := v.Read(lba, got[lba*512:(lba+64)*512]); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("point max %d: after remove %d+%d the volume differs from the model", pointMax, st.lba, st.n)
			}
		}
		got := make([]byte, len(full))
		for lba := uint64(0); lba < blocks; lba += 64 {
			if err := neighbour.Read(lba, got[lba*512:(lba+64)*512]); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got, full) {
			t.Fatalf("point max %d: removing from volume 5 changed volume 6", pointMax)
		}
		st, _ := v.Stats()
		if st.AllocatedBytes != 0 || st.WriteZeroes != 3 || st.Deallocates != 3 {
			t.Fatalf("point max %d: stats %+v", pointMax, st)
		}
	}
}

// TestAdjacentVolumes: IDs next to each other, including 0 and the
// largest, never see each other's blocks, and deleting one or removing
// all its blocks leaves the other whole.
func TestAdjacentVolumes(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	ids := []ID{0, 1, math.MaxUint64 - 1, math.MaxUint64}
	vols := map[ID]*Volume{}
	for _, id := range ids {
		vols[id] = mustCreate(t, s, id, 16, BlockSize4K)
		buf := pattern(16*4096, byte(id))
		if err := vols[id].Write(0, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	check := func(id ID) {
		t.Helper()
		got := make([]byte, 16*4096)
		if err := vols[id].Read(0, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, pattern(16*4096, byte(id))) {
			t.Fatalf("volume %d changed", id)
		}
	}
	if err := vols[1].Deallocate(0, 16); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(math.MaxUint64 - 1); err != nil {
		t.Fatal(err)
	}
	check(0)
	check(math.MaxUint64)
	if err := s.Delete(math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	check(0)
}

func TestDeleteVolume(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	v := mustCreate(t, s, 9, 2048, BlockSize4K)
	keep := mustCreate(t, s, 10, 16, BlockSize4K)
	data := pattern(16*4096, 1)
	for lba := uint64(0); lba < 2048; lba += 16 {
		if err := v.Write(lba, data, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := keep.Write(0, data, 0); err != nil {
		t.Fatal(err)
	}
	// Settle the volume's data into sstables, so that reclaiming it is a
	// matter for compactions.
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	before, _ := v.Stats()
	if before.AllocatedBytes != 2048*4096 || before.DiskBytes == 0 {
		t.Fatalf("before delete: %+v", before)
	}
	if err := s.Delete(9); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if err := v.Read(0, buf); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read on a deleted volume = %v", err)
	}
	if err := v.Write(0, buf, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Write on a deleted volume = %v", err)
	}
	if _, err := v.Stats(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stats on a deleted volume = %v", err)
	}
	if err := s.Delete(9); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Delete = %v", err)
	}
	if err := s.Resize(9, 4096, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Resize deleted = %v", err)
	}
	// Space is reclaimed: compact the range and pebble holds nothing
	// for it.
	var lo, hi [dataKeyLen]byte
	putDataKey(lo[:], 9, 0)
	putDataEnd(hi[:], 9)
	if err := s.db.Compact(context.Background(), lo[:], hi[:], false); err != nil {
		t.Fatal(err)
	}
	used, err := s.db.EstimateDiskUsage(lo[:], hi[:])
	if err != nil {
		t.Fatal(err)
	}
	if used > before.DiskBytes/100 {
		t.Fatalf("after delete and compaction the volume's range uses %d bytes (was %d)", used, before.DiskBytes)
	}
	// The ID is reusable and the new volume reads zeros.
	v2 := mustCreate(t, s, 9, 2048, BlockSize4K)
	if err := v2.Read(100, buf); err != nil || !isZero(buf) {
		t.Fatalf("recreated volume: %v, zeros %v", err, isZero(buf))
	}
	got := make([]byte, len(data))
	if err := keep.Read(0, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("neighbour after delete: %v", err)
	}
}

func TestResize(t *testing.T) {
	fs := vfs.NewMem()
	cfg := memConfig(fs)
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 16, BlockSize4K)
	buf := pattern(4096, 5)
	if err := v.Write(15, buf, 0); err != nil {
		t.Fatal(err)
	}
	// Grow: new blocks read as zeros and accept writes.
	if err := s.Resize(1, 32*4096, false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := v.Read(31, got); err != nil || !isZero(got) {
		t.Fatalf("grown block: %v", err)
	}
	if err := v.Write(31, buf, 0); err != nil {
		t.Fatal(err)
	}
	// Shrink with data past the new end: refused, nothing changes.
	if err := s.Resize(1, 16*4096, false); !errors.Is(err, ErrWouldLoseData) {
		t.Fatalf("shrink over data = %v, want ErrWouldLoseData", err)
	}
	if info, _ := v.Info(); info.Blocks() != 32 {
		t.Fatalf("refused shrink changed the size: %+v", info)
	}
	// Shrink past only unwritten blocks: fine.
	if err := s.Resize(1, 31*4096+4096, false); err != nil { // no-op size
		t.Fatal(err)
	}
	if err := v.Deallocate(31, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Resize(1, 20*4096, false); err != nil {
		t.Fatalf("shrink over holes: %v", err)
	}
	if err := v.Read(20, got); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read past the new end = %v", err)
	}
	// Forced shrink drops the tail; growing again does not bring it back.
	if err := s.Resize(1, 8*4096, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Resize(1, 16*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Read(15, got); err != nil || !isZero(got) {
		t.Fatalf("block 15 after forced shrink and grow: %v, zero %v", err, isZero(got))
	}
	// Bad sizes.
	for _, size := range []uint64{0, 4096 + 512, MaxSizeBytes + 4096} {
		if err := s.Resize(1, size, true); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Resize(%d) = %v, want ErrInvalid", size, err)
		}
	}
	// The size persists.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, cfg)
	v, _ = s2.Volume(1)
	if info, _ := v.Info(); info.SizeBytes != 16*4096 {
		t.Fatalf("size after reopen: %+v", info)
	}
}

func TestReadOnlyVolume(t *testing.T) {
	cfg := memConfig(vfs.NewMem())
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 8, BlockSize4K)
	data := pattern(4096, 1)
	if err := v.Write(0, data, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.SetState(1, StateReadOnly); err != nil {
		t.Fatal(err)
	}
	if err := s.SetState(1, State(9)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("SetState(9) = %v", err)
	}
	if err := s.SetState(2, StateReadOnly); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SetState on a missing volume = %v", err)
	}
	for name, err := range map[string]error{
		"write":        v.Write(0, data, 0),
		"write FUA":    v.Write(0, data, FUA),
		"write zeroes": v.WriteZeroes(0, 1, 0),
		"deallocate":   v.Deallocate(0, 8),
	} {
		if !errors.Is(err, ErrReadOnly) {
			t.Errorf("%s on a read-only volume = %v", name, err)
		}
	}
	got := make([]byte, 4096)
	if err := v.Read(0, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read on read-only volume: %v", err)
	}
	if err := v.Flush(); err != nil {
		t.Fatalf("flush on read-only volume: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, cfg)
	v, _ = s.Volume(1)
	if info, _ := v.Info(); info.State != StateReadOnly {
		t.Fatalf("state after reopen: %v", info.State)
	}
	if err := s.SetState(1, StateOnline); err != nil {
		t.Fatal(err)
	}
	if err := v.Write(0, data, 0); err != nil {
		t.Fatalf("write after back online: %v", err)
	}
}

func TestReadOnlyStore(t *testing.T) {
	fs := vfs.NewMem()
	cfg := memConfig(fs)
	s := openStore(t, cfg)
	mustCreate(t, s, 1, 8, BlockSize4K)
	data := pattern(4096, 2)
	v, _ := s.Volume(1)
	if err := v.Write(3, data, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.ReadOnly = true
	ro := openStore(t, cfg)
	v, err := ro.Volume(1)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := v.Read(3, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read from a read-only store: %v", err)
	}
	if err := v.Write(3, data, 0); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write to a read-only store = %v", err)
	}
	if _, err := ro.Create(2, CreateOptions{SizeBytes: 4096}); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("create in a read-only store = %v", err)
	}
	if err := ro.Delete(1); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("delete in a read-only store = %v", err)
	}
	if err := v.Flush(); err != nil {
		t.Fatalf("flush in a read-only store = %v", err)
	}
}

func TestClosedStore(t *testing.T) {
	s, err := Open(memConfig(vfs.NewMem()))
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 8, BlockSize4K)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	buf := make([]byte, 4096)
	for name, err := range map[string]error{
		"read":         v.Read(0, buf),
		"write":        v.Write(0, buf, FUA),
		"write zeroes": v.WriteZeroes(0, 8, 0),
		"deallocate":   v.Deallocate(0, 8),
		"flush":        v.Flush(),
		"view":         v.View(0, 1, func(uint64, []byte) {}),
		"store flush":  s.Flush(),
		"delete":       s.Delete(1),
		"resize":       s.Resize(1, 4096, true),
		"set state":    s.SetState(1, StateOnline),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
	if _, err := s.Create(2, CreateOptions{SizeBytes: 4096}); !errors.Is(err, ErrClosed) {
		t.Errorf("Create after Close = %v", err)
	}
	if _, err := s.Volume(1); !errors.Is(err, ErrClosed) {
		t.Errorf("Volume after Close = %v", err)
	}
	if _, err := s.List(); !errors.Is(err, ErrClosed) {
		t.Errorf("List after Close = %v", err)
	}
	if _, err := v.Stats(); !errors.Is(err, ErrClosed) {
		t.Errorf("Stats after Close = %v", err)
	}
	if _, err := v.Info(); !errors.Is(err, ErrClosed) {
		t.Errorf("Info after Close = %v", err)
	}
}

func TestView(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	v := mustCreate(t, s, 1, 32, BlockSize512)
	data := pattern(4*512, 8)
	if err := v.Write(5, data, 0); err != nil {
		t.Fatal(err)
	}
	var seen []uint64
	err := v.View(3, 8, func(lba uint64, b []byte) {
		seen = append(seen, lba)
		switch {
		case lba >= 5 && lba < 9:
			if !bytes.Equal(b, data[(lba-5)*512:(lba-4)*512]) {
				t.Errorf("View block %d differs", lba)
			}
		case b != nil:
			t.Errorf("View hole %d: got %d bytes, want nil", lba, len(b))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 8 || seen[0] != 3 || seen[7] != 10 {
		t.Fatalf("View visited %v", seen)
	}
	before, _ := v.Stats()
	if err := v.View(0, 32, func(uint64, []byte) {}); err != nil {
		t.Fatal(err)
	}
	after, _ := v.Stats()
	if after.CopiedBytes != before.CopiedBytes {
		t.Fatalf("View copied %d bytes", after.CopiedBytes-before.CopiedBytes)
	}
}

func TestStats(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	buf := make([]byte, 8*4096)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(v.Write(0, buf, 0))
	must(v.Write(8, buf[:4096], FUA))
	must(v.Read(0, buf))
	must(v.Read(60, buf[:4096]))
	must(v.WriteZeroes(0, 2, 0))
	if err := v.Deallocate(100, 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Deallocate past the end = %v", err)
	}
	must(v.Flush())
	st, err := v.Stats()
	must(err)
	want := Stats{
		Reads: 2, Writes: 2, FUAWrites: 1, WriteZeroes: 1, Flushes: 1, Errors: 1,
		ReadBytes: 9 * 4096, WriteBytes: 9 * 4096, RemovedBlocks: 2,
		CopiedBytes:    9*4096 + 8*4096, // 9 written; 8 of the 9 read were allocated
		AllocatedBytes: 7 * 4096,
	}
	st.DiskBytes = 0
	if st != want {
		t.Fatalf("Stats =\n%+v, want\n%+v", st, want)
	}
}

func TestNotAVolumeStore(t *testing.T) {
	fs := vfs.NewMem()
	db, err := pebble.Open("/store", &pebble.Options{FS: fs, Logger: quietLogger2{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("someone else's key"), []byte("v"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(memConfig(fs)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open of a foreign pebble store = %v, want ErrCorrupt", err)
	}
}

type quietLogger2 struct{ quietLogger }

func (quietLogger2) Fatalf(format string, args ...any) { panic("fatal: " + format) }

func TestSentinels(t *testing.T) {
	all := []error{ErrOutOfRange, ErrMisaligned, ErrTooLarge, ErrNotFound, ErrExists,
		ErrReadOnly, ErrClosed, ErrIO, ErrInvalid, ErrWouldLoseData, ErrCorrupt}
	for i, a := range all {
		for j, b := range all {
			if (i == j) != errors.Is(a, b) {
				t.Fatalf("errors.Is(%v, %v) = %v", a, b, errors.Is(a, b))
			}
		}
	}
}

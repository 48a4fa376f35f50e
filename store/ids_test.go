package store

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestAdjacentVolumes: volumes whose IDs are next to each other, including
// 0 and the largest, never see each other's blocks: deallocating all of
// one, deleting one, and reopening the store (the maps reloaded from their
// key ranges) leave the others whole. (target/volume's test of the same,
// ported when it was retired: a key range ending at ID+1 overflows at the
// largest ID.)
func TestAdjacentVolumes(t *testing.T) {
	area := NewMemArea(64*(16<<10), 512, 512)
	cfg := memConfig(vfs.NewMem(), area)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := []ID{0, 1, math.MaxUint64 - 1, math.MaxUint64}
	data := func(id ID) []byte { return bytes.Repeat([]byte{byte(id) ^ 0x5A, byte(id >> 63)}, 16*4096/2) }
	vols := map[ID]*Volume{}
	for _, id := range ids {
		vols[id] = mustCreate(t, s, id, 16, BlockSize4K)
		if err := vols[id].Write(0, data(id), 0); err != nil {
			t.Fatal(err)
		}
	}
	got := alignedBuf(16*4096, 4096)
	check := func(s *Store, id ID, want []byte) {
		t.Helper()
		v, err := s.Volume(id)
		if err != nil {
			t.Fatalf("volume %d: %v", id, err)
		}
		if err := v.Read(0, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("volume %d changed", id)
		}
	}
	if err := vols[1].Deallocate(0, 16); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(math.MaxUint64 - 1); err != nil {
		t.Fatal(err)
	}
	check(s, 0, data(0))
	check(s, 1, make([]byte, 16*4096))
	check(s, math.MaxUint64, data(math.MaxUint64))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, cfg)
	check(s, 0, data(0))
	check(s, 1, make([]byte, 16*4096))
	check(s, math.MaxUint64, data(math.MaxUint64))
	if _, err := s.Volume(math.MaxUint64 - 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted volume after reopen: %v", err)
	}
	if err := s.Delete(math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	check(s, 0, data(0))
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

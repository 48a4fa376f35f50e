// Package storetest holds checks that tests of the store's users (the
// NVMe/TCP and NVMe/RDMA bindings serving it) run on a store they wrote
// through the target: written once here. It is for tests only.
package storetest

import (
	"testing"

	"github.com/blk-project/blk/store"
)

// Reopened opens the store cfg names (its writer has closed it), reads
// volume id whole and fails t unless the volume holds exactly want,
// naming the first byte (and block) that differs; then the store must
// pass Check.
func Reopened(t testing.TB, cfg store.Config, id store.ID, want []byte) {
	t.Helper()
	s, err := store.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, err := s.Volume(id)
	if err != nil {
		t.Fatal(err)
	}
	info, err := v.Info()
	if err != nil {
		t.Fatal(err)
	}
	bs := int(info.BlockSize)
	got := make([]byte, len(want))
	for off := 0; off < len(got); off += 128 << 10 {
		if err := v.Read(uint64(off/bs), got[off:min(off+128<<10, len(got))]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("after reopen: byte %d (block %d) is %#x, want %#x", i, i/bs, got[i], want[i])
		}
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

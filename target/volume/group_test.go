package volume

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestWriteGroup(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	v := mustCreate(t, s, 1, 256, BlockSize4K)
	g := v.NewWriteGroup()
	a, b := pattern(4096, 1), pattern(3*4096, 2)
	if err := g.Add(10, a); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(20, b); err != nil {
		t.Fatal(err)
	}
	// Pending writes are not visible.
	got := make([]byte, 4096)
	if err := v.Read(10, got); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatalf("pending write visible before commit (err %v)", err)
	}
	// A bad write is refused at Add and leaves the group as it was.
	if err := g.Add(255, b); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("write past the end: %v", err)
	}
	if err := g.Commit(); err != nil {
		t.Fatal(err)
	}
	if g.Len() != 0 {
		t.Fatalf("group not emptied: %d", g.Len())
	}
	check := func(lba uint64, want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		if err := v.Read(lba, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("LBA %d: err %v, equal %v", lba, err, bytes.Equal(got, want))
		}
	}
	check(10, a)
	check(20, b)
	if st, _ := v.Stats(); st.Writes != 2 {
		t.Errorf("writes counted %d, want 2", st.Writes)
	}
	// Reused after commit.
	c := pattern(4096, 3)
	if err := g.Add(10, c); err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(); err != nil {
		t.Fatal(err)
	}
	check(10, c)
}

// A volume changed between Add and Commit: the writes are judged again.
func TestWriteGroupVolumeChanged(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	v := mustCreate(t, s, 1, 256, BlockSize4K)
	g := v.NewWriteGroup()
	// Grown: still valid, committed.
	if err := g.Add(100, pattern(4096, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Resize(1, 512*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(400, pattern(4096, 2)); !errors.Is(err, ErrGroupFull) {
		t.Fatalf("add after a change with writes pending: %v, want ErrGroupFull", err)
	}
	if err := g.Commit(); err != nil {
		t.Fatalf("commit after growing: %v", err)
	}
	// Shrunk below a pending write: nothing applied.
	if err := g.Add(300, pattern(4096, 3)); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(5, pattern(4096, 4)); err != nil {
		t.Fatal(err)
	}
	if err := s.Resize(1, 256*4096, true); err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("commit after shrinking below a pending write: %v", err)
	}
	got := make([]byte, 4096)
	if err := v.Read(5, got); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatalf("a write of a failed group was applied (err %v)", err)
	}
	// Deleted: nothing applied, the error says so.
	if err := g.Add(7, pattern(4096, 5)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(1); err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("commit after delete: %v", err)
	}
}

func TestWriteGroupFull(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	v := mustCreate(t, s, 1, 4096, BlockSize4K)
	g := v.NewWriteGroup()
	blk := pattern(s.Config().MaxTransferBytes, 1)
	n := 0
	for ; ; n++ {
		err := g.Add(uint64(n*len(blk)/4096%4000), blk)
		if errors.Is(err, ErrGroupFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n*len(blk) != MaxGroupBytes {
		t.Fatalf("group took %d bytes before full, want %d", n*len(blk), MaxGroupBytes)
	}
	if err := g.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(0, blk); err != nil {
		t.Fatalf("add after commit: %v", err)
	}
}

package target_test

import (
	"bytes"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/volume"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Plain writes executed with a Group are completed by its Commit, all
// visible afterwards; a bad write completes at once. (FUA writes never
// reach the group: they go to the sync workers, see io_cmd.go.)
func TestGroupedWrites(t *testing.T) {
	store, err := volume.Open(volumeConfig(vfs.NewMem()))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	vol, err := store.Create(1, volume.CreateOptions{SizeBytes: 256 * 4096})
	if err != nil {
		t.Fatal(err)
	}
	b := newIOBench(t, target.VolumeBackend(vol))
	g := b.tgt.NewGroup(16)
	defer g.Commit() // never leave requests pending: Close waits for them
	base := b.ir.n
	reqs := make([]*target.Request, 8)
	for i := range reqs {
		data := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		reqs[i] = &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, uint64(10+i), 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: data, Group: g}
		b.io.Execute(reqs[i])
	}
	if b.ir.n != base || g.Pending() != 8 {
		t.Fatalf("before Commit: %d completed, %d pending; want 0 and 8", b.ir.n-base, g.Pending())
	}
	got := make([]byte, 4096)
	if err := vol.Read(10, got); err != nil || got[0] != 0 {
		t.Fatalf("a pending write is visible (err %v)", err)
	}
	// Out of range: refused at once, not held.
	bad := &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 300, 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: make([]byte, 4096), Group: g}
	b.io.Execute(bad)
	if b.ir.n != base+1 || b.ir.last.Code() != nvme.StatusLBAOutOfRange {
		t.Fatalf("out-of-range write: %d completed, status %v", b.ir.n-base, b.ir.last)
	}
	g.Commit()
	if g.Pending() != 0 {
		t.Fatalf("%d still pending after Commit", g.Pending())
	}
	for i := range reqs {
		if reqs[i].Rsp.Status != nvme.StatusSuccess {
			t.Fatalf("grouped write %d: %v", i, reqs[i].Rsp.Status)
		}
		if err := vol.Read(uint64(10+i), got); err != nil || got[0] != byte(i+1) || got[4095] != byte(i+1) {
			t.Fatalf("block %d after Commit: err %v, byte %d", 10+i, err, got[0])
		}
	}
	if st := g.Stats(); st.Writes != 8 || st.Commits != 1 {
		t.Errorf("group stats %+v, want 8 writes in 1 commit", st)
	}
}

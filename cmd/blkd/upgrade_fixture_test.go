package main

import (
	"os"
	"testing"

	"github.com/blk-project/blk/target/volume"
)

// TestWriteUpgradeFixture writes testdata/volumes-v1 with target/volume,
// the store of the release before issue 22: the volumes of
// TestUpgradeFromVolumeStore (upgradeVolumes), holding upgradeWrites.
// It ran once; the fixture is the old release's output, committed.
func TestWriteUpgradeFixture(t *testing.T) {
	if os.Getenv("BLK_WRITE_FIXTURE") == "" {
		t.Skip("writes testdata/volumes-v1 with target/volume: BLK_WRITE_FIXTURE=1")
	}
	_ = os.RemoveAll(upgradeFixture)
	old, err := volume.Open(volume.Config{Dir: upgradeFixture})
	if err != nil {
		t.Fatal(err)
	}
	for _, uv := range upgradeVolumes {
		vol, err := old.Create(volume.ID(uv.id), volume.CreateOptions{SizeBytes: uv.size, BlockSize: uv.bs})
		if err != nil {
			t.Fatal(err)
		}
		bs := uint64(uv.bs)
		for k, w := range upgradeWrites(uv.size / bs) {
			b := make([]byte, w.n*bs)
			for i := range w.n {
				fixtureBlock(b[i*bs:(i+1)*bs], uv.id, w.lba+i, uint64(k+1))
			}
			if err := vol.Write(w.lba, b, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
}

package store_test

import (
	"os"
	"testing"

	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target/volume"
)

// TestWriteUpgradeFixture writes testdata/volume-v1 with target/volume,
// the layout the store upgrades (upgrade_test.go). An external test
// package: target/volume may come to import store, and an internal test
// importing it would then be a cycle.
func TestWriteUpgradeFixture(t *testing.T) {
	if os.Getenv("BLK_WRITE_FIXTURE") == "" {
		t.Skip("writes testdata/volume-v1 with target/volume: BLK_WRITE_FIXTURE=1")
	}
	_ = os.RemoveAll(store.FixtureDir)
	vs, err := volume.Open(volume.Config{Dir: store.FixtureDir, Logger: quiet{}, MemTableBytes: 4 << 20, MaxTransferBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for k, o := range store.FixtureOps {
		var err error
		switch o.Kind {
		case "create":
			_, err = vs.Create(volume.ID(o.ID), volume.CreateOptions{SizeBytes: o.A * o.B, BlockSize: uint32(o.B)})
		case "write", "zero":
			var v *volume.Volume
			if v, err = vs.Volume(volume.ID(o.ID)); err != nil {
				break
			}
			info, _ := v.Info()
			bs := uint64(info.BlockSize)
			if o.Kind == "zero" {
				err = v.WriteZeroes(o.A, o.B, 0)
				break
			}
			buf := make([]byte, o.B*bs)
			for i := range o.B {
				store.FillTagged(buf[i*bs:(i+1)*bs], o.ID, o.A+i, uint64(k+1))
			}
			err = v.Write(o.A, buf, 0)
		case "delete":
			err = vs.Delete(volume.ID(o.ID))
		case "resize":
			var v *volume.Volume
			if v, err = vs.Volume(volume.ID(o.ID)); err == nil {
				info, _ := v.Info()
				err = vs.Resize(volume.ID(o.ID), o.A*uint64(info.BlockSize), o.Force)
			}
		case "readonly":
			err = vs.SetState(volume.ID(o.ID), volume.StateReadOnly)
		}
		if err != nil {
			t.Fatalf("op %d %+v: %v", k, o, err)
		}
	}
	if err := vs.Close(); err != nil {
		t.Fatal(err)
	}
}

type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}

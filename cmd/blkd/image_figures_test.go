package main

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestImportFigures is not a check but the figures of docs/snapshots.md
// §8 step 7 for an import into a replicated volume: a 256 MiB image
// (every block data) imported by blkctl into new volumes of 1 and of 3
// replicas on a 3-node cluster on this machine, three times each, the
// wall time of blkctl (creation, import, snapshot) logged. Run with
// BLK_IMPORT_FIGURES=1 go test -v -run TestImportFigures ./cmd/blkd/
func TestImportFigures(t *testing.T) {
	if os.Getenv("BLK_IMPORT_FIGURES") == "" {
		t.Skip("figures only: BLK_IMPORT_FIGURES=1")
	}
	const mib = 1 << 20
	const size = 256 * mib
	c, _, leader := startZoned(t, 3)
	lp := c.procs[leader]
	lp.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "256MiB", "replicas": 1}`, 201, nil)
	vctrl, vns := attachNS(t, lp, "v")
	rng := rand.New(rand.NewPCG(1, 2))
	p := make([]byte, mib)
	for off := 0; off < size; off += mib {
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		for o := 0; o < mib; o += 128 << 10 {
			mustWrite(t, vns, int64(off+o), p[o:o+128<<10])
		}
	}
	vctrl.Close()
	lp.must(t, "POST", "/v1/volumes/v/snapshots", `{"name": "s1"}`, 201, nil)
	img := filepath.Join(t.TempDir(), "s1.img")
	mustBlkctl(t, lp, "volume", "export", "v@s1", img)
	for i, r := range []string{"1", "3", "1", "3", "1", "3"} {
		name := "w" + string(rune('a'+i))
		start := time.Now()
		mustBlkctl(t, lp, "volume", "import", img, name, "--replicas", r)
		t.Logf("import 256 MiB into %s, %s replicas: %v", name, r, time.Since(start))
		lp.must(t, "DELETE", "/v1/volumes/"+name+"?snapshots=true", "", 204, nil)
	}
}

package initiator

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"testing"
	"time"
)

// seed returns a seed for a randomized test and logs it; -seed is not a
// flag: set BLK_TEST_SEED to replay.
func testSeed(t testing.TB) int64 {
	s := time.Now().UnixNano()
	if v := os.Getenv("BLK_TEST_SEED"); v != "" {
		fmt.Sscan(v, &s)
	}
	t.Logf("seed %d (replay with BLK_TEST_SEED=%d)", s, s)
	return s
}

var digestCases = []struct {
	name         string
	header, data bool
}{{"none", false, false}, {"header", true, false}, {"data", false, true}, {"both", true, true}}

// Connect over TCP follows the Linux host's order, and writes read back
// equal — in the capsule and with R2T, one R2T or several, one C2HData
// or several, with CapsuleResp or SUCCESS — with every digest setting.
func TestTCPConnectAndIO(t *testing.T) {
	seed := testSeed(t)
	for _, dc := range digestCases {
		for _, split := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/split=%v", dc.name, split), func(t *testing.T) {
				rng := rand.New(rand.NewSource(seed))
				f := newTCPFake(t, testNQN)
				if split {
					f.maxH2C, f.r2tChunk, f.c2hChunk, f.success = 4096, 8192, 3072, true
				}
				f.start()
				cfg := tcpTestConfig(t)
				cfg.HeaderDigest, cfg.DataDigest = dc.header, dc.data
				c := connectTCPFake(t, f, cfg)
				info := c.Info()
				if info.Transport != TransportTCP || info.IOQueues != 2 || info.InCapsule != 8192 || info.MaxTransfer != 64<<10 {
					t.Errorf("info %+v", info)
				}
				f.mu.Lock()
				for _, r := range f.icReqs {
					if r.PFV != 0 || r.HPDA != 0 || r.MaxR2T != 0 || r.DGST != cfg.tcpDigests().DGST() {
						t.Errorf("ICReq %+v", r)
					}
				}
				if len(f.icReqs) != 3 {
					t.Errorf("%d connections, want 3", len(f.icReqs))
				}
				f.mu.Unlock()
				ns := c.Namespace(1)
				if ns == nil {
					t.Fatal("no namespace")
				}
				want := make([]byte, ns.Size())
				for i := 0; i < 40; i++ {
					blocks := 1 + rng.Intn(128)
					lba := rng.Intn(int(ns.Blocks()) - blocks)
					b := want[lba*512 : (lba+blocks)*512]
					rng.Read(b)
					if _, err := ns.WriteAt(b, int64(lba*512)); err != nil {
						t.Fatalf("write %d blocks at %d: %v", blocks, lba, err)
					}
				}
				got := make([]byte, len(want))
				if _, err := ns.ReadAt(got, 0); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) || !bytes.Equal(f.disk(1), want) {
					t.Fatal("read back differs")
				}
				if f.tcpInCapsule.Load() == 0 || f.r2tWrites.Load() == 0 {
					t.Errorf("in-capsule writes %d, R2T writes %d: want both", f.tcpInCapsule.Load(), f.r2tWrites.Load())
				}
				if err := ns.Flush(); err != nil {
					t.Fatal(err)
				}
				if err := ns.WriteZeroes(10, 5); err != nil {
					t.Fatal(err)
				}
				if err := ns.Deallocate(Range{LBA: 100, Blocks: 3}, Range{LBA: 300, Blocks: 1}); err != nil {
					t.Fatal(err)
				}
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				if f.shutdowns.Load() != 1 {
					t.Errorf("%d shutdowns", f.shutdowns.Load())
				}
			})
		}
	}
}

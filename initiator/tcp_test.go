package initiator

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
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

// Where a TCP command's data goes: in the capsule up to the queue's
// in-capsule size (8192 for fabrics commands on any queue), else SGL
// 0x5A with the length; reads 0x5A; no data 0x5A of length 0.
func TestTCPDataPlacement(t *testing.T) {
	c := &Controller{cfg: Config{Logf: t.Logf}, kick: make(chan struct{}, 1), closing: make(chan struct{})}
	a := newAssociation(c)
	q := &queue{a: a, qid: 1, depth: 4, bufSize: 16 << 10, inCapsule: 1024}
	w := newTCPWire(q, nvme.TCPDigests{})
	s := &q.slots[0]
	for _, tc := range []struct {
		fabrics bool
		dir     nvme.Direction
		n       int
		inline  int
		sgl     nvme.SGL
		r2t     bool
	}{
		{false, nvme.DirHostToCtrl, 1024, 1024, nvme.InCapsuleSGL(0, 1024), false},
		{false, nvme.DirHostToCtrl, 1536, 0, nvme.TransportSGL(1536), true},
		{false, nvme.DirCtrlToHost, 512, 0, nvme.TransportSGL(512), false},
		{false, nvme.DirNone, 0, 0, nvme.TransportSGL(0), false},
		{true, nvme.DirHostToCtrl, 1024 + 4096, 1024 + 4096, nvme.InCapsuleSGL(0, 5120), false},
		{true, nvme.DirHostToCtrl, 8192 + 512, 0, nvme.TransportSGL(8704), true},
	} {
		s.cmd = nvme.Command{Opcode: uint8(nvme.IOWrite)}
		if tc.fabrics {
			s.cmd.Opcode = nvme.OpcodeFabrics
		}
		s.dir, s.n = tc.dir, tc.n
		s.inline = w.place(s, tc.dir, tc.n)
		if s.inline != tc.inline || s.cmd.DPTR != tc.sgl || s.needsR2T() != tc.r2t {
			t.Errorf("%+v: inline %d, DPTR %+v, R2T %v", tc, s.inline, s.cmd.DPTR, s.needsR2T())
		}
	}
}

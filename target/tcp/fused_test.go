package tcp_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/targettest"
	"github.com/blk-project/blk/target/tcp"
)

// TestFusedOverWire: blk's initiator sends fused Compare and Write pairs
// over NVMe/TCP — 4 KiB with the data in the capsules, 64 KiB by R2T, a
// pair whose second needs an R2T with a write right behind it, counters
// incremented from several goroutines beside plain writes — to a
// backend completing late and out of order: the pairs are paired by
// their arrival (none Missing), write only on a match, and are atomic.
func TestFusedOverWire(t *testing.T) {
	seed := testSeed(t)
	tt, _ := newAsyncTarget(t, seed, 100*time.Microsecond, false)
	c := connectTCP(t, tt.addr, initiator.Config{Queues: 2, QueueDepth: 32})
	targettest.FusedOverWire(t, tt.t, c.Namespace(1), seed)
}

// TestFusedBufferExhaustion (docs/reservations.md §2.2, §9 question 10):
// data buffer pools of 4 per poll group (capsule, small, large), a
// reserve of 8 and of 1, and 64 pairs in flight from 8 queues, 4 KiB in
// the capsules and 64 KiB by R2T, so that halves execute out of order
// and waiting halves hold every ordinary buffer: every pair completes
// and writes.
func TestFusedBufferExhaustion(t *testing.T) {
	for _, reserve := range []uint32{8, 1} {
		t.Run(fmt.Sprintf("reserve=%d", reserve), func(t *testing.T) {
			seed := testSeed(t)
			d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: testBlock, Blocks: testBlocks,
				Seed: seed, MaxDelay: 200 * time.Microsecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Close)
			tt := serveAsyncCfg(t, d, tcp.Config{Addr: "127.0.0.1:0", Cores: 2, SmallBuffers: 4, LargeBuffers: 4,
				CapsuleBuffers: 4, FusedReserve: reserve})
			t.Cleanup(func() {
				tt.port.Close()
				tt.t.Close()
			})
			c := connectTCP(t, tt.addr, initiator.Config{Queues: 8, QueueDepth: 16})
			targettest.FusedFloods(t, tt.t, c.Namespace(1))
		})
	}
}

// TestFusedSecondRefusedByBinding: the binding refuses a fused second
// itself (an in-capsule SGL with an offset: SGL Offset Invalid) and tells
// the core (Queue.Refused): the first waiting for it completes with
// Missing Fused Command, and the blocks are untouched; a first the
// binding refuses leaves its second without a first (Missing too).
func TestFusedSecondRefusedByBinding(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{})
	_, cntlid := tt.adminUp(t, nvme.TCPDigests{})
	h := tt.ioUp(t, cntlid, 1, 31, 0, nvme.TCPDigests{})
	old := pattern(testBlock, 3)
	if res := h.mustExchange(rw(nvme.IOWrite, 1, 8, 1), old, nil, nil); res.rsp.Status != 0 {
		t.Fatalf("write: %v", res.rsp.Status)
	}
	send := func(cid uint16, op nvme.IOOpcode, fuse uint8, data []byte, off uint64) {
		cmd := rw(op, 1, 8, 1)
		cmd.CID, cmd.Flags = cid, 0x40|fuse
		cmd.DPTR = nvme.InCapsuleSGL(off, uint32(len(data)))
		if err := h.write(h.capsulePDU(cmd, data)); err != nil {
			t.Fatal(err)
		}
	}
	statuses := func(n int) map[uint16]nvme.Status {
		got := map[uint16]nvme.Status{}
		for len(got) < n {
			hdr, b, err := h.readPDU()
			if err != nil {
				t.Fatal(err)
			}
			if hdr.Type != nvme.TCPCapsuleResp {
				t.Fatalf("PDU type %#x", hdr.Type)
			}
			var rsp nvme.Completion
			_ = rsp.Unmarshal(b[nvme.TCPCommonHeaderSize:])
			got[rsp.CID] = rsp.Status.Code()
		}
		return got
	}
	send(100, nvme.IOCompare, nvme.FlagFuseFirst, old, 0)
	send(101, nvme.IOWrite, nvme.FlagFuseSecond, pattern(testBlock, 9), 16) // refused: offset
	got := statuses(2)
	if got[100] != nvme.StatusAbortFusedMissing || got[101] != nvme.StatusSGLInvalidOffset {
		t.Fatalf("first %v, second %v; want Missing Fused Command, SGL Offset Invalid", got[100], got[101])
	}
	send(102, nvme.IOCompare, nvme.FlagFuseFirst, old, 16) // refused: offset
	send(103, nvme.IOWrite, nvme.FlagFuseSecond, pattern(testBlock, 9), 0)
	got = statuses(2)
	if got[102] != nvme.StatusSGLInvalidOffset || got[103] != nvme.StatusAbortFusedMissing {
		t.Fatalf("first %v, second %v; want SGL Offset Invalid, Missing Fused Command", got[102], got[103])
	}
	buf := make([]byte, testBlock)
	if res := h.mustExchange(rw(nvme.IORead, 1, 8, 1), nil, nil, buf); res.rsp.Status != 0 || !bytes.Equal(buf, old) {
		t.Fatalf("read back: %v, data changed %v", res.rsp.Status, !bytes.Equal(buf, old))
	}
}

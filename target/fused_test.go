package target_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// submitStamped executes cmd as a binding would after stamping its
// arrival (Request.Seq, Request.PrevFuse), without waiting.
func (h *harness) submitStamped(q *tq, cmd nvme.Command, data []byte, seq uint32, prev uint8) *call {
	h.mu.Lock()
	return h.submitLocked(q, cmd, data, seq, prev)
}

// fusedCmd is an I/O command with FUSE bits fuse.
func fusedCmd(op nvme.IOOpcode, nsid uint32, slba uint64, blocks uint32, fuse uint8) nvme.Command {
	c := ioCmd(op, nsid, slba, blocks, 0)
	c.Flags |= fuse
	return c
}

// fused serves the transcript verbs
//
//	fused q=io seq=N prev=0|1|2|3 fuse=0|1|2|3 op=compare|write|read nsid=1 slba=0 blocks=1 fill=0xNN [fua] [wait]
//	fused-stats
//
// fused executes one command stamped as its binding would have stamped
// it on arrival, in whatever order the transcript gives (a binding
// executes a command when its data is in), and prints "held" when it
// waits (its completion prints later as an event) or its status.
func (tr *transcript) fused(verb string, a *args) []string {
	if verb == "fused-stats" {
		st := tr.harness().tgt.Stats()
		return []string{fmt.Sprintf("waiting=%d pairs=%d miscompares=%d missing=%d failed=%d lock-waits=%d",
			st.FusedWaiting, st.FusedPairs, st.FusedMiscompares, st.FusedMissing, st.FusedFailed, st.LockWaits)}
	}
	op := map[string]nvme.IOOpcode{"read": nvme.IORead, "write": nvme.IOWrite, "compare": nvme.IOCompare}[a.must("op")]
	blocks := uint32(a.num("blocks", 1))
	cmd := fusedCmd(op, uint32(a.num("nsid", 1)), a.num("slba", 0), blocks, uint8(a.num("fuse", 0)))
	if a.has("fua") {
		cmd.CDW12 |= nvme.RWFUA
	}
	data := bytes.Repeat([]byte{byte(a.num("fill", 0))}, int(blocks)*4096)
	h := tr.harness()
	c := h.submitStamped(tr.queue(a), cmd, data, uint32(a.num("seq", 0)), uint8(a.num("prev", 0)))
	if a.has("wait") { // completed on a sync worker
		c.wait(tr.t)
		return []string{fmtRsp(c.rsp)}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.completed == 0 {
		c.async = true
		return []string{"held"}
	}
	return []string{fmtRsp(c.rsp)}
}

// noView hides a Backend's View: the core then reads a Compare's blocks
// into a pooled buffer.
type noView struct{ target.Backend }

// TestZeroAllocFused: a fused pair (its pairing through Queue.fused, the
// range lock, the Compare through View or a pooled buffer, the Write)
// and a plain write beside it allocate nothing, halves in either order.
func TestZeroAllocFused(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, bc := range []struct {
		name string
		view bool
	}{{"view", true}, {"pooled buffer", false}} {
		t.Run(bc.name, func(t *testing.T) {
			mem, _ := target.NewMemBackend(4096, 1024)
			var backend target.Backend = mem
			if !bc.view {
				backend = noView{mem}
			}
			b := newIOBench(t, backend)
			buf := make([]byte, 4096)
			first := &target.Request{Cmd: fusedCmd(nvme.IOCompare, 1, 0, 1, nvme.FlagFuseFirst), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf}
			second := &target.Request{Cmd: fusedCmd(nvme.IOWrite, 1, 0, 1, nvme.FlagFuseSecond), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf}
			plain := &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 0, 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf}
			var seq uint32
			var lba uint64
			run := func() {
				lba = (lba + 37) % 1000
				first.Cmd.SetRW(lba, 1, 0)
				second.Cmd.SetRW(lba, 1, 0)
				plain.Cmd.SetRW((lba+500)%1000, 1, 0)
				first.Seq, first.PrevFuse = seq, 0
				second.Seq, second.PrevFuse = seq+1, nvme.FlagFuseFirst
				plain.Seq, plain.PrevFuse = seq+2, nvme.FlagFuseSecond
				seq += 3
				n := b.ir.n
				if seq%2 == 0 {
					b.io.Execute(second)
					b.io.Execute(first)
				} else {
					b.io.Execute(first)
					b.io.Execute(second)
				}
				b.io.Execute(plain)
				if b.ir.n != n+3 || b.ir.last != nvme.StatusSuccess {
					t.Fatalf("pair and write: %d completions, last %s", b.ir.n-n, fmtStatus(b.ir.last))
				}
			}
			for range 200 {
				run()
			}
			if got := testing.AllocsPerRun(200, run); got != 0 {
				t.Errorf("%.2f allocations per pair and write, want 0", got)
			}
			if st := b.tgt.Stats(); st.FusedPairs < 400 {
				t.Errorf("Stats.FusedPairs %d, want ≥ 400", st.FusedPairs)
			}
		})
	}
}

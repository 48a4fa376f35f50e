package target_test

import (
	"bytes"
	"fmt"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// submitStamped executes cmd as a binding would after stamping its
// arrival (Request.Seq, Request.PrevFuse), without waiting.
func (h *harness) submitStamped(q *tq, cmd nvme.Command, data []byte, seq uint32, prev uint8) *call {
	h.mu.Lock()
	if cmd.CID == 0 {
		q.cid++
		cmd.CID = q.cid
	}
	r := &target.Request{Cmd: cmd, Dir: cmd.DataDirection(), Len: uint32(len(data)), Data: data, Seq: seq, PrevFuse: prev}
	c := &call{q: q, req: r, done: make(chan struct{})}
	r.Binding = c
	h.calls = append(h.calls, c)
	h.mu.Unlock()
	q.q.Execute(r)
	return c
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

//go:build linux

package tcp

import (
	"fmt"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// reqState is where a command is in the binding. Every change goes
// through req.to, which checks the transition and counts it.
type reqState uint8

const (
	// reqFree: the slot holds no command.
	reqFree reqState = iota
	// reqWaitBuf: waiting in its group's FIFO for a data buffer.
	reqWaitBuf
	// reqRecvData: its host data (in-capsule or H2CData after an R2T) is
	// being read into its buffer, or discarded (a refused command).
	reqRecvData
	// reqR2T: an R2T for its data is queued or sent; H2CData is due (it
	// stays here while its H2CData PDUs arrive; the last executes it).
	reqR2T
	// reqExec: handed to the core (Queue.Execute); Complete is due. The
	// core tracks where it is meanwhile — checked, then at the backend
	// (target.Stats.AtBackend) until the backend's IO.Done, reaped on
	// this poll group (target.Group.Reap) — and the binding holds it
	// here: its data buffer stays attached and a closing connection
	// never reclaims it (closeSocket skips reqExec; completed does, once
	// the core gives it back), since the disk may still be reading or
	// filling the buffer.
	reqExec
	// reqSend: its response (C2HData, CapsuleResp) is queued on the
	// connection; the slot is free once those bytes are written.
	reqSend
	numReqStates
)

var reqStateNames = [numReqStates]string{"free", "wait-buffer", "recv-data", "r2t", "exec", "send"}

func (s reqState) String() string {
	if s < numReqStates {
		return reqStateNames[s]
	}
	return fmt.Sprintf("reqState(%d)", uint8(s))
}

// reqMoves[from] has bit `to` set when from → to is allowed. Any state
// but reqSend may go back to reqFree when its connection dies (reclaim).
var reqMoves = [numReqStates]uint8{
	reqFree:     1<<reqWaitBuf | 1<<reqRecvData | 1<<reqR2T | 1<<reqExec | 1<<reqSend,
	reqWaitBuf:  1<<reqRecvData | 1<<reqR2T | 1<<reqExec | 1<<reqFree,
	reqRecvData: 1<<reqExec | 1<<reqSend | 1<<reqFree,
	reqR2T:      1<<reqExec | 1<<reqFree, // H2CData arrives while it stays in reqR2T
	reqExec:     1<<reqSend | 1<<reqFree,
	reqSend:     1 << reqFree,
}

// req is the binding's state of one command: the core's Request plus the
// slot it occupies (its index is the R2T's TTAG), its data buffer and the
// PDU headers sent for it. A connection preallocates SQSIZE+1 of them.
// Only the connection's poll group touches them, except Request, which
// the core owns between Execute and Complete.
type req struct {
	target.Request
	c     *conn
	slot  uint16
	state reqState
	buf   *dataBuf
	// got is the host data received so far (H2CData: DATAO must equal it).
	got uint32
	// fail is the status of a command the binding refused while its
	// in-capsule data is still to be read and discarded.
	fail nvme.Status
	// wnext links the group's buffer FIFO; dnext the done stack.
	wnext, dnext *req
	// hdr is the header of an R2T or a C2HData PDU (with its digest),
	// rsp the CapsuleResp's, ddgst a C2HData's data digest.
	hdr   [nvme.TCPDataHeaderSize + nvme.TCPDigestSize]byte
	rsp   [nvme.TCPCapsuleRespSize + nvme.TCPDigestSize]byte
	ddgst [nvme.TCPDigestSize]byte
}

// to moves r to state s. A move the table forbids is a bug of this
// package: it panics rather than answer a host twice.
func (r *req) to(s reqState) {
	if reqMoves[r.state]&(1<<s) == 0 {
		panic(fmt.Sprintf("tcp: request slot %d of queue %d: %v → %v", r.slot, r.c.qid, r.state, s))
	}
	r.state = s
	r.c.g.st.states[s].Add(1)
}

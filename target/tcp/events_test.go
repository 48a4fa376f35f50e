package tcp_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// TestEvents: each queue's connection logs one record when its queue is
// made and one when it ends, saying who ended it and why; a protocol
// error logs a termination with its FES; commands log nothing.
func TestEvents(t *testing.T) {
	lr := &logrec.Recorder{}
	lg := slog.New(lr)
	tt := newTestTargetWith(t, tcp.Config{Logger: lg, Cores: 1}, target.Config{Logger: lg})
	admin, cntlid := tt.adminUp(t, nvme.TCPDigests{})
	io := tt.ioUp(t, cntlid, 1, 15, 0, nvme.TCPDigests{})
	acc := lr.Wait(t, tcp.EventConnectionAccepted, "port", tt.addr, "qid", "0", "core", "0")
	if acc.Level != slog.LevelDebug || acc.Attrs["remote_addr"] != admin.nc.LocalAddr().String() {
		t.Errorf("accepted: %v %v", acc.Level, acc.Attrs)
	}
	lr.Wait(t, tcp.EventConnectionAccepted, "qid", "1", "remote_addr", io.nc.LocalAddr().String())

	before := lr.Len()
	for i := range 200 {
		if res := io.mustExchange(rw(nvme.IOWrite, 1, uint64(i), 1), pattern(4096, byte(i)), nil, nil); res.rsp.Status != 0 {
			t.Fatal(res.rsp.Status)
		}
	}
	if after := lr.Len(); after != before {
		t.Fatalf("%d records logged by 200 writes", after-before)
	}

	// A second ICReq is a PDU sequence error: terminated, then closed by
	// the target.
	var ic [nvme.TCPICSize]byte
	(&nvme.TCPICReqPDU{}).Marshal(&ic)
	if err := io.write(ic[:]); err != nil {
		t.Fatal(err)
	}
	io.expectTerm()
	term := lr.Wait(t, tcp.EventConnectionTerminated, "qid", "1", "fes", fmt.Sprintf("%#x", nvme.TCPFESPDUSequence))
	if term.Level != slog.LevelWarn || !strings.Contains(term.Attrs["reason"], "second ICReq") {
		t.Errorf("terminated: %v %v", term.Level, term.Attrs)
	}
	closed := lr.Wait(t, tcp.EventConnectionClosed, "qid", "1", "by", "target")
	if closed.Level != slog.LevelDebug || !strings.Contains(closed.Attrs["reason"], "second ICReq") {
		t.Errorf("I/O queue closed: %v %v", closed.Level, closed.Attrs)
	}

	// The host closes the admin queue: Info, by the host.
	admin.nc.Close()
	closed = lr.Wait(t, tcp.EventConnectionClosed, "qid", "0", "by", "host", "cntlid", fmt.Sprint(cntlid))
	if closed.Level != slog.LevelInfo {
		t.Errorf("admin queue closed at %v, want INFO", closed.Level)
	}
	lr.Wait(t, target.EventControllerDestroyed, "cntlid", fmt.Sprint(cntlid))
}

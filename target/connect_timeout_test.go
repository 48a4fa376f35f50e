package target_test

import (
	"errors"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestConnectTimeout: a queue on which no Connect succeeds within
// Config.ConnectTimeout (10 s by default) is dropped through exactly one
// Disconnect with ErrConnectTimeout, whether it sent nothing or only a
// refused Connect; a connected queue and a queue closed in time are left
// alone. Each drop is counted.
func TestConnectTimeout(t *testing.T) {
	h := newHarness(t)
	h.mustSubsystem(subA, 16)
	silent := h.queue("silent", target.QueueParams{QID: 0, SQSize: 31})
	refused := h.queue("refused", target.QueueParams{QID: 0, SQSize: 31})
	c := h.exec(refused, connectCmd(0, 31, 60000), connectData(hostA, "nqn.2014-08.org.example:nope", 0xFFFF, hostIDA))
	if c.status() == nvme.StatusSuccess {
		t.Fatal("Connect to a subsystem that does not exist succeeded")
	}
	closed := h.queue("closed", target.QueueParams{QID: 0, SQSize: 31})
	admin, cntlid := h.adminConnect("admin", hostA, subA, 60000)
	io := h.ioConnect("io1", 1, hostA, subA, cntlid)

	h.clock.Advance(target.DefaultConnectTimeout - time.Millisecond)
	for _, q := range []*tq{silent, refused, closed, admin, io} {
		if n := q.disconnected(); n != 0 {
			t.Fatalf("%s: %d disconnects before the connect timeout", q.name, n)
		}
	}
	closed.q.Close()
	h.clock.Advance(time.Millisecond)
	for _, q := range []*tq{silent, refused} {
		q.mu.Lock()
		n, reasons := len(q.disconnects), q.disconnects
		q.mu.Unlock()
		if n != 1 || !errors.Is(reasons[0], target.ErrConnectTimeout) {
			t.Errorf("%s: disconnects %v, want one ErrConnectTimeout", q.name, reasons)
		}
	}
	for _, q := range []*tq{closed, admin, io} {
		if n := q.disconnected(); n != 0 {
			t.Errorf("%s: %d disconnects, want none", q.name, n)
		}
	}
	if st := h.tgt.Stats(); st.ConnectsTimedOut != 2 || st.Controllers != 1 {
		t.Errorf("ConnectsTimedOut %d, Controllers %d; want 2 and 1", st.ConnectsTimedOut, st.Controllers)
	}
	// Much later, nothing more.
	h.clock.Advance(time.Minute)
	if n := silent.disconnected(); n != 1 {
		t.Errorf("silent: %d disconnects after a minute", n)
	}
}

package target_test

import (
	"errors"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestKeepAliveExpiry: with the fake clock, a controller whose host stops
// sending Keep Alive is torn down exactly at its KATO (rounded up to
// seconds): Disconnect with ErrKeepAliveExpired on every queue, held AERs
// aborted, the controller ID freed, the expiry counted.
func TestKeepAliveExpiry(t *testing.T) {
	h := newHarness(t)
	h.mustSubsystem(subA, 16)
	admin, cntlid := h.adminConnect("admin", hostA, subA, 2500) // 3 s
	io1 := h.ioConnect("io1", 1, hostA, subA, cntlid)
	io2 := h.ioConnect("io2", 2, hostA, subA, cntlid)
	aer, _ := h.execMayHold(admin, adminCmd(nvme.AdminAsyncEvent), nil)

	for range 5 {
		h.clock.Advance(2900 * time.Millisecond)
		mustOK(t, h.exec(admin, adminCmd(nvme.AdminKeepAlive), nil), "keep alive")
	}
	h.clock.Advance(2999 * time.Millisecond)
	if admin.disconnected() != 0 {
		t.Fatal("torn down before KATO")
	}
	h.clock.Advance(time.Millisecond)
	for _, q := range []*tq{admin, io1, io2} {
		q.mu.Lock()
		n := len(q.disconnects)
		var err error
		if n > 0 {
			err = q.disconnects[0]
		}
		q.mu.Unlock()
		if n != 1 || !errors.Is(err, target.ErrKeepAliveExpired) {
			t.Errorf("%s: %d disconnects (%v)", q.name, n, err)
		}
	}
	aer.wait(t)
	if s := aer.status(); s != nvme.StatusAbortSQDeleted {
		t.Errorf("held AER: %s", fmtStatus(s))
	}
	st := h.tgt.Stats()
	if st.KeepAliveExpired != 1 || st.Controllers != 0 || st.ControllersTornDown != 1 {
		t.Errorf("stats %+v", st)
	}
	// A new association gets a new controller.
	_, again := h.adminConnect("admin2", hostA, subA, 5000)
	if again == cntlid {
		t.Errorf("CNTLID %d reused at once", again)
	}
}

package tcp_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// holdReservation makes the test target's namespace serve reservations
// (LocalReservations) with Write Exclusive held by the raw host's host
// identifier and another host registered: the benchmark's I/O then
// passes the reservation check of a held reservation (the per-queue
// cache), the case "resv=held" measures.
func holdReservation(tb testing.TB, tt *testTarget) {
	tb.Helper()
	sub, ok := tt.t.Subsystem(testSubNQN)
	if !ok {
		tb.Fatal("no test subsystem")
	}
	me, other := resv.HostID{1, 2, 3, 4}, resv.HostID{0xee}
	st := &resv.State{Gen: 3, Type: resv.WriteExclusive, Holder: me, Index: 1,
		Regs: []resv.Registrant{{Host: me, Key: 0xa1}, {Host: other, Key: 0xb2}}}
	if err := sub.SetReservations(1, target.LocalReservations(), st); err != nil {
		tb.Fatal(err)
	}
}

// TestReservationsOverTCP: the reservation commands through the binding:
// Register and Acquire with their 16 bytes in the capsule, Release with
// 8, Report's data back in C2HData, Get Features 81h's 16 bytes, Set
// Features 83h answered by the keeper on the admin queue; the holder's
// writes pass the check, and after a Release another host's state
// refuses them.
func TestReservationsOverTCP(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{})
	sub, _ := tt.t.Subsystem(testSubNQN)
	if err := sub.SetReservations(1, target.LocalReservations(), nil); err != nil {
		t.Fatal(err)
	}
	admin, cntlid := tt.adminUp(t, nvme.TCPDigests{})
	io := tt.ioUp(t, cntlid, 1, 15, 0, nvme.TCPDigests{})
	keys := func(a, b uint64) []byte {
		k := nvme.ResvKeys{CRKEY: a, Key2: b}
		var buf [nvme.ResvDataSize]byte
		k.Marshal(&buf)
		return buf[:]
	}
	cmd := func(op nvme.IOOpcode, action, rtype, cptpl uint8) nvme.Command {
		c := nvme.Command{Opcode: uint8(op), NSID: 1}
		c.SetResv(action, false, rtype, cptpl)
		return c
	}
	ok := func(what string, res result) {
		t.Helper()
		if res.rsp.Status != 0 {
			t.Fatalf("%s: status %v", what, res.rsp.Status)
		}
	}
	ok("register", io.mustExchange(cmd(nvme.IOReservationRegister, nvme.RREGARegister, 0, nvme.CPTPLSet), keys(0, 0xa1), nil, nil))
	ok("acquire", io.mustExchange(cmd(nvme.IOReservationAcquire, nvme.RACQAAcquire, 1, 0), keys(0xa1, 0), nil, nil))
	ok("write by the holder", io.mustExchange(rw(nvme.IOWrite, 1, 0, 1), pattern(4096, 1), nil, nil))

	rep := make([]byte, 4096)
	report := nvme.Command{Opcode: uint8(nvme.IOReservationReport), NSID: 1, CDW10: 4096/4 - 1, CDW11: nvme.ResvReportEDS}
	ok("report", io.mustExchange(report, nil, nil, rep))
	le := binary.LittleEndian
	if gen, rtype, regctl, ptpls := le.Uint32(rep[0:]), rep[4], le.Uint16(rep[5:]), rep[9]; gen != 1 || rtype != 1 || regctl != 1 || ptpls != 1 {
		t.Fatalf("report header: gen %d rtype %d regctl %d ptpls %d", gen, rtype, regctl, ptpls)
	}
	if e := rep[64:128]; e[2] != 1 || le.Uint64(e[8:]) != 0xa1 || !bytes.Equal(e[16:20], []byte{1, 2, 3, 4}) {
		t.Fatalf("report entry: % x", e[:32])
	}

	hostID := make([]byte, 16)
	var gf nvme.Command
	(&nvme.FeatureCommand{FID: nvme.FeatureHostID, CDW11: 1}).EncodeGet(&gf)
	ok("get feature 81h", admin.mustExchange(gf, nil, nil, hostID))
	if !bytes.Equal(hostID[:4], []byte{1, 2, 3, 4}) {
		t.Fatalf("host identifier % x", hostID)
	}
	var sf nvme.Command
	(&nvme.FeatureCommand{FID: nvme.FeatureResvPersist, CDW11: 0}).EncodeSet(&sf)
	sf.NSID = 1
	ok("set feature 83h", admin.mustExchange(sf, nil, nil, nil))
	if st, _ := sub.Reservation(1); st.PTPL {
		t.Fatal("PTPL still set after Set Features 83h with 0")
	}

	rel := cmd(nvme.IOReservationRelease, nvme.RRELARelease, 1, 0)
	ok("release", io.mustExchange(rel, keys(0xa1, 0)[:8], nil, nil))
	other := resv.HostID{0xee}
	if err := sub.PublishReservation(1, &resv.State{Index: 1 << 40, Gen: 9, Type: resv.ExclusiveAccess, Holder: other,
		Regs: []resv.Registrant{{Host: other, Key: 1}}}); err != nil {
		t.Fatal(err)
	}
	if res := io.mustExchange(rw(nvme.IOWrite, 1, 0, 1), pattern(4096, 2), nil, nil); res.rsp.Status != nvme.StatusReservationConflict.WithDNR() {
		t.Fatalf("write under another host's EA: status %v", res.rsp.Status)
	}
	if res := io.mustExchange(rw(nvme.IORead, 1, 0, 1), nil, nil, make([]byte, 4096)); res.rsp.Status != nvme.StatusReservationConflict.WithDNR() {
		t.Fatalf("read under another host's EA: status %v", res.rsp.Status)
	}
}

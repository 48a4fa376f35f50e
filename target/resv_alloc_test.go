package target_test

import (
	"fmt"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
	"github.com/blk-project/blk/target"
)

// resvStates are the reservation states the allocation test and the
// benchmark run under: the bench's host (hostIDA) holding nothing,
// holding Write Exclusive with another host registered, and the other
// host holding it (the bench's writes refused, its reads served).
func resvStates(index uint64) map[string]*resv.State {
	a, b := resv.HostID(hostIDA), resv.HostID(hostIDB)
	regs := []resv.Registrant{{Host: a, Key: 0xa1}, {Host: b, Key: 0xb2}}
	return map[string]*resv.State{
		"registered": {Index: index, Gen: 2, Regs: regs},
		"held":       {Index: index, Gen: 2, Type: resv.WriteExclusive, Holder: a, Regs: regs},
		"held-other": {Index: index, Gen: 2, Type: resv.WriteExclusive, Holder: b, Regs: regs},
	}
}

// TestZeroAllocReservation: with a keeper, the I/O path allocates
// nothing per command, whether nothing is held (the view is nil), the
// host holds the reservation (its per-queue cache answers) or another
// host does (a refused write, Reservation Conflict, and a served read).
func TestZeroAllocReservation(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	mem, _ := target.NewMemBackend(4096, 1024)
	b := newIOBench(t, mem)
	if err := b.sub.SetReservations(1, target.LocalReservations(), nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	wr := &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 0, 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf}
	rd := &target.Request{Cmd: ioCmd(nvme.IORead, 1, 0, 1, 0), Dir: nvme.DirCtrlToHost, Len: 4096, Data: buf}
	index := uint64(1)
	for _, name := range []string{"registered", "held", "held-other"} {
		index++
		if err := b.sub.PublishReservation(1, resvStates(index)[name]); err != nil {
			t.Fatal(err)
		}
		wantWrite := nvme.StatusSuccess
		if name == "held-other" {
			wantWrite = nvme.StatusReservationConflict.WithDNR()
		}
		for _, c := range []struct {
			what string
			r    *target.Request
			want nvme.Status
		}{{"write", wr, wantWrite}, {"read", rd, nvme.StatusSuccess}} {
			var lba uint64
			run := func() {
				lba = (lba + 37) % 1000
				c.r.Cmd.SetRW(lba, 1, 0)
				n := b.ir.n
				b.io.Execute(c.r)
				if b.ir.n != n+1 || b.ir.last != c.want {
					t.Fatalf("%s, %s: %s, want %s", name, c.what, fmtStatus(b.ir.last), fmtStatus(c.want))
				}
			}
			run() // the queue's cache of this view
			if got := testing.AllocsPerRun(200, run); got != 0 {
				t.Errorf("%s, %s: %.2f allocations per command, want 0", name, c.what, got)
			}
		}
	}
}

// BenchmarkReservationCheck: the reservation check of the I/O path
// alone (resvCheck and the drain counters), ns/op and allocs/op, for a
// namespace with no keeper, a keeper and nothing held (nil view), a
// reservation held (the per-queue cache hits), and a view replaced
// every 64 checks (each replacement costs the queue one Access and one
// small allocation; the publish itself is counted too).
func BenchmarkReservationCheck(b *testing.B) {
	for _, bc := range []struct {
		name  string
		state string // "" no keeper
		every int    // republish every this many checks (0: never)
	}{{"no-keeper", "", 0}, {"nothing-held", "registered", 0}, {"held", "held", 0},
		{"held-other", "held-other", 0}, {"changed-every-64", "held", 64}} {
		b.Run(bc.name, func(b *testing.B) {
			mem, _ := target.NewMemBackend(4096, 1024)
			ib := newIOBench(b, mem)
			index := uint64(1)
			if bc.state != "" {
				if err := ib.sub.SetReservations(1, target.LocalReservations(), resvStates(index)[bc.state]); err != nil {
					b.Fatal(err)
				}
			}
			states := resvStates(0)
			r := &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 0, 1, 0)}
			want := nvme.StatusSuccess
			if bc.state == "held-other" {
				want = nvme.StatusReservationConflict.WithDNR()
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if bc.every != 0 && i%bc.every == 0 {
					index++
					st := states[bc.state]
					st.Index = index
					_ = ib.sub.PublishReservation(1, st)
				}
				i++
				if st := target.ResvCheck(ib.io, r, 1, true); st != want {
					b.Fatal(fmt.Sprintf("check: %s", fmtStatus(st)))
				}
			}
		})
	}
}

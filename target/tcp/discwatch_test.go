package tcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// TestWatchDiscovery: a persistent discovery controller (blk's
// initiator, as nvme connect-all --persistent keeps one) gets the
// discovery change notice when the remote subsystems change, reads them
// in the log at the serving targets' addresses and PORTIDs, gets none
// when the same list is set again, and stays connected past its KATO by
// keep-alives.
func TestWatchDiscovery(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := initiator.Config{Transport: initiator.TransportTCP, HostNQN: testHostNQN, KATO: time.Second}
	w, err := initiator.WatchDiscovery(ctx, cfg, tt.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	count := func(l []nvme.DiscoveryLogEntry, nqn string) (n int, e nvme.DiscoveryLogEntry) {
		for _, x := range l {
			if x.SubNQN.String() == nqn {
				n, e = n+1, x
			}
		}
		return n, e
	}
	// remotes sets the remote subsystems, waits for the change notice
	// (failing with missing if none comes within 5 s) and reads the log.
	remotes := func(set []target.RemoteSubsystem, missing string) []nvme.DiscoveryLogEntry {
		t.Helper()
		if err := tt.t.SetRemoteSubsystems(set); err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.Changed():
		case <-time.After(5 * time.Second):
			t.Fatal(missing)
		}
		l, err := w.Log(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l, err := w.Log(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := count(l, testSubNQN); n != 1 {
		t.Fatalf("log lists %s %d times, want once: %d entries", testSubNQN, n, len(l))
	}

	const remote = "nqn.2026-11.io.blk:elsewhere"
	set := []target.RemoteSubsystem{{NQN: remote, Hosts: []string{testHostNQN},
		Paths: []target.Port{{ID: 13, TrType: nvme.TrTypeTCP, AdrFam: nvme.AdrFamIPv4, TrAddr: "192.0.2.3", TrSvcID: "4420", TReq: nvme.TReqDisableSQFlow}}}}
	n, e := count(remotes(set, "no discovery change notice within 5s of a new remote subsystem"), remote)
	if n != 1 || e.PortID != 13 || e.TrType != nvme.TrTypeTCP || e.TReq != nvme.TReqDisableSQFlow || e.SubType != nvme.SubTypeNVM ||
		string(trim(e.TrAddr[:])) != "192.0.2.3" || string(trim(e.TrSvcID[:])) != "4420" {
		t.Fatalf("remote subsystem listed %d times, last %+v", n, e)
	}

	// The same list again is no change; the keep-alives hold the
	// controller past its KATO meanwhile.
	if err := tt.t.SetRemoteSubsystems(set); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Changed():
		t.Fatal("a notice for the same list")
	case <-w.Down():
		t.Fatal("discovery controller lost")
	case <-time.After(2500 * time.Millisecond):
	}
	if n, _ := count(remotes(nil, "no notice when the remote subsystem left"), remote); n != 0 {
		t.Fatalf("remote subsystem still listed %d times", n)
	}
}

func trim(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == 0 || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

package rdma_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
)

// TestEvents: a host's association through the port logs the core's
// controller events and the port's connection events with the host's
// address; a CM-level refusal logs a rejected connection; commands log
// nothing.
func TestEvents(t *testing.T) {
	lr := &logrec.Recorder{}
	lg := slog.New(lr)
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cfg := rdma.Config{Addr: "127.0.0.1:0", Cores: 1, Logger: lg}
	tgt, err := target.New(target.Config{Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	sub, err := tgt.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Hosts: []string{testHostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	mem, _ := target.NewMemBackend(4096, 1024)
	if err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: mem}); err != nil {
		t.Fatal(err)
	}
	port, err := rdma.Listen(tgt, a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer port.Close()
	addr := port.Addr().String()

	c := connectHost(t, addr, initiator.Config{Queues: 1})
	created := lr.Wait(t, target.EventControllerCreated, "kind", "nvm", "subsystem", testSubNQN, "host_nqn", testHostNQN)
	cntlid := created.Attrs["cntlid"]
	remote := created.Attrs["remote_addr"]
	if remote == "" || cntlid == "" {
		t.Fatalf("controller created without remote_addr or cntlid: %v", created.Attrs)
	}
	lr.Wait(t, rdma.EventConnectionAccepted, "port", addr, "qid", "0", "remote_addr", remote)
	lr.Wait(t, rdma.EventConnectionAccepted, "port", addr, "qid", "1")

	before := lr.Len()
	ns := c.Namespace(1)
	buf := make([]byte, 4096)
	for range 200 {
		if _, err := ns.WriteAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if after := lr.Len(); after != before {
		t.Fatalf("%d records logged by 200 writes", after-before)
	}

	// The host goes away: its connections close and the controller is
	// destroyed.
	c.Close()
	closed := lr.Wait(t, rdma.EventConnectionClosed, "qid", "0", "cntlid", cntlid, "remote_addr", remote)
	if closed.Level != slog.LevelInfo {
		t.Errorf("admin queue closed at %v, want INFO", closed.Level)
	}
	lr.Wait(t, target.EventControllerDestroyed, "cntlid", cntlid, "reason", "disconnect")

	// Refused before any queue exists: the CM reject.
	if _, err := dialRaw(t, addr, nvme.RDMACMRequest{RecFmt: 1, HRQSize: 32, HSQSize: 31}); err == nil {
		t.Fatal("RECFMT 1 accepted")
	}
	rej := lr.Wait(t, rdma.EventConnectionRejected, "port", addr, "reason", "RECFMT 1")
	if rej.Level != slog.LevelWarn || rej.Attrs["status"] == "" || rej.Attrs["remote_addr"] == "" {
		t.Errorf("rejected: %v %v", rej.Level, rej.Attrs)
	}

	// A host the subsystem does not allow: the core refuses its Connect.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ee"
	if _, err := initiator.Connect(ctx, initiator.Config{Adapter: hostAdapter(t), HostNQN: other}, addr, testSubNQN); err == nil {
		t.Fatal("a host not allowed connected")
	}
	lr.Wait(t, target.EventConnectRefused, "host_nqn", other, "subsystem", testSubNQN, "reason", "host not allowed on the subsystem")

	// Closing the port disconnects what is left, as the target.
	c2 := connectHost(t, addr, initiator.Config{Queues: 1})
	defer c2.Close()
	lr.Wait(t, target.EventControllerCreated, "host_nqn", testHostNQN, "reconnect", "true", "previous_cntlid", cntlid, "previous_state", "disconnect")
	n := lr.Count(rdma.EventConnectionClosed)
	port.Close()
	lr.Wait(t, rdma.EventConnectionClosed, "by", "target", "reason", "rdma: port closed")
	if m := lr.Count(rdma.EventConnectionClosed); m < n+2 {
		t.Errorf("%d connections closed by the port, want 2", m-n)
	}
}

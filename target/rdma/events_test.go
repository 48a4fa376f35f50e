package rdma_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
)

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu   sync.Mutex
	recs []logRec
}

type logRec struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, x slog.Record) error {
	m := map[string]string{}
	x.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	r.mu.Lock()
	r.recs = append(r.recs, logRec{x.Level, x.Message, m})
	r.mu.Unlock()
	return nil
}

// wait returns the first record with message msg and the attributes kv,
// waiting up to 10 s for it.
func (r *logRecorder) wait(t *testing.T, msg string, kv ...string) logRec {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		for _, x := range r.recs {
			ok := x.msg == msg
			for i := 0; ok && i+1 < len(kv); i += 2 {
				ok = x.attrs[kv[i]] == kv[i+1]
			}
			if ok {
				r.mu.Unlock()
				return x
			}
		}
		all := fmt.Sprint(r.recs)
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no %q record with %v within 10 s; records: %s", msg, kv, all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *logRecorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.recs {
		if x.msg == msg {
			n++
		}
	}
	return n
}

// TestEvents: a host's association through the port logs the core's
// controller events and the port's connection events with the host's
// address; a CM-level refusal logs a rejected connection; commands log
// nothing.
func TestEvents(t *testing.T) {
	lr := &logRecorder{}
	lg := slog.New(lr)
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cfg := rdma.Config{Addr: "127.0.0.1:0", Cores: 1, Logger: lg}
	lim, err := rdma.Limits(a.Info(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := target.New(target.Config{Limits: lim, Logger: lg})
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
	created := lr.wait(t, target.EventControllerCreated, "kind", "nvm", "subsystem", testSubNQN, "host_nqn", testHostNQN)
	cntlid := created.attrs["cntlid"]
	remote := created.attrs["remote_addr"]
	if remote == "" || cntlid == "" {
		t.Fatalf("controller created without remote_addr or cntlid: %v", created.attrs)
	}
	lr.wait(t, rdma.EventConnectionAccepted, "port", addr, "qid", "0", "remote_addr", remote)
	lr.wait(t, rdma.EventConnectionAccepted, "port", addr, "qid", "1")

	before := func() int { lr.mu.Lock(); defer lr.mu.Unlock(); return len(lr.recs) }()
	ns := c.Namespace(1)
	buf := make([]byte, 4096)
	for range 200 {
		if _, err := ns.WriteAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if after := func() int { lr.mu.Lock(); defer lr.mu.Unlock(); return len(lr.recs) }(); after != before {
		t.Fatalf("%d records logged by 200 writes", after-before)
	}

	// The host goes away: its connections close and the controller is
	// destroyed.
	c.Close()
	closed := lr.wait(t, rdma.EventConnectionClosed, "qid", "0", "cntlid", cntlid, "remote_addr", remote)
	if closed.level != slog.LevelInfo {
		t.Errorf("admin queue closed at %v, want INFO", closed.level)
	}
	lr.wait(t, target.EventControllerDestroyed, "cntlid", cntlid, "reason", "disconnect")

	// Refused before any queue exists: the CM reject.
	if _, err := dialRaw(t, addr, nvme.RDMACMRequest{RecFmt: 1, HRQSize: 32, HSQSize: 31}); err == nil {
		t.Fatal("RECFMT 1 accepted")
	}
	rej := lr.wait(t, rdma.EventConnectionRejected, "port", addr, "reason", "RECFMT 1")
	if rej.level != slog.LevelWarn || rej.attrs["status"] == "" || rej.attrs["remote_addr"] == "" {
		t.Errorf("rejected: %v %v", rej.level, rej.attrs)
	}

	// A host the subsystem does not allow: the core refuses its Connect.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ee"
	if _, err := initiator.Connect(ctx, initiator.Config{Adapter: hostAdapter(t), HostNQN: other}, addr, testSubNQN); err == nil {
		t.Fatal("a host not allowed connected")
	}
	lr.wait(t, target.EventConnectRefused, "host_nqn", other, "subsystem", testSubNQN, "reason", "host not allowed on the subsystem")

	// Closing the port disconnects what is left, as the target.
	c2 := connectHost(t, addr, initiator.Config{Queues: 1})
	defer c2.Close()
	lr.wait(t, target.EventControllerCreated, "host_nqn", testHostNQN, "reconnect", "true", "previous_cntlid", cntlid, "previous_state", "disconnect")
	n := lr.count(rdma.EventConnectionClosed)
	port.Close()
	lr.wait(t, rdma.EventConnectionClosed, "by", "target", "reason", "rdma: port closed")
	if m := lr.count(rdma.EventConnectionClosed); m < n+2 {
		t.Errorf("%d connections closed by the port, want 2", m-n)
	}
}

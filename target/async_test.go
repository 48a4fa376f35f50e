package target_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// asyncLive is harness.live on a DelayedBackend of blocks 4 KiB blocks.
func asyncLive(t *testing.T, blocks uint64) (*harness, *tq, *tq, *target.DelayedBackend) {
	t.Helper()
	d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: blocks, Seed: 7,
		MaxDelay: 100 * time.Microsecond, TrackDurable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close) // after the harness's checks
	h := newHarness(t)
	_, admin, io, _ := h.serve(target.NamespaceConfig{NSID: 1, Async: d})
	return h, admin, io, d
}

// TestAsyncCommands: every NVM command on an asynchronous backend that
// completes from its own goroutines: reads see writes; Compare without
// View reads into a pooled buffer and compares at completion; a DSM of
// several ranges deallocates them one IO after the other; FUA writes
// and Flushes (one namespace and all) make the writes before them
// durable; a shutdown flushes.
func TestAsyncCommands(t *testing.T) {
	h, admin, io, d := asyncLive(t, 256)
	const b = 4096
	w := make([]byte, 10*b)
	for i := range w {
		w[i] = byte(i*7 + i>>12)
	}
	mustOK(t, h.exec(io, ioCmd(nvme.IOWrite, 1, 16, 10, 0), w), "write")
	got := make([]byte, 10*b)
	c := h.exec(io, ioCmd(nvme.IORead, 1, 16, 10, 0), got)
	mustOK(t, c, "read")
	if !bytes.Equal(c.data, w) {
		t.Fatal("read differs from the write")
	}
	mustOK(t, h.exec(io, ioCmd(nvme.IOCompare, 1, 16, 8, 0), w[:8*b]), "compare equal")
	if s := h.exec(io, ioCmd(nvme.IOCompare, 1, 17, 8, 0), w[:8*b]).status(); s != nvme.StatusCompareFailure.WithDNR() {
		t.Fatalf("compare of different data: %s", fmtStatus(s))
	}
	mustOK(t, h.exec(io, ioCmd(nvme.IOCompare, 1, 100, 4, 0), make([]byte, 4*b)), "compare zeros")
	if s := h.exec(io, ioCmd(nvme.IORead, 1, 250, 10, 0), got).status(); s != nvme.StatusLBAOutOfRange.WithDNR() {
		t.Fatalf("read past the end: %s", fmtStatus(s))
	}

	// Nothing is durable before a Flush; the Flush makes it so.
	dur := make([]byte, 10*b)
	if err := d.Durable().Read(16, dur); err != nil || !bytes.Equal(dur, make([]byte, 10*b)) {
		t.Fatalf("durable before Flush: %v", err)
	}
	mustOK(t, h.exec(io, ioCmd(nvme.IOFlush, 1, 0, 0, 0), nil), "flush")
	if err := d.Durable().Read(16, dur); err != nil || !bytes.Equal(dur, w) {
		t.Fatalf("durable after Flush differs (%v)", err)
	}

	fua := bytes.Repeat([]byte{0xfa}, b)
	mustOK(t, h.exec(io, ioCmd(nvme.IOWrite, 1, 24, 1, nvme.RWFUA), fua), "write FUA")
	if err := d.Durable().Read(24, dur[:b]); err != nil || !bytes.Equal(dur[:b], fua) {
		t.Fatal("a FUA write is not durable at its completion")
	}
	mustOK(t, h.exec(io, ioCmd(nvme.IOWriteZeroes, 1, 16, 2, 0), nil), "write zeroes")
	mustOK(t, h.exec(io, ioCmd(nvme.IOWriteZeroes, 1, 18, 2, nvme.RWDEAC), nil), "write zeroes DEAC")
	mustOK(t, h.exec(io, ioCmd(nvme.IOWriteZeroes, 1, 20, 1, nvme.RWFUA), nil), "write zeroes FUA")
	dsm := make([]byte, 4096)
	(&nvme.DSMRange{SLBA: 22, NLB: 2}).Marshal((*[16]byte)(dsm))
	(&nvme.DSMRange{SLBA: 30, NLB: 0}).Marshal((*[16]byte)(dsm[16:])) // empty: skipped
	(&nvme.DSMRange{SLBA: 25, NLB: 1}).Marshal((*[16]byte)(dsm[32:]))
	mustOK(t, h.exec(io, nvme.Command{Opcode: uint8(nvme.IODatasetManagement), Flags: nvme.FlagSGLMetaBuf,
		NSID: 1, CDW10: 2, CDW11: nvme.DSMAD}, dsm), "dsm")
	c = h.exec(io, ioCmd(nvme.IORead, 1, 16, 10, 0), got)
	mustOK(t, c, "read back")
	want := make([]byte, 10*b)
	copy(want[5*b:], w[5*b:6*b]) // block 21
	copy(want[8*b:], fua)        // block 24
	if !bytes.Equal(c.data, want) {
		t.Fatal("zeroed and deallocated blocks differ")
	}

	// Flush of every namespace and a shutdown wait for the backend.
	mustOK(t, h.exec(io, ioCmd(nvme.IOFlush, nvme.NSIDAll, 0, 0, 0), nil), "flush all")
	if err := d.Durable().Read(16, dur); err != nil || !bytes.Equal(dur, want) {
		t.Fatal("durable after Flush all differs")
	}
	mustOK(t, h.exec(admin, propSet(nvme.PropCC, ccEnable|uint64(nvme.ShutdownNormal)<<14), nil), "shutdown")
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := h.exec(admin, propGet(nvme.PropCSTS, false), nil)
		if nvme.CSTS(c.dw0()).SHST() == nvme.ShutdownStatusComplete {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("shutdown never completed")
		}
		time.Sleep(time.Millisecond)
	}
	st := h.tgt.Stats()
	ns := st.Namespaces[0]
	if ns.Reads != 2 || ns.Compares != 2 || ns.Writes != 2 || ns.FUAWrites != 1 || ns.WriteZeroes != 2 ||
		ns.Deallocates != 2 || ns.DeallocatedBlocks != 5 || ns.Flushes < 3 || ns.Errors != 2 {
		t.Fatalf("namespace counters %+v", ns)
	}
	if d.Corrupt() != 0 {
		t.Fatal("write data changed at the backend")
	}
}

// TestAsyncCompletionOnGroup: a request executed with a Group that has a
// wake is completed on the Group's owner, by Reap, never on the
// backend's goroutine; a Queue closed while it is at the backend drains
// only once it completes.
func TestAsyncCompletionOnGroup(t *testing.T) {
	h, _, io, d := asyncLive(t, 64)
	g := h.tgt.NewGroup(8)
	woken := make(chan struct{}, 1)
	g.SetWake(func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	})
	d.Pause()
	r := &target.Request{Cmd: ioCmd(nvme.IORead, 1, 3, 1, 0), Dir: nvme.DirCtrlToHost, Len: 4096, Data: make([]byte, 4096), Group: g}
	r.Cmd.CID = 900
	c := &call{q: io, req: r, done: make(chan struct{})}
	r.Binding = c
	h.mu.Lock()
	h.calls = append(h.calls, c)
	h.mu.Unlock()
	io.q.Execute(r)
	io.q.Close() // the connection goes while the read is at the backend
	select {
	case <-io.q.Drained():
		t.Fatal("queue drained with a read at the backend")
	default:
	}
	d.Resume()
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's completion never woke the group")
	}
	select {
	case <-c.done:
		t.Fatal("completed off the group's goroutine, before Reap")
	case <-io.q.Drained():
		t.Fatal("queue drained before the completion was reaped")
	default:
	}
	if g.HasCompletions() != true || !g.Reap() {
		t.Fatal("nothing to reap")
	}
	c.wait(t)
	<-io.q.Drained()
	if g.HasCompletions() || g.Reap() {
		t.Fatal("reaped twice")
	}
}

// TestNamespaceBackendChoice: a namespace takes exactly one of Backend
// and Async; a synchronous backend wrapped by the caller (Inline) serves
// as well as one given as Backend.
func TestNamespaceBackendChoice(t *testing.T) {
	h := newHarness(t)
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subA, AllowAnyHost: true})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := target.NewMemBackend(4096, 64)
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1}); err == nil {
		t.Fatal("a namespace without a backend was added")
	}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: m, Async: target.Inline(m)}); err == nil {
		t.Fatal("a namespace with two backends was added")
	}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Async: target.Inline(m)}); err != nil {
		t.Fatal(err)
	}
	_, cntlid := h.adminConnect("admin", hostA, subA, 5000)
	io := h.ioConnect("io1", 1, hostA, subA, cntlid)
	w := bytes.Repeat([]byte{0x5a}, 4096)
	mustOK(t, h.exec(io, ioCmd(nvme.IOWrite, 1, 7, 1, nvme.RWFUA), w), "write FUA")
	mustOK(t, h.exec(io, ioCmd(nvme.IOCompare, 1, 7, 1, 0), w), "compare")
	if c := h.exec(io, ioCmd(nvme.IORead, 1, 7, 1, 0), make([]byte, 4096)); !bytes.Equal(c.data, w) {
		t.Fatal("read differs from the write")
	}
	if st := h.tgt.Stats(); st.AtBackend != 0 {
		t.Fatalf("%d IOs of a synchronous backend counted at the backend, want 0 (called directly)", st.AtBackend)
	}
}

package target_test

import (
	"path/filepath"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
)

// countResponder counts completions and remembers the last status; it
// allocates nothing.
type countResponder struct {
	n    int
	last nvme.Status
}

func (r *countResponder) Complete(req *target.Request) { r.n++; r.last = req.Rsp.Status }
func (r *countResponder) Disconnect(error)             {}

// ioBench is a target with one live controller and one I/O queue whose
// namespace 1 is backend, driven without the test harness (which
// allocates per command).
type ioBench struct {
	tgt       *target.Target
	admin, io *target.Queue
	ar, ir    countResponder
	sub       *target.Subsystem
}

func newIOBench(tb testing.TB, backend target.Backend, opts ...func(*target.SubsystemConfig)) *ioBench {
	tb.Helper()
	tgt, err := target.New(target.Config{Limits: testLimits()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = tgt.Close() })
	sc := target.SubsystemConfig{NQN: subA, AllowAnyHost: true}
	for _, o := range opts {
		o(&sc)
	}
	s, err := tgt.AddSubsystem(sc)
	if err != nil {
		tb.Fatal(err)
	}
	b := &ioBench{tgt: tgt, sub: s}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: backend}); err != nil {
		tb.Fatal(err)
	}
	b.admin, _ = tgt.NewQueue(&b.ar, target.QueueParams{QID: 0, SQSize: 31})
	b.io, _ = tgt.NewQueue(&b.ir, target.QueueParams{QID: 1, SQSize: 127})
	sync := func(q *target.Queue, r *countResponder, cmd nvme.Command, data []byte) {
		req := &target.Request{Cmd: cmd, Len: uint32(len(data)), Data: data}
		n := r.n
		q.Execute(req)
		if r.n != n+1 || r.last != nvme.StatusSuccess {
			tb.Fatalf("setup command %#x: %s", cmd.Opcode, fmtStatus(r.last))
		}
	}
	sync(b.admin, &b.ar, connectCmd(0, 31, 0), connectData(hostA, subA, 0xFFFF, hostIDA))
	sync(b.admin, &b.ar, propSet(nvme.PropCC, ccEnable), nil)
	sync(b.io, &b.ir, connectCmd(1, 127, 0), connectData(hostA, subA, b.admin.CNTLID(), hostIDA))
	return b
}

// TestZeroAllocIO guards the I/O path: executing a Read or a Write on an
// I/O queue allocates nothing, with an in-memory backend (the core alone),
// with one whose plain writes group (the core's batching: a write gathered
// by a Group and its Commit, the binding's path) and with a store volume
// on an O_DIRECT file area (the core and the store's read and overwrite
// path, every cluster allocated first), timed into the namespace's latency
// histograms like every backend call.
func TestZeroAllocIO(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	mem, _ := target.NewMemBackend(4096, 1024)
	grouped, _ := target.NewMemBackend(4096, 1024)
	grouped.SetWriteGroups(64)
	// No background syncer: its flushes would allocate (pebble) while
	// the request path is measured.
	s, err := store.Open(store.Config{Dir: filepath.Join(t.TempDir(), "meta"), AreaBytes: 8 << 20, Logger: quietLogger{},
		SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	vol, err := s.Create(1, store.CreateOptions{SizeBytes: 1024 * 4096})
	if err != nil {
		t.Fatal(err)
	}
	// Allocate every cluster: a first write commits a map key (pebble),
	// which is not the steady state measured here.
	fill := make([]byte, 1<<20)
	for lba := uint64(0); lba < 1024; lba += 256 {
		if err := vol.Write(lba, fill, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, bc := range []struct {
		name    string
		backend target.Backend
	}{{"memory", mem}, {"grouped memory", grouped}, {"store", target.StoreBackend(vol)}} {
		t.Run(bc.name, func(t *testing.T) {
			b := newIOBench(t, bc.backend)
			g := b.tgt.NewGroup(16)
			var lba uint64
			next := func() uint64 { lba = (lba + 37) % 1000; return lba }
			for _, blocks := range []uint32{1, 8} {
				buf := make([]byte, int(blocks)*4096)
				wr := &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 0, blocks, 0), Dir: nvme.DirHostToCtrl, Len: uint32(len(buf)), Data: buf}
				rd := &target.Request{Cmd: ioCmd(nvme.IORead, 1, 0, blocks, 0), Dir: nvme.DirCtrlToHost, Len: uint32(len(buf)), Data: buf}
				gw := &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 0, blocks, 0), Dir: nvme.DirHostToCtrl, Len: uint32(len(buf)), Data: buf, Group: g}
				for _, c := range []struct {
					name string
					r    *target.Request
				}{{"write", wr}, {"read", rd}, {"grouped write", gw}} {
					run := func() {
						c.r.Cmd.SetRW(next(), blocks, 0)
						n := b.ir.n
						b.io.Execute(c.r)
						g.Commit()
						if b.ir.n != n+1 || b.ir.last != nvme.StatusSuccess {
							t.Fatalf("%s: %s", c.name, fmtStatus(b.ir.last))
						}
					}
					for range 200 { // warm pools
						run()
					}
					if got := testing.AllocsPerRun(200, run); got != 0 {
						t.Errorf("%s of %d blocks: %.2f allocations per command, want 0", c.name, blocks, got)
					}
				}
			}
			if bc.name == "grouped memory" {
				var ns target.NamespaceStats
				for _, n := range b.tgt.Stats().Namespaces {
					ns = n
				}
				if ns.GroupedWrites == 0 || ns.GroupCommits == 0 {
					t.Errorf("the grouped backend's writes were not grouped: %+v", ns)
				}
			}
		})
	}
}

// TestZeroAllocANA: the ANA state check on the I/O path (one atomic
// load) allocates nothing, whether the command is served (optimized) or
// refused before the backend (inaccessible: Asymmetric Access
// Inaccessible, no DNR, and the backend untouched).
func TestZeroAllocANA(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	mem, _ := target.NewMemBackend(4096, 1024)
	b := newIOBench(t, mem, func(c *target.SubsystemConfig) { c.ANA = true })
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = 0x5a
	}
	wr := &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 7, 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf}
	for _, c := range []struct {
		state nvme.ANAState
		want  nvme.Status
	}{{nvme.ANAOptimized, nvme.StatusSuccess}, {nvme.ANAInaccessible, nvme.StatusANAInaccessible},
		{nvme.ANANonOptimized, nvme.StatusSuccess}} {
		if err := b.sub.SetANAState(c.state); err != nil {
			t.Fatal(err)
		}
		if c.state == nvme.ANAInaccessible {
			buf[0] = 0xEE // a write that must not land
		}
		run := func() {
			n := b.ir.n
			b.io.Execute(wr)
			if b.ir.n != n+1 || b.ir.last != c.want {
				t.Fatalf("%v: %s, want %s", c.state, fmtStatus(b.ir.last), fmtStatus(c.want))
			}
		}
		run()
		if got := testing.AllocsPerRun(200, run); got != 0 {
			t.Errorf("%v: %.2f allocations per write, want 0", c.state, got)
		}
		buf[0] = 0x5a
		got := make([]byte, 4096)
		if err := mem.Read(7, got); err != nil || got[0] != 0x5a {
			t.Fatalf("%v: block 7 starts %#x (%v): a refused write reached the backend", c.state, got[0], err)
		}
	}
}

func benchmarkIO(b *testing.B, op nvme.IOOpcode, blocks uint32) {
	mem, _ := target.NewMemBackend(4096, 1024)
	ib := newIOBench(b, mem)
	buf := make([]byte, int(blocks)*4096)
	r := &target.Request{Cmd: ioCmd(op, 1, 0, blocks, 0), Len: uint32(len(buf)), Data: buf}
	var lba uint64
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		lba = (lba + 37) % 1000
		r.Cmd.SetRW(lba, blocks, 0)
		ib.io.Execute(r)
	}
	if ib.ir.last != nvme.StatusSuccess {
		b.Fatal(fmtStatus(ib.ir.last))
	}
}

func BenchmarkRead4K(b *testing.B)  { benchmarkIO(b, nvme.IORead, 1) }
func BenchmarkWrite4K(b *testing.B) { benchmarkIO(b, nvme.IOWrite, 1) }

package target_test

import (
	"bytes"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// groupBackend is a memory backend of 256 blocks of 4 KiB whose plain
// writes group (up to 64 per group), as a backend on a log-structured
// store would: no product backend groups today (the store's overwrite is
// one pwrite), but the core's batching is part of the Backend contract.
func groupBackend(t *testing.T) *target.MemBackend {
	t.Helper()
	m, err := target.NewMemBackend(4096, 256)
	if err != nil {
		t.Fatal(err)
	}
	m.SetWriteGroups(64)
	return m
}

// Plain writes executed with a Group are completed by its Commit, all
// visible afterwards; a bad write completes at once. (FUA writes never
// reach the group: they go to the sync workers, see io_cmd.go.)
func TestGroupedWrites(t *testing.T) {
	mem := groupBackend(t)
	b := newIOBench(t, mem)
	g := b.tgt.NewGroup(16)
	defer g.Commit() // never leave requests pending: Close waits for them
	base := b.ir.n
	reqs := make([]*target.Request, 8)
	for i := range reqs {
		data := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		reqs[i] = &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, uint64(10+i), 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: data, Group: g}
		b.io.Execute(reqs[i])
	}
	if b.ir.n != base || g.Pending() != 8 {
		t.Fatalf("before Commit: %d completed, %d pending; want 0 and 8", b.ir.n-base, g.Pending())
	}
	got := make([]byte, 4096)
	if err := mem.Read(10, got); err != nil || got[0] != 0 {
		t.Fatalf("a pending write is visible (err %v)", err)
	}
	// Out of range: refused at once, not held.
	bad := &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 300, 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: make([]byte, 4096), Group: g}
	b.io.Execute(bad)
	if b.ir.n != base+1 || b.ir.last.Code() != nvme.StatusLBAOutOfRange {
		t.Fatalf("out-of-range write: %d completed, status %v", b.ir.n-base, b.ir.last)
	}
	g.Commit()
	if g.Pending() != 0 {
		t.Fatalf("%d still pending after Commit", g.Pending())
	}
	for i := range reqs {
		if reqs[i].Rsp.Status != nvme.StatusSuccess {
			t.Fatalf("grouped write %d: %v", i, reqs[i].Rsp.Status)
		}
		if err := mem.Read(uint64(10+i), got); err != nil || got[0] != byte(i+1) || got[4095] != byte(i+1) {
			t.Fatalf("block %d after Commit: err %v, byte %d", 10+i, err, got[0])
		}
	}
	if st := g.Stats(); st.Writes != 8 || st.Commits != 1 {
		t.Errorf("group stats %+v, want 8 writes in 1 commit", st)
	}
}

// timedBackend is a decorator as a daemon writes one (metrics, tracing):
// it embeds the Backend it wraps and overrides what it measures. Only
// the Backend's methods are promoted, so whatever batching the backend
// offers must be part of that interface for a decorator to keep it.
type timedBackend struct {
	target.Backend
	writes int
}

func (b *timedBackend) Write(lba uint64, data []byte, fua bool) error {
	b.writes++
	return b.Backend.Write(lba, data, fua)
}

// A backend behind a decorator still commits the plain writes of one
// batch together: a daemon may wrap every backend (issue 22: blkd's
// latency wrapper dropped the batching, so every write was its own pebble
// commit).
func TestGroupedWritesThroughDecorator(t *testing.T) {
	mem := groupBackend(t)
	wrapped := &timedBackend{Backend: mem}
	b := newIOBench(t, wrapped)
	g := b.tgt.NewGroup(16)
	defer g.Commit()
	base := b.ir.n
	for i := range 8 {
		data := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		b.io.Execute(&target.Request{Cmd: ioCmd(nvme.IOWrite, 1, uint64(i), 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: data, Group: g})
	}
	g.Commit()
	if n := b.ir.n - base; n != 8 || b.ir.last != nvme.StatusSuccess {
		t.Fatalf("%d writes completed, last %v; want 8, success", n, b.ir.last)
	}
	if st := g.Stats(); st.Writes != 8 || st.Commits != 1 {
		t.Errorf("through a decorator: group stats %+v, want 8 writes in 1 commit (%d written alone)", st, wrapped.writes)
	}
	got := make([]byte, 4096)
	for i := range 8 {
		if err := mem.Read(uint64(i), got); err != nil || got[0] != byte(i+1) {
			t.Fatalf("block %d: err %v, byte %d", i, err, got[0])
		}
	}
}

// Every backend call is timed into its namespace's latency histogram by
// the core; a grouped write counts once per write, timed by its commit,
// and the batching counters say how many commits the writes took.
func TestNamespaceLatencyAndBatching(t *testing.T) {
	mem := groupBackend(t)
	b := newIOBench(t, mem)
	g := b.tgt.NewGroup(16)
	defer g.Commit()
	buf := make([]byte, 4096)
	exec := func(r *target.Request) {
		t.Helper()
		n := b.ir.n
		b.io.Execute(r)
		g.Commit()
		if b.ir.n != n+1 || b.ir.last != nvme.StatusSuccess {
			t.Fatalf("opcode %#x: %d completions, %v", r.Cmd.Opcode, b.ir.n-n, b.ir.last)
		}
	}
	exec(&target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 1, 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf})
	exec(&target.Request{Cmd: ioCmd(nvme.IORead, 1, 1, 1, 0), Dir: nvme.DirCtrlToHost, Len: 4096, Data: buf})
	exec(&target.Request{Cmd: ioCmd(nvme.IOCompare, 1, 1, 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf})
	exec(&target.Request{Cmd: ioCmd(nvme.IOWriteZeroes, 1, 2, 1, 0)})
	// Three writes in one pass, then one alone: two commits.
	for i := range 3 {
		b.io.Execute(&target.Request{Cmd: ioCmd(nvme.IOWrite, 1, uint64(10+i), 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf, Group: g})
	}
	g.Commit()
	exec(&target.Request{Cmd: ioCmd(nvme.IOWrite, 1, 20, 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: buf, Group: g})

	st := b.tgt.Stats().Namespaces[0]
	if st.GroupedWrites != 4 || st.GroupCommits != 2 || st.Writes != 5 {
		t.Errorf("writes %d, grouped %d in %d commits; want 5, 4 in 2", st.Writes, st.GroupedWrites, st.GroupCommits)
	}
	for op, want := range map[target.LatencyOp]uint64{
		target.LatencyRead: 2, target.LatencyWrite: 5, target.LatencyWriteZeroes: 1,
		target.LatencyWriteFUA: 0, target.LatencyDeallocate: 0, target.LatencyFlush: 0,
	} {
		h := st.Latency[op]
		var sum uint64
		for _, n := range h.Buckets {
			sum += n
		}
		if h.Count != want || sum != want || (want > 0) != (h.Sum > 0) {
			t.Errorf("%s: count %d, buckets %d, sum %v; want %d calls", op, h.Count, sum, h.Sum, want)
		}
	}
}

// A group's writes are applied by Commit all together or not at all: the
// memory backend turned read-only between Add and Commit fails every
// pending write with Write Protect and applies none; a full group asks
// for a Commit (ErrGroupFull).
func TestMemWriteGroup(t *testing.T) {
	mem := groupBackend(t)
	mem.SetWriteGroups(2)
	b := newIOBench(t, mem)
	g := b.tgt.NewGroup(16)
	defer g.Commit()
	base := b.ir.n
	reqs := make([]*target.Request, 3)
	for i := range reqs {
		data := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		reqs[i] = &target.Request{Cmd: ioCmd(nvme.IOWrite, 1, uint64(i), 1, 0), Dir: nvme.DirHostToCtrl, Len: 4096, Data: data, Group: g}
		b.io.Execute(reqs[i])
	}
	// The third write found the backend's group full: the first two were
	// committed to make room.
	if n := b.ir.n - base; n != 2 || g.Pending() != 1 {
		t.Fatalf("after three writes into groups of two: %d completed, %d pending; want 2 and 1", n, g.Pending())
	}
	mem.SetReadOnly(true)
	g.Commit()
	if reqs[2].Rsp.Status != nvme.StatusNamespaceWriteProtect.WithDNR() {
		t.Fatalf("write committed after the backend became read-only: %v", reqs[2].Rsp.Status)
	}
	got := make([]byte, 4096)
	for i, want := range []byte{1, 2, 0} {
		if err := mem.Read(uint64(i), got); err != nil || got[0] != want {
			t.Fatalf("block %d: err %v, byte %d, want %d", i, err, got[0], want)
		}
	}
	if st := g.Stats(); st.Writes != 3 || st.Commits != 2 {
		t.Errorf("group stats %+v, want 3 writes in 2 commits", st)
	}

	// Straight on the backend: a refused write is refused at Add, a bad
	// one at Commit fails the whole group.
	mem.SetReadOnly(false)
	wg := mem.NewWriteGroup()
	if err := wg.Add(256, got); err == nil {
		t.Fatal("write past the end added")
	}
	if err := wg.Add(0, got[:100]); err == nil {
		t.Fatal("partial block added")
	}
	one := bytes.Repeat([]byte{9}, 4096)
	if err := wg.Add(4, one); err != nil {
		t.Fatal(err)
	}
	if err := wg.Add(250, one); err != nil {
		t.Fatal(err)
	}
	if err := wg.Add(5, one); err != target.ErrGroupFull {
		t.Fatalf("third write in a group of two: %v, want ErrGroupFull", err)
	}
	mem.Resize(200) // block 250 is gone before the commit
	if err := wg.Commit(); err == nil || wg.Len() != 0 {
		t.Fatalf("commit with a write past the new end: %v, %d left", err, wg.Len())
	}
	if err := mem.Read(4, got); err != nil || got[0] != 0 {
		t.Fatalf("block 4 after a failed commit: err %v, byte %d (a partial commit)", err, got[0])
	}
}

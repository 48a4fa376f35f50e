package nbd_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/nbd"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
	"github.com/cockroachdb/pebble/v2/vfs"
)

const (
	testSubNQN  = "nqn.2026-11.io.blk:nbd-test"
	testHostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"
)

// connectNamespace serves one 64 MiB volume (4 KiB blocks) from an
// in-process target on a soft adapter on loopback and connects the
// initiator to it (after target/rdma's newTestTarget and connectHost).
func connectNamespace(t *testing.T) *initiator.Namespace {
	t.Helper()
	ta, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ta.Close() })
	rcfg := rdma.Config{Addr: "127.0.0.1:0", Cores: 2}
	tgt, err := target.New(target.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tgt.Close() })
	// A thin volume of an extent store, pebble and the data area in
	// memory (the test writes a few clusters).
	st, err := store.Open(store.Config{FS: vfs.NewMem(), Dir: "/vol", Area: store.NewMemArea(8<<20, 512, 512),
		AreaMaxBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	vol, err := st.Create(1, store.CreateOptions{SizeBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tgt.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-nbd-1", Model: "blk nbd test", Hosts: []string{testHostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: target.StoreBackend(vol)}); err != nil {
		t.Fatal(err)
	}
	port, err := rdma.Listen(tgt, ta, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { port.Close() })

	ha, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ha.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, initiator.Config{Adapter: ha, HostNQN: testHostNQN, Queues: 2, QueueDepth: 32}, port.Addr().String(), testSubNQN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	ns := c.Namespace(1)
	if ns == nil {
		t.Fatal("namespace 1 not found")
	}
	return ns
}

// TestNamespace exports an initiator Namespace over NBD and drives it
// with the raw client: writes (one above MaxTransfer, split by the
// initiator; one with FUA), reads, flush, trim, write zeroes, range
// errors.
func TestNamespace(t *testing.T) {
	ns := connectNamespace(t)
	srv := newServer(t, nbd.NamespaceDevice(ns), nbd.Config{})
	cl, done := serve(t, srv)
	ei := cl.connect()
	if ei.size != 64<<20 || ei.minBS != 4096 || ei.flags != wantFlags {
		t.Fatalf("export: %+v", ei)
	}
	big := pattern(512<<10, 5) // 4 × the default 128 KiB MaxTransfer
	if errno, _ := cl.do(cmdWrite, 0, 1<<20, uint32(len(big)), big); errno != 0 {
		t.Fatalf("write: %d", errno)
	}
	small := pattern(8192, 11)
	if errno, _ := cl.do(cmdWrite, flagFUA, 0, 8192, small); errno != 0 {
		t.Fatalf("FUA write: %d", errno)
	}
	if errno, got := cl.do(cmdRead, 0, 1<<20, uint32(len(big)), nil); errno != 0 || !bytes.Equal(got, big) {
		t.Fatalf("read back: errno %d equal %v", errno, bytes.Equal(got, big))
	}
	if errno, got := cl.do(cmdRead, 0, 0, 8192, nil); errno != 0 || !bytes.Equal(got, small) {
		t.Fatalf("read back FUA write: errno %d", errno)
	}
	if errno, _ := cl.do(cmdFlush, 0, 0, 0, nil); errno != 0 {
		t.Fatalf("flush: %d", errno)
	}
	if errno, _ := cl.do(cmdWriteZeroes, flagNoHole, 1<<20, 64<<10, nil); errno != 0 {
		t.Fatalf("write zeroes: %d", errno)
	}
	if errno, got := cl.do(cmdRead, 0, 1<<20, 128<<10, nil); errno != 0 || !bytes.Equal(got, append(make([]byte, 64<<10), big[64<<10:128<<10]...)) {
		t.Fatalf("after write zeroes: errno %d", errno)
	}
	if errno, _ := cl.do(cmdTrim, 0, 2<<20, 1<<20, nil); errno != 0 {
		t.Fatalf("trim: %d", errno)
	}
	if errno, _ := cl.do(cmdWrite, 0, 64<<20, 4096, make([]byte, 4096)); errno != enospc {
		t.Fatalf("write past end: %d, want ENOSPC", errno)
	}
	if errno, _ := cl.do(cmdRead, 0, 64<<20-4096, 8192, nil); errno != einval {
		t.Fatalf("read past end: %d, want EINVAL", errno)
	}
	cl.disc(done)
	// Straight from the initiator: what NBD wrote is there.
	got := make([]byte, len(small))
	if _, err := ns.ReadAt(got, 0); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("initiator read: %v", err)
	}
}

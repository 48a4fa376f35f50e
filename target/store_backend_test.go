package target_test

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// storeFixture is a live controller whose namespace 1 is a store volume
// of blocks blocks of bs bytes, in a store on an in-memory filesystem and
// area of areaBytes (16 KiB clusters, the area bounded: no growth).
type storeFixture struct {
	h         *harness
	store     *store.Store
	vol       *store.Volume
	sub       *target.Subsystem
	admin, io *tq
}

func newStoreFixture(t *testing.T, bs uint32, blocks uint64, areaBytes int64) *storeFixture {
	t.Helper()
	return newStoreFixtureOn(t, vfs.NewMem(), bs, blocks, areaBytes)
}

// newStoreFixtureOn is newStoreFixture with pebble on fs.
func newStoreFixtureOn(t *testing.T, fs vfs.FS, bs uint32, blocks uint64, areaBytes int64) *storeFixture {
	t.Helper()
	s, err := store.Open(store.Config{Dir: "/store", FS: fs, Area: store.NewMemArea(areaBytes, 512, 512),
		AreaMaxBytes: areaBytes, ClusterBytes: 16 << 10, ReadyClusters: 4, Logger: quietLogger{},
		MemTableBytes: 1 << 20, CacheBytes: 8 << 20, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	v, err := s.Create(1, store.CreateOptions{SizeBytes: blocks * uint64(bs), BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	sub, admin, io, _ := h.serve(target.NamespaceConfig{NSID: 1, Backend: target.StoreBackend(v)})
	return &storeFixture{h: h, store: s, vol: v, sub: sub, admin: admin, io: io}
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>12)
	}
	return b
}

// TestStoreIO runs every NVM command against a real store volume and
// checks the volume's contents and counters directly.
func TestStoreIO(t *testing.T) {
	for _, bs := range []uint32{4096, 512} {
		t.Run(map[uint32]string{4096: "4k", 512: "512"}[bs], func(t *testing.T) {
			f := newStoreFixture(t, bs, 256, 4<<20)
			h := f.h
			b := int(bs)
			c := h.exec(f.admin, identifyCmd(nvme.CNSNamespace, 1), make([]byte, 4096))
			mustOK(t, c, "identify")
			var id nvme.IdentifyNamespace
			_ = id.Unmarshal(c.data)
			if id.NSZE != 256 || id.BlockSize() != bs {
				t.Fatalf("identify: nsze %d block size %d", id.NSZE, id.BlockSize())
			}

			w := pattern(8*b, 1)
			mustOK(t, h.exec(f.io, ioCmd(nvme.IOWrite, 1, 16, 8, 0), w), "write")
			fua := pattern(2*b, 9)
			mustOK(t, h.exec(f.io, ioCmd(nvme.IOWrite, 1, 24, 2, nvme.RWFUA), fua), "FUA write")
			got := make([]byte, 10*b)
			if err := f.vol.Read(16, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:8*b], w) || !bytes.Equal(got[8*b:], fua) {
				t.Fatal("volume does not hold what was written")
			}
			c = h.exec(f.io, ioCmd(nvme.IORead, 1, 16, 10, 0), make([]byte, 10*b))
			mustOK(t, c, "read")
			if !bytes.Equal(c.data, got) {
				t.Fatal("read back differs")
			}
			mustOK(t, h.exec(f.io, ioCmd(nvme.IOCompare, 1, 16, 8, 0), w), "compare equal")
			if s := h.exec(f.io, ioCmd(nvme.IOCompare, 1, 17, 8, 0), w).status(); s != nvme.StatusCompareFailure.WithDNR() {
				t.Fatalf("compare differing: %s", fmtStatus(s))
			}
			mustOK(t, h.exec(f.io, ioCmd(nvme.IOCompare, 1, 200, 4, 0), make([]byte, 4*b)), "compare unwritten with zeros")
			mustOK(t, h.exec(f.io, nvme.Command{Opcode: uint8(nvme.IOFlush), Flags: nvme.FlagSGLMetaBuf, NSID: 1}, nil), "flush")

			mustOK(t, h.exec(f.io, ioCmd(nvme.IOWriteZeroes, 1, 16, 2, 0), nil), "write zeroes")
			mustOK(t, h.exec(f.io, ioCmd(nvme.IOWriteZeroes, 1, 18, 2, nvme.RWDEAC), nil), "write zeroes DEAC")
			mustOK(t, h.exec(f.io, ioCmd(nvme.IOWriteZeroes, 1, 20, 1, nvme.RWFUA), nil), "write zeroes FUA")
			dsm := make([]byte, 4096)
			(&nvme.DSMRange{SLBA: 22, NLB: 2}).Marshal((*[16]byte)(dsm))
			(&nvme.DSMRange{SLBA: 25, NLB: 1}).Marshal((*[16]byte)(dsm[16:]))
			mustOK(t, h.exec(f.io, nvme.Command{Opcode: uint8(nvme.IODatasetManagement), Flags: nvme.FlagSGLMetaBuf,
				NSID: 1, CDW10: 1, CDW11: nvme.DSMAD}, dsm), "dsm")
			if err := f.vol.Read(16, got); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, 10*b)
			copy(want[5*b:], w[5*b:6*b]) // block 21
			copy(want[8*b:], fua[:b])    // block 24
			if !bytes.Equal(got, want) {
				t.Fatal("zeroed blocks differ")
			}
			// A whole cluster deallocated is released (and reads zeros).
			cl := uint64(16<<10) / uint64(bs)
			mustOK(t, h.exec(f.io, ioCmd(nvme.IOWrite, 1, 2*cl, uint32(cl), 0), pattern(int(cl)*b, 5)), "write a cluster")
			before := f.vol.Stats().AllocatedBytes
			mustOK(t, h.exec(f.io, ioCmd(nvme.IOWriteZeroes, 1, 2*cl, uint32(cl), nvme.RWDEAC), nil), "deallocate a cluster")
			if after := f.vol.Stats().AllocatedBytes; after != before-16<<10 {
				t.Fatalf("allocated %d bytes after freeing a cluster, %d before", after, before)
			}

			st := f.vol.Stats()
			var ns target.NamespaceStats
			for _, n := range h.tgt.Stats().Namespaces {
				ns = n
			}
			if ns.Writes != st.Writes || ns.FUAWrites != st.FUAWrites || ns.WriteBytes != st.WriteBytes ||
				ns.Flushes != st.Flushes || ns.WriteZeroes != st.WriteZeroes {
				t.Errorf("target counters %+v disagree with the store's %+v", ns, st)
			}
			// Deallocates: DEAC write-zeroes, the DSM, the cluster's.
			if ns.Deallocates != 3 || ns.DeallocatedBlocks != 5+cl || ns.Reads != 1 || ns.Compares != 2 || ns.Errors != 1 {
				t.Errorf("counters %+v", ns)
			}
		})
	}
}

// TestStoreStates: the store's refusals and state changes reach the host
// with the statuses store/errors.go names: write protection (the volume
// says so before the target has noticed; Identify then shows it and an
// AER tells the host), capacity exceeded (ENOSPC at a Linux host) while
// overwrites go on, growth, deletion, closing.
func TestStoreStates(t *testing.T) {
	// An area of 8 clusters of 16 KiB: the header's, and 7 for data.
	f := newStoreFixture(t, 4096, 1024, 8*16<<10)
	h := f.h
	data := pattern(4096, 3)
	aer, done := h.execMayHold(f.admin, adminCmd(nvme.AdminAsyncEvent), nil)
	if done {
		t.Fatal("AER completed")
	}

	if err := f.store.SetState(1, store.StateReadOnly); err != nil {
		t.Fatal(err)
	}
	if s := h.exec(f.io, ioCmd(nvme.IOWrite, 1, 0, 1, 0), data).status(); s != nvme.StatusNamespaceWriteProtect.WithDNR() {
		t.Fatalf("write to read-only volume: %s", fmtStatus(s))
	}
	c := h.exec(f.admin, identifyCmd(nvme.CNSNamespace, 1), make([]byte, 4096))
	var id nvme.IdentifyNamespace
	_ = id.Unmarshal(c.data)
	if id.NSATTR != nvme.NSAttrRO {
		t.Fatalf("NSATTR %#x", id.NSATTR)
	}
	aer.wait(t)
	if aer.dw0() != nvme.AsyncEventResult(nvme.AERTypeNotice, nvme.AERNoticeNS, nvme.LogChangedNSList) {
		t.Fatalf("AER dw0 %#x", aer.dw0())
	}
	if err := f.store.SetState(1, store.StateOnline); err != nil {
		t.Fatal(err)
	}
	if err := f.sub.RevalidateNamespace(1); err != nil {
		t.Fatal(err)
	}

	// Fill the area: one block in each cluster of the volume until the
	// store has none left, which the host sees as Capacity Exceeded.
	const perCluster = 4 // 16 KiB clusters of 4 KiB blocks
	var full bool
	var lba uint64
	for ; lba < 1024; lba += perCluster {
		s := h.exec(f.io, ioCmd(nvme.IOWrite, 1, lba, 1, 0), data).status()
		if s == nvme.StatusCapacityExceeded.WithDNR() {
			full = true
			break
		}
		if s != nvme.StatusSuccess {
			t.Fatalf("write at %d: %s", lba, fmtStatus(s))
		}
	}
	if !full || lba == 0 {
		t.Fatalf("area never full (stopped at lba %d)", lba)
	}
	// Overwrites of allocated clusters go on.
	mustOK(t, h.exec(f.io, ioCmd(nvme.IOWrite, 1, 1, 1, nvme.RWFUA), data), "overwrite in an allocated cluster")

	// Grown: RevalidateNamespace picks the new size up.
	if err := f.store.Resize(1, 2048*4096, false); err != nil {
		t.Fatal(err)
	}
	if err := f.sub.RevalidateNamespace(1); err != nil {
		t.Fatal(err)
	}
	c = h.exec(f.admin, identifyCmd(nvme.CNSNamespace, 1), make([]byte, 4096))
	_ = id.Unmarshal(c.data)
	if id.NSZE != 2048 {
		t.Fatalf("NSZE %d after growing to 2048 blocks", id.NSZE)
	}
	// The grown range is addressable (and unwritten: zeros).
	c = h.exec(f.io, ioCmd(nvme.IORead, 1, 2047, 1, 0), make([]byte, 4096))
	mustOK(t, c, "read in the grown range")
	if !bytes.Equal(c.data, make([]byte, 4096)) {
		t.Fatal("the grown range does not read zeros")
	}

	// Deleted: Invalid Namespace.
	if err := f.store.Delete(1); err != nil {
		t.Fatal(err)
	}
	if s := h.exec(f.io, ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096)).status(); s != nvme.StatusInvalidNamespace.WithDNR() {
		t.Fatalf("read of a deleted volume: %s", fmtStatus(s))
	}
	// Store closed: Namespace Not Ready, retryable.
	v2, err := f.store.Create(2, store.CreateOptions{SizeBytes: 64 * 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.sub.AddNamespace(target.NamespaceConfig{NSID: 2, Backend: target.StoreBackend(v2)}); err != nil {
		t.Fatal(err)
	}
	_ = f.store.Close()
	if s := h.exec(f.io, ioCmd(nvme.IORead, 2, 0, 1, 0), make([]byte, 4096)).status(); s != nvme.StatusNamespaceNotReady {
		t.Fatalf("read of a closed store: %s", fmtStatus(s))
	}
}

// TestStoreWALFault: once the disk fails pebble's WAL, a FUA write is a
// Write Fault, a flush an Internal Error, and every later read an
// Unrecovered Read Error (the store stays failed), all with DNR; each
// error is logged and counted.
func TestStoreWALFault(t *testing.T) {
	var on atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !on.Load() || !strings.HasSuffix(op.Path, ".log") {
			return nil
		}
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo, errorfs.OpFileFlush,
			errorfs.OpFileWrite, errorfs.OpFileWriteAt:
			return errorfs.ErrInjected
		}
		return nil
	}))
	f := newStoreFixtureOn(t, fs, 4096, 256, 4<<20)
	h := f.h
	data := pattern(4096, 5)
	mustOK(t, h.exec(f.io, ioCmd(nvme.IOWrite, 1, 0, 1, 0), data), "write before the fault")
	on.Store(true)
	if s := h.exec(f.io, ioCmd(nvme.IOWrite, 1, 1, 1, nvme.RWFUA), data).status(); s != nvme.StatusWriteFault.WithDNR() {
		t.Fatalf("FUA write: %s", fmtStatus(s))
	}
	if s := h.exec(f.io, nvme.Command{Opcode: uint8(nvme.IOFlush), Flags: nvme.FlagSGLMetaBuf, NSID: 1}, nil).status(); s != nvme.StatusInternalError.WithDNR() {
		t.Fatalf("flush: %s", fmtStatus(s))
	}
	if s := h.exec(f.io, ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096)).status(); s != nvme.StatusUnrecoveredReadError.WithDNR() {
		t.Fatalf("read of a failed store: %s", fmtStatus(s))
	}
	if s := h.exec(f.io, ioCmd(nvme.IOWriteZeroes, 1, 0, 1, 0), nil).status(); s != nvme.StatusWriteFault.WithDNR() {
		t.Fatalf("write zeroes on a failed store: %s", fmtStatus(s))
	}
	if f.store.Health() == nil {
		t.Fatal("the store is not failed")
	}
	c := h.exec(f.admin, getLogCmd(nvme.LogSMART, nvme.NSIDAll, 512, 0, false), make([]byte, 512))
	var sl nvme.SMARTLog
	_ = sl.Unmarshal(c.data)
	if sl.NumErrLogEntries.Lo != 4 {
		t.Fatalf("error log entries %d", sl.NumErrLogEntries.Lo)
	}
	for _, n := range h.tgt.Stats().Namespaces {
		if n.Errors != 4 {
			t.Fatalf("namespace errors %d", n.Errors)
		}
	}
}

// TestStoreTryGeometry: while a Deallocate waits for a direct read in
// flight (the volume pinned, as a poll group's engine pins it), the
// asynchronous adapter's TryGeometry — what Identify Namespace asks on a
// poll group — answers "busy" at once instead of queueing behind the
// Deallocate, which only that poll group's reaping of the read would let
// go on: the deadlock a host's Identify during a Deallocate used to make.
// Once the read ends, the Deallocate completes and TryGeometry answers.
func TestStoreTryGeometry(t *testing.T) {
	s, err := store.Open(store.Config{Dir: "/store", FS: vfs.NewMem(), Area: store.NewMemArea(1<<20, 512, 512),
		AreaMaxBytes: 1 << 20, ClusterBytes: 16 << 10, Logger: quietLogger{}, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, err := s.Create(1, store.CreateOptions{SizeBytes: 256 << 10, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Write(0, pattern(16<<10, 3), 0); err != nil {
		t.Fatal(err)
	}
	sio, err := target.NewStoreIO(s, target.StoreIOConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer sio.Close()
	gt, ok := sio.Backend(v).(target.GeometryTrier)
	if !ok {
		t.Fatal("the store's asynchronous backend is no GeometryTrier")
	}
	if g, ok, err := gt.TryGeometry(); !ok || err != nil || g.Blocks != 64 || g.BlockSize != 4096 {
		t.Fatalf("TryGeometry = %+v, %v, %v; want 64 blocks of 4096", g, ok, err)
	}
	raw := make([]byte, 2*store.DirectAlign)
	off := store.DirectAlign - int(uintptr(unsafe.Pointer(&raw[0]))%store.DirectAlign)
	buf := raw[off%store.DirectAlign:][:store.DirectAlign]
	segs := make([]store.Segment, 4)
	if _, k, err := v.BeginDirect(false, 0, buf, segs); k != store.DirectIO || err != nil {
		t.Fatalf("BeginDirect = %v, %v; want a direct read", k, err)
	}
	dealloc := make(chan error, 1)
	go func() { dealloc <- v.Deallocate(0, 4) }()
	// The Deallocate holds the lock wanted: TryInfo sees it.
	deadline := time.Now().Add(10 * time.Second)
	for _, ok, _ := v.TryInfo(); ok; _, ok, _ = v.TryInfo() {
		if time.Now().After(deadline) {
			t.Fatal("the Deallocate never waited for the direct read")
		}
		time.Sleep(100 * time.Microsecond)
	}
	answered := make(chan bool, 1)
	go func() {
		_, ok, _ := gt.TryGeometry()
		answered <- ok
	}()
	select {
	case ok := <-answered:
		if ok {
			t.Fatal("TryGeometry answered while a Deallocate held the volume")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("TryGeometry waited for the Deallocate (which waits for the read it blocks)")
	}
	if err := v.EndDirect(false, 0, len(buf), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-dealloc; err != nil {
		t.Fatal(err)
	}
	if _, ok, err := gt.TryGeometry(); !ok || err != nil {
		t.Fatalf("TryGeometry after the Deallocate: %v, %v", ok, err)
	}
}

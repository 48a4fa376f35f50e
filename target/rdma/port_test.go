package rdma_test

import (
	"bytes"
	"math/rand"
	"path/filepath"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

const (
	testSubNQN  = "nqn.2026-11.io.blk:test"
	testHostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"
)

type testTarget struct {
	t     *target.Target
	port  *rdma.Port
	store *store.Store
	vol   *store.Volume
	sio   *target.StoreIO
	sub   *target.Subsystem
	addr  string
}

// newTestTarget serves one subsystem with one 64 MiB namespace (4 KiB
// blocks, a volume of an extent store in a temporary directory, served
// through a StoreIO as blkd serves it) on a soft adapter on loopback.
func newTestTarget(t testing.TB, cfg rdma.Config) *testTarget {
	t.Helper()
	return newTestTargetOn(t, cfg, soft.Config{})
}

// newTestTargetOn is newTestTarget on a soft adapter of the given
// configuration.
func newTestTargetOn(t testing.TB, cfg rdma.Config, sc soft.Config) *testTarget {
	t.Helper()
	a, err := soft.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Cores == 0 {
		cfg.Cores = 2
	}
	// No Config.Limits: the port brings its own with every queue.
	tt := &testTarget{}
	if tt.t, err = target.New(target.Config{}); err != nil {
		t.Fatal(err)
	}
	// A thin volume on an O_DIRECT area file that grows as it fills.
	if tt.store, err = store.Open(store.Config{Dir: filepath.Join(t.TempDir(), "vol"), AreaBytes: 16 << 20,
		Logger: quietLogger{}}); err != nil {
		t.Fatal(err)
	}
	if tt.vol, err = tt.store.Create(1, store.CreateOptions{SizeBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	if tt.sio, err = target.NewStoreIO(tt.store, target.StoreIOConfig{}); err != nil {
		t.Fatal(err)
	}
	if tt.sub, err = tt.t.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-test-1", Model: "blk test", Hosts: []string{testHostNQN}}); err != nil {
		t.Fatal(err)
	}
	if err = tt.sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: tt.sio.Backend(tt.vol)}); err != nil {
		t.Fatal(err)
	}
	if tt.port, err = rdma.Listen(tt.t, a, cfg); err != nil {
		t.Fatal(err)
	}
	tt.addr = tt.port.Addr().String()
	t.Cleanup(func() {
		tt.port.Close()
		tt.t.Close()
		tt.sio.Close()
		if err := tt.store.Close(); err != nil {
			t.Error(err)
		}
		a.Close()
	})
	return tt
}

func TestRejectsBadPrivateData(t *testing.T) {
	tt := newTestTarget(t, rdma.Config{})
	for _, tc := range []struct {
		name string
		cm   nvme.RDMACMRequest
		want nvme.RDMACMRejectStatus
	}{
		{"recfmt", nvme.RDMACMRequest{RecFmt: 1, HRQSize: 32, HSQSize: 31}, nvme.RDMACMInvalidRecFmt},
		{"admin too deep", nvme.RDMACMRequest{HRQSize: 64, HSQSize: 63}, nvme.RDMACMInvalidHSQSize},
		{"io too deep", nvme.RDMACMRequest{QID: 1, HRQSize: 1024, HSQSize: 1023}, nvme.RDMACMInvalidHSQSize},
		{"sqsize zero", nvme.RDMACMRequest{QID: 1, HRQSize: 1, HSQSize: 0}, nvme.RDMACMInvalidHSQSize},
		{"hrqsize short", nvme.RDMACMRequest{QID: 1, HRQSize: 16, HSQSize: 31}, nvme.RDMACMInvalidHRQSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dialRaw(t, tt.addr, tc.cm)
			got, ok := rejectStatus(err)
			if !ok || got != tc.want {
				t.Fatalf("connect error %v (reject status %v, %v), want reject %v", err, got, ok, tc.want)
			}
		})
	}
	if s := tt.port.Stats(); s.Rejects != 5 {
		t.Errorf("rejects counted %d, want 5", s.Rejects)
	}
}

// TestRawHostAdminAndIO drives the binding with the bare host: admin
// Connect with its data fetched by RDMA READ and answered with Send with
// Invalidate, enable, an I/O queue, a write in the capsule, a write
// fetched by RDMA READ, reads placed by RDMA WRITE, and the binding's own
// refusals of data descriptors.
func TestRawHostAdminAndIO(t *testing.T) {
	tt := newTestTarget(t, rdma.Config{})
	adm, err := dialRaw(t, tt.addr, nvme.RDMACMRequest{HRQSize: 32, HSQSize: 31})
	if err != nil {
		t.Fatal(err)
	}
	rsp := adm.connect(0, 31, 5000, 0xFFFF, testSubNQN, testHostNQN)
	if rsp.Status != nvme.StatusSuccess {
		t.Fatalf("admin connect: status %v", rsp.Status)
	}
	cntlid := nvme.ConnectResponseCNTLID(rsp.DW0)
	if cntlid == 0 || cntlid > 0xFFEF {
		t.Fatalf("CNTLID %#x", cntlid)
	}
	prop := func(set bool, off uint32, size8 bool, val uint64) nvme.Completion {
		pc := nvme.PropertyCommand{Set: set, Offset: off, Size8: size8, Value: val}
		var cmd nvme.Command
		pc.Encode(&cmd)
		cmd.DPTR = nvme.KeyedSGL(0, 0, 0, false)
		r, _ := adm.exchange(cmd, nil)
		return r
	}
	if r := prop(false, nvme.PropCAP, true, 0); r.Status != 0 || nvme.CAP(r.Result64()).MQES() != rdma.DefaultQueueEntries-1 {
		t.Fatalf("CAP: status %v, MQES %d", r.Status, nvme.CAP(r.Result64()).MQES())
	}
	if r := prop(true, nvme.PropCC, false, 0x00460001); r.Status != 0 {
		t.Fatalf("CC.EN: %v", r.Status)
	}
	if r := prop(false, nvme.PropCSTS, false, 0); r.Status != 0 || !nvme.CSTS(r.DW0).RDY() {
		t.Fatalf("CSTS: status %v value %#x", r.Status, r.DW0)
	}
	// Identify controller, placed by RDMA WRITE, answered with Send with
	// Invalidate of the 0x4F key.
	idCmd := nvme.Command{Opcode: uint8(nvme.AdminIdentify), Flags: 0x40, CDW10: 1}
	idCmd.DPTR = adm.fastKeyed(4096, 4096)
	r, comp := adm.exchange(idCmd, nil)
	if r.Status != 0 {
		t.Fatalf("identify: %v", r.Status)
	}
	if !comp.Invalidated || comp.InvalidatedKey != idCmd.DPTR.Key {
		t.Errorf("identify response: invalidated %v key %#x, want the 0x4F key %#x", comp.Invalidated, comp.InvalidatedKey, idCmd.DPTR.Key)
	}
	id := adm.data.Bytes()[4096 : 4096+4096]
	if got := uint16(id[78]) | uint16(id[79])<<8; got != cntlid {
		t.Errorf("identify CNTLID %#x, want %#x", got, cntlid)
	}
	if ioccsz := uint32(id[1792]) | uint32(id[1793])<<8; ioccsz != (64+rdma.DefaultInCapsule)/16 {
		t.Errorf("IOCCSZ %d", ioccsz)
	}
	// MDTS for the default 1 MiB; MAXCMD = CAP.MQES + 1, so a host's
	// queue is clamped by neither more than by the other.
	if mdts := id[77]; 4096<<mdts != rdma.DefaultMaxTransfer {
		t.Errorf("MDTS %d", mdts)
	}
	if maxcmd := uint16(id[514]) | uint16(id[515])<<8; maxcmd != rdma.DefaultQueueEntries {
		t.Errorf("MAXCMD %d, want MQES+1 = %d", maxcmd, rdma.DefaultQueueEntries)
	}
	// Bad descriptors, refused by the binding itself.
	bad := idCmd
	bad.DPTR = nvme.SGL{ID: 0x20, Length: 4096}
	if r, _ := adm.exchange(bad, nil); r.Status != nvme.StatusSGLInvalidType|nvme.StatusDNR {
		t.Errorf("segment SGL: status %v", r.Status)
	}
	bad.DPTR = adm.keyed(0, 2*rdma.DefaultMaxTransfer)
	if r, _ := adm.exchange(bad, nil); r.Status != nvme.StatusSGLInvalidDataLength|nvme.StatusDNR {
		t.Errorf("transfer above MaxTransfer: status %v", r.Status)
	}

	// Set Features number of queues, then an I/O queue.
	nq := nvme.Command{Opcode: uint8(nvme.AdminSetFeatures), Flags: 0x40, CDW10: 0x07, CDW11: 0}
	nq.DPTR = nvme.KeyedSGL(0, 0, 0, false)
	if r, _ := adm.exchange(nq, nil); r.Status != 0 {
		t.Fatalf("set features queues: %v", r.Status)
	}
	// Interrupt Coalescing maps onto the engine's moderation: THR 7 →
	// 8 completions, TIME 2 → 200 µs, applied by a core at its next
	// notification.
	ic := nvme.Command{Opcode: uint8(nvme.AdminSetFeatures), Flags: 0x40, CDW10: 0x08, CDW11: 2<<8 | 7}
	ic.DPTR = nvme.KeyedSGL(0, 0, 0, false)
	if r, _ := adm.exchange(ic, nil); r.Status != 0 {
		t.Fatalf("set features interrupt coalescing: %v", r.Status)
	}
	prop(false, nvme.PropCSTS, false, 0) // a notification to apply it on
	applied := false
	for _, c := range tt.port.Engine().Cores() {
		if m := c.Stats().Moderation; m.Interval == 200 && m.Count == 8 {
			applied = true
		}
	}
	if !applied {
		t.Errorf("interrupt coalescing THR 7 TIME 2 not applied to any core's moderation")
	}
	io, err := dialRaw(t, tt.addr, nvme.RDMACMRequest{QID: 1, HRQSize: 32, HSQSize: 31, CNTLID: cntlid})
	if err != nil {
		t.Fatal(err)
	}
	if r := io.connect(1, 31, 0, cntlid, testSubNQN, testHostNQN); r.Status != 0 {
		t.Fatalf("I/O connect: %v", r.Status)
	}
	pattern := func(seed byte, n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = seed + byte(i*7)
		}
		return b
	}
	// One block in the capsule.
	w := nvme.Command{Opcode: uint8(nvme.IOWrite), Flags: 0x40, NSID: 1, CDW10: 3, CDW12: 0}
	blk := pattern(1, 4096)
	w.DPTR = nvme.InCapsuleSGL(0, 4096)
	if r, _ := io.exchange(w, blk); r.Status != 0 {
		t.Fatalf("in-capsule write: %v", r.Status)
	}
	// Eight blocks fetched by RDMA READ.
	big := pattern(9, 8*4096)
	copy(io.data.Bytes()[65536:], big)
	w = nvme.Command{Opcode: uint8(nvme.IOWrite), Flags: 0x40, NSID: 1, CDW10: 8, CDW12: 7}
	w.DPTR = io.keyed(65536, uint32(len(big)))
	if r, _ := io.exchange(w, nil); r.Status != 0 {
		t.Fatalf("keyed write: %v", r.Status)
	}
	// Read both back by RDMA WRITE.
	rd := nvme.Command{Opcode: uint8(nvme.IORead), Flags: 0x40, NSID: 1, CDW10: 3, CDW12: 8}
	rd.DPTR = io.keyed(262144, 9*4096)
	if r, _ := io.exchange(rd, nil); r.Status != 0 {
		t.Fatalf("read: %v", r.Status)
	}
	got := io.data.Bytes()[262144 : 262144+9*4096]
	if !bytes.Equal(got[:4096], blk) || !bytes.Equal(got[5*4096:], big[4*4096:]) {
		t.Fatal("read back differs from what was written")
	}
	// Compare: the block just written matches, a changed copy does not.
	cmp := nvme.Command{Opcode: uint8(nvme.IOCompare), Flags: 0x40, NSID: 1, CDW10: 3, CDW12: 0}
	cmp.DPTR = nvme.InCapsuleSGL(0, 4096)
	if r, _ := io.exchange(cmp, blk); r.Status != 0 {
		t.Errorf("compare of equal data: status %v", r.Status)
	}
	changed := append([]byte(nil), blk...)
	changed[4095] ^= 1
	if r, _ := io.exchange(cmp, changed); r.Status&^nvme.StatusDNR != nvme.StatusCompareFailure {
		t.Errorf("compare of different data: status %v, want Compare Failure", r.Status)
	}
	// An in-capsule write larger than the in-capsule size.
	w = nvme.Command{Opcode: uint8(nvme.IOWrite), Flags: 0x40, NSID: 1, CDW10: 0, CDW12: 1}
	w.DPTR = nvme.InCapsuleSGL(0, 8192)
	if r, _ := io.exchange(w, pattern(3, 4096)); r.Status != nvme.StatusSGLInvalidOffset|nvme.StatusDNR {
		t.Errorf("oversized in-capsule write: status %v", r.Status)
	}
	// In-capsule data on a read.
	rd.DPTR = nvme.InCapsuleSGL(0, 4096)
	if r, _ := io.exchange(rd, make([]byte, 4096)); r.Status != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Errorf("in-capsule read: status %v", r.Status)
	}
	s := tt.port.Stats()
	if s.InCapsuleWrites != 3 || s.RDMAReads < 3 || s.RDMAWrites < 2 {
		t.Errorf("stats %+v", s)
	}
}

// TestKeepAliveExpiryDisconnects connects a raw host with a 1 s KATO that
// never sends Keep Alive: the target must tear the controller down and
// drop both the admin and the I/O queue's connection.
func TestKeepAliveExpiryDisconnects(t *testing.T) {
	tt := newTestTarget(t, rdma.Config{})
	adm, err := dialRaw(t, tt.addr, nvme.RDMACMRequest{HRQSize: 32, HSQSize: 31})
	if err != nil {
		t.Fatal(err)
	}
	rsp := adm.connect(0, 31, 1000, 0xFFFF, testSubNQN, testHostNQN)
	if rsp.Status != 0 {
		t.Fatalf("connect: %v", rsp.Status)
	}
	cntlid := nvme.ConnectResponseCNTLID(rsp.DW0)
	io, err := dialRaw(t, tt.addr, nvme.RDMACMRequest{QID: 1, HRQSize: 32, HSQSize: 31, CNTLID: cntlid})
	if err != nil {
		t.Fatal(err)
	}
	if r := io.connect(1, 31, 0, cntlid, testSubNQN, testHostNQN); r.Status != 0 {
		t.Fatalf("I/O connect: %v", r.Status)
	}
	for name, h := range map[string]*rawHost{"admin": adm, "io": io} {
		select {
		case <-h.qp.Done():
		case <-time.After(15 * time.Second):
			t.Fatalf("%s queue still connected 15 s after a 1 s keep-alive timeout", name)
		}
	}
}

// TestRandomCapsules sends seeded random capsules — random opcodes, flags,
// namespaces and fields, and data descriptors of every kind, valid keys
// and invalid ones — on a live admin and I/O queue. Every capsule must be
// answered with a status, or end the connection (a descriptor naming
// memory the host never registered, or asking to invalidate a key that
// cannot be invalidated, makes the RDMA operation fail, which iWARP
// reports by terminating the connection); never a hang or a crash.
// Afterwards the target still serves a new host normally.
func TestRandomCapsules(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewSource(seed))
	tt := newTestTarget(t, rdma.Config{})
	answered, dropped := 0, 0
	for round := 0; round < 6; round++ {
		adm, err := dialRaw(t, tt.addr, nvme.RDMACMRequest{HRQSize: 32, HSQSize: 31})
		if err != nil {
			t.Fatal(err)
		}
		rsp := adm.connect(0, 31, 0, 0xFFFF, testSubNQN, testHostNQN)
		cntlid := nvme.ConnectResponseCNTLID(rsp.DW0)
		en := nvme.PropertyCommand{Set: true, Offset: nvme.PropCC, Value: 0x00460001}
		var cmd nvme.Command
		en.Encode(&cmd)
		adm.exchange(cmd, nil)
		nq := nvme.Command{Opcode: uint8(nvme.AdminSetFeatures), Flags: 0x40, CDW10: 0x07}
		adm.exchange(nq, nil)
		io, err := dialRaw(t, tt.addr, nvme.RDMACMRequest{QID: 1, HRQSize: 32, HSQSize: 31, CNTLID: cntlid})
		if err != nil {
			t.Fatal(err)
		}
		io.connect(1, 31, 0, cntlid, testSubNQN, testHostNQN)
		for i := 0; i < 200; i++ {
			h := adm
			if rng.Intn(2) == 0 {
				h = io
			}
			var c nvme.Command
			c.Opcode = uint8(rng.Intn(256))
			if rng.Intn(4) == 0 {
				c.Opcode = []uint8{0x00, 0x01, 0x02, 0x05, 0x08, 0x09, 0x7F, 0x06, 0x0A, 0x18}[rng.Intn(10)]
			}
			c.Flags = []uint8{0x40, 0x40, 0x40, 0x00, 0x80, uint8(rng.Intn(256))}[rng.Intn(6)]
			c.NSID = []uint32{1, 1, 0, 2, 0xFFFFFFFF, rng.Uint32()}[rng.Intn(6)]
			c.CDW10, c.CDW11, c.CDW12 = rng.Uint32()%64, rng.Uint32()%4, rng.Uint32()%64
			if rng.Intn(3) == 0 {
				c.CDW10, c.CDW11, c.CDW12 = rng.Uint32(), rng.Uint32(), rng.Uint32()
			}
			var data []byte
			n := uint32([]int{0, 512, 4096, 8192, 65536, rng.Intn(1 << 17)}[rng.Intn(6)])
			switch k := rng.Intn(20); {
			case k == 0:
				c.DPTR = nvme.KeyedSGL(rng.Uint64(), n, rng.Uint32(), rng.Intn(2) == 0) // memory never registered
			case k < 7:
				c.DPTR = h.keyed(0, n)
			case k < 12:
				c.DPTR = nvme.InCapsuleSGL(uint64(rng.Intn(3))*16, n%8192)
				data = make([]byte, min(int(n%8192)+32, 4096))
			case k < 16:
				c.DPTR = nvme.SGL{ID: uint8(rng.Intn(256)), Addr: rng.Uint64(), Length: n, Key: rng.Uint32()}
				if c.DPTR.Keyed() {
					// Keyed descriptors name registered memory here, and
					// never ask to invalidate the static key (a host
					// that did would lose its own buffer: case 0).
					c.DPTR.ID = nvme.SGLIDKeyed
					c.DPTR.Addr, c.DPTR.Key = h.data.Addr(), h.data.RKey()
				}
			default:
				c.DPTR = nvme.KeyedSGL(0, 0, 0, false)
			}
			if _, _, err := h.tryExchange(c, data); err != nil {
				select {
				case <-h.qp.Done():
				case <-time.After(10 * time.Second):
					t.Fatalf("capsule %d (%s): %v, and the connection did not end", i, describe(c), err)
				}
				dropped++
				t.Logf("round %d: capsule %d (%s, SGL %#x len %d) ended the connection: %v", round, i, describe(c), c.DPTR.ID, c.DPTR.Length, err)
				break
			}
			answered++
		}
		adm.close()
		io.close()
	}
	t.Logf("%d capsules answered, %d connections ended by a bad transfer", answered, dropped)
	// The target is still healthy.
	c := connectHost(t, tt.addr, initiator.Config{Queues: 1})
	buf := make([]byte, 4096)
	if _, err := c.Namespace(1).ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
}

// TestReadSinkKeyDies: on iWARP a host sees the key of the target's sink
// in every RDMA READ request (the read response is a tagged write into
// it). A host that keeps that key and writes to it after its command
// finished is refused, its connection terminated, and the target serves
// the next host's data intact. Both ways the soft provider can run: read
// sinks that need only local write (the default, as siw: the data buffers
// lend no remote right at all) and strict sinks (each READ's sink
// fast-registered for that READ alone, ReadSinkPerRead). Before either,
// the buffer pool was remotely writable and this write landed.
func TestReadSinkKeyDies(t *testing.T) {
	for _, tc := range []struct {
		strict bool
		want   rdma.ReadSink
	}{{false, rdma.ReadSinkLocal}, {true, rdma.ReadSinkPerRead}} {
		t.Run(tc.want.String(), func(t *testing.T) { testReadSinkKeyDies(t, tc.strict, tc.want) })
	}
}

func testReadSinkKeyDies(t *testing.T, strict bool, want rdma.ReadSink) {
	tt := newTestTargetOn(t, rdma.Config{}, soft.Config{StrictReadSink: strict})
	if got := tt.port.Sizing().ReadSink; got != want {
		t.Fatalf("soft provider (strict %v): read sink %v, want %v", strict, got, want)
	}
	type sink struct {
		stag uint32
		to   uint64
		n    uint32
	}
	seen := make(chan sink, 16)
	observe := soft.Config{StrictReadSink: strict, ObserveReadRequest: func(stag uint32, to uint64, n uint32) {
		select {
		case seen <- sink{stag, to, n}:
		default:
		}
	}}
	ioQueue := func(host string, cfg soft.Config) *rawHost {
		adm, err := dialRaw(t, tt.addr, nvme.RDMACMRequest{HRQSize: 32, HSQSize: 31})
		if err != nil {
			t.Fatal(err)
		}
		rsp := adm.connect(0, 31, 0, 0xFFFF, testSubNQN, host)
		if rsp.Status != nvme.StatusSuccess {
			t.Fatalf("admin connect: %v", rsp.Status)
		}
		cntlid := nvme.ConnectResponseCNTLID(rsp.DW0)
		var cmd nvme.Command
		(&nvme.PropertyCommand{Set: true, Offset: nvme.PropCC, Value: 0x00460001}).Encode(&cmd)
		cmd.DPTR = nvme.KeyedSGL(0, 0, 0, false)
		if r, _ := adm.exchange(cmd, nil); r.Status != 0 {
			t.Fatalf("enable: %v", r.Status)
		}
		nq := nvme.Command{Opcode: uint8(nvme.AdminSetFeatures), Flags: 0x40, CDW10: 0x07}
		nq.DPTR = nvme.KeyedSGL(0, 0, 0, false)
		if r, _ := adm.exchange(nq, nil); r.Status != 0 {
			t.Fatalf("number of queues: %v", r.Status)
		}
		io, err := dialRawWith(t, tt.addr, nvme.RDMACMRequest{QID: 1, HRQSize: 32, HSQSize: 31, CNTLID: cntlid}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if r := io.connect(1, 31, 0, cntlid, testSubNQN, host); r.Status != 0 {
			t.Fatalf("I/O connect: %v", r.Status)
		}
		return io
	}
	write := func(h *rawHost, lba uint32, fill byte) {
		t.Helper()
		d := h.data.Bytes()[65536 : 65536+8192]
		for i := range d {
			d[i] = fill
		}
		w := nvme.Command{Opcode: uint8(nvme.IOWrite), Flags: 0x40, NSID: 1, CDW10: lba, CDW12: 1}
		w.DPTR = h.keyed(65536, 8192)
		if r, _ := h.exchange(w, nil); r.Status != 0 {
			t.Fatalf("write: %v", r.Status)
		}
	}
	attacker := ioQueue(testHostNQN, observe)
	write(attacker, 0, 0xaa)
	var s sink
	select {
	case s = <-seen:
	case <-time.After(5 * time.Second):
		t.Fatal("no READ request seen")
	}
	t.Logf("the target's READ request named sink STag %#x offset %#x (%d bytes)", s.stag, s.to, s.n)
	// The attacker writes to the sink it saw, now that its command is done.
	if err := attacker.qp.Write("attack", []transport.SGE{attacker.data.SGE(0, s.n)}, s.to, s.stag, 0); err != nil {
		t.Fatalf("post the attacker's write: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for attacker.qp.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if attacker.qp.Err() == nil {
		t.Fatal("a write to a finished command's READ sink was accepted: the host kept a key into the target's buffers")
	}
	t.Logf("the attacker's connection ended: %v", attacker.qp.Err())
	// Another host's writes through the same buffers land intact.
	victim := ioQueue(testHostNQN, soft.Config{StrictReadSink: strict})
	for i := uint32(0); i < 8; i++ {
		write(victim, 16+2*i, byte(i+1))
	}
	rd := nvme.Command{Opcode: uint8(nvme.IORead), Flags: 0x40, NSID: 1, CDW10: 16, CDW12: 15}
	rd.DPTR = victim.keyed(262144, 16*4096)
	if r, _ := victim.exchange(rd, nil); r.Status != 0 {
		t.Fatalf("read: %v", r.Status)
	}
	got := victim.data.Bytes()[262144 : 262144+16*4096]
	for i := range 8 {
		for j, b := range got[i*8192 : (i+1)*8192] {
			if b != byte(i+1) {
				t.Fatalf("block %d byte %d is %#x, want %#x", 16+2*i, j, b, i+1)
			}
		}
	}
}

package target_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

func TestConfigDefaults(t *testing.T) {
	c := target.Config{Limits: testLimits()}.WithDefaults()
	if c.SyncWorkers != target.DefaultSyncWorkers || c.SyncQueue != target.DefaultSyncQueue ||
		c.MaxControllers != target.DefaultMaxControllers || c.MaxNSID != target.DefaultMaxNSID ||
		c.ErrorLogEntries != target.DefaultErrorLogEntries || c.DiscoveryKATO != target.DefaultDiscoveryKATO ||
		c.FirmwareRevision != target.DefaultFirmwareRevision || c.DiscoverySerial != target.DefaultDiscoverySerial ||
		c.MaxDiscoveryControllers != target.DefaultMaxControllers/4 ||
		c.MaxDiscoveryPerSource != target.DefaultMaxDiscoveryPerSource ||
		c.DiscoveryIdleTimeout != target.DefaultDiscoveryIdleTimeout ||
		c.CNTLIDMin != 1 || c.CNTLIDMax != 0xFFEF {
		t.Fatalf("defaults %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// A dump loads back unchanged.
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var back target.Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Limits != c.Limits || back.SyncWorkers != c.SyncWorkers || back.DiscoveryKATO != c.DiscoveryKATO ||
		back.FirmwareRevision != c.FirmwareRevision || back.MaxDiscoveryControllers != c.MaxDiscoveryControllers ||
		back.MaxDiscoveryPerSource != c.MaxDiscoveryPerSource || back.DiscoveryIdleTimeout != c.DiscoveryIdleTimeout ||
		back.CNTLIDMin != c.CNTLIDMin || back.CNTLIDMax != c.CNTLIDMax {
		t.Fatalf("round trip %s -> %+v", b, back)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*target.Config)
		want string
	}{
		{"partial limits", func(c *target.Config) { c.Limits = target.Limits{KeyedSGL: true} }, "MaxTransfer"},
		{"transfer not a power of two", func(c *target.Config) { c.Limits.MaxTransfer = 3 * 4096 }, "MaxTransfer"},
		{"in-capsule not 16-aligned", func(c *target.Config) { c.Limits.InCapsule = 100 }, "InCapsule"},
		{"queue too small", func(c *target.Config) { c.Limits.MaxQueueEntries = 1 }, "MaxQueueEntries"},
		{"admin queue too big", func(c *target.Config) { c.Limits.AdminQueueEntries = 5000 }, "AdminQueueEntries"},
		{"no I/O queues", func(c *target.Config) { c.Limits.MaxIOQueues = 0 }, "MaxIOQueues"},
		{"workers", func(c *target.Config) { c.SyncWorkers = -1 }, "SyncWorkers"},
		{"sync queue", func(c *target.Config) { c.SyncQueue = -1 }, "SyncQueue"},
		{"controllers", func(c *target.Config) { c.MaxControllers = 0x10000 }, "MaxControllers"},
		{"nsid", func(c *target.Config) { c.MaxNSID = 0xFFFFFFFF }, "MaxNSID"},
		{"cntlid min above max", func(c *target.Config) { c.CNTLIDMin, c.CNTLIDMax = 0x500, 0x4FF }, "CNTLIDMin"},
		{"cntlid max reserved", func(c *target.Config) { c.CNTLIDMax = 0xFFF0 }, "CNTLIDMax"},
		{"cntlid range below MaxControllers", func(c *target.Config) { c.CNTLIDMin, c.CNTLIDMax, c.MaxControllers = 1, 100, 101 }, "MaxControllers"},
		{"error log", func(c *target.Config) { c.ErrorLogEntries = 300 }, "ErrorLogEntries"},
		{"discovery kato", func(c *target.Config) { c.DiscoveryKATO = time.Millisecond }, "DiscoveryKATO"},
		{"discovery takes every controller", func(c *target.Config) { c.MaxControllers, c.MaxDiscoveryControllers = 8, 8 }, "MaxDiscoveryControllers"},
		{"discovery negative", func(c *target.Config) { c.MaxDiscoveryControllers = -1 }, "MaxDiscoveryControllers"},
		{"discovery per source above the total", func(c *target.Config) { c.MaxDiscoveryControllers, c.MaxDiscoveryPerSource = 4, 5 }, "MaxDiscoveryPerSource"},
		{"discovery idle", func(c *target.Config) { c.DiscoveryIdleTimeout = time.Millisecond }, "DiscoveryIdleTimeout"},
		{"firmware", func(c *target.Config) { c.FirmwareRevision = "123456789" }, "FirmwareRevision"},
		{"serial", func(c *target.Config) { c.DiscoverySerial = "é" }, "DiscoverySerial"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := target.Config{Limits: testLimits()}
			tc.mod(&c)
			err := c.Validate()
			if err == nil || !errors.Is(err, target.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an ErrInvalid naming %s", err, tc.want)
			}
			if _, err := target.New(c); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}

// TestConfigCNTLIDRange: a CNTLID range smaller than the default
// MaxControllers makes MaxControllers its size, so the budget (and the
// discovery share of it) holds; a range of one node's 1024 keeps 1024.
func TestConfigCNTLIDRange(t *testing.T) {
	c := target.Config{Limits: testLimits(), CNTLIDMin: 0x101, CNTLIDMax: 0x140}.WithDefaults()
	if c.MaxControllers != 0x40 || c.MaxDiscoveryControllers != 0x10 {
		t.Fatalf("MaxControllers %d, MaxDiscoveryControllers %d for a 64-ID range", c.MaxControllers, c.MaxDiscoveryControllers)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c = target.Config{Limits: testLimits(), CNTLIDMin: 1024 + 1, CNTLIDMax: 2 * 1024}.WithDefaults()
	if c.MaxControllers != target.DefaultMaxControllers {
		t.Fatalf("MaxControllers %d", c.MaxControllers)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestConfigNoLimits: the zero Limits is no limits, which Validate
// accepts; every queue must then bring its own.
func TestConfigNoLimits(t *testing.T) {
	if err := (target.Config{}).Validate(); err != nil {
		t.Fatalf("zero Limits: %v", err)
	}
	tgt, err := target.New(target.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	var r countResponder
	if _, err := tgt.NewQueue(&r, target.QueueParams{QID: 0, SQSize: 31}); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("NewQueue with no limits anywhere: %v", err)
	}
	bad := testLimits()
	bad.MaxTransfer = 3 * 4096
	if _, err := tgt.NewQueue(&r, target.QueueParams{QID: 0, SQSize: 31, Limits: &bad}); !errors.Is(err, target.ErrInvalid) ||
		!strings.Contains(err.Error(), "MaxTransfer") {
		t.Fatalf("NewQueue with invalid limits: %v", err)
	}
	l := testLimits()
	if _, err := tgt.NewQueue(&r, target.QueueParams{QID: 0, SQSize: 31, Limits: &l}); err != nil {
		t.Fatalf("NewQueue with its own limits: %v", err)
	}
	// Invalid queue limits are refused even where Config.Limits are set.
	h := newHarness(t)
	if _, err := h.tgt.NewQueue(&r, target.QueueParams{QID: 0, SQSize: 31, Limits: &bad}); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("NewQueue with invalid limits over Config.Limits: %v", err)
	}
}

func TestLimits(t *testing.T) {
	l := target.Limits{MaxTransfer: 1 << 20, InCapsule: 8192, MaxQueueEntries: 128, AdminQueueEntries: 32,
		MaxIOQueues: 8, KeyedSGL: true}
	if l.MDTS() != 8 || l.IOCCSZ() != 516 || l.SGLS() != nvme.SGLSSupported|nvme.SGLSKeyed|nvme.SGLSOffset {
		t.Fatalf("MDTS %d IOCCSZ %d SGLS %#x", l.MDTS(), l.IOCCSZ(), l.SGLS())
	}
	l.InCapsule, l.KeyedSGL = 0, false
	if l.IOCCSZ() != 4 || l.SGLS() != nvme.SGLSSupported {
		t.Fatalf("no in-capsule: IOCCSZ %d SGLS %#x", l.IOCCSZ(), l.SGLS())
	}
	for _, c := range []struct {
		qid, sqsize uint16
		ok          bool
	}{{0, 31, true}, {0, 32, false}, {1, 127, true}, {1, 128, false}, {8, 1, true}, {9, 1, false}, {1, 0, false}} {
		if err := l.CheckQueue(c.qid, c.sqsize); (err == nil) != c.ok {
			t.Errorf("CheckQueue(%d, %d) = %v", c.qid, c.sqsize, err)
		}
	}
}

// TestAdministration: the management API's errors and listings.
func TestAdministration(t *testing.T) {
	h := newHarness(t)
	tg := h.tgt
	if _, err := tg.AddSubsystem(target.SubsystemConfig{NQN: "not-an-nqn"}); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("bad NQN: %v", err)
	}
	if _, err := tg.AddSubsystem(target.SubsystemConfig{NQN: nvme.DiscoveryNQN}); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("discovery NQN: %v", err)
	}
	if _, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subA, Serial: strings.Repeat("x", 21)}); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("long serial: %v", err)
	}
	if _, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subA, Hosts: []string{"bad host"}}); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("bad host: %v", err)
	}
	s, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subA, Hosts: []string{hostA}})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Serial()) != 20 || s.Model() != "blk" || s.NQN() != subA {
		t.Fatalf("defaults: %q %q", s.Serial(), s.Model())
	}
	if _, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subA}); !errors.Is(err, target.ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if got, ok := tg.Subsystem(subA); !ok || got != s {
		t.Fatal("lookup")
	}
	if err := s.AllowHost(hostA); !errors.Is(err, target.ErrExists) {
		t.Fatalf("allow twice: %v", err)
	}
	if err := s.DenyHost(hostB); !errors.Is(err, target.ErrNotFound) {
		t.Fatalf("deny unknown: %v", err)
	}
	if err := s.AllowHost(hostB); err != nil {
		t.Fatal(err)
	}
	if hs := s.Hosts(); len(hs) != 2 || s.AllowAnyHost() {
		t.Fatalf("hosts %v", hs)
	}
	m, _ := target.NewMemBackend(4096, 8)
	for _, c := range []target.NamespaceConfig{{NSID: 0, Backend: m}, {NSID: 1025, Backend: m}, {NSID: 1}} {
		if err := s.AddNamespace(c); !errors.Is(err, target.ErrInvalid) {
			t.Fatalf("AddNamespace %+v: %v", c, err)
		}
	}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 2, Backend: m}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 2, Backend: m}); !errors.Is(err, target.ErrExists) {
		t.Fatalf("same NSID: %v", err)
	}
	nguid := [16]byte{1}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 3, Backend: m, NGUID: nguid}); err != nil {
		t.Fatal(err)
	}
	s2, _ := tg.AddSubsystem(target.SubsystemConfig{NQN: subB, AllowAnyHost: true})
	if err := s2.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: m, NGUID: nguid}); !errors.Is(err, target.ErrExists) {
		t.Fatalf("same NGUID: %v", err)
	}
	if ids := s.Namespaces(); len(ids) != 2 || ids[0] != 2 || ids[1] != 3 {
		t.Fatalf("namespaces %v", ids)
	}
	if err := s.RemoveNamespace(9); !errors.Is(err, target.ErrNotFound) {
		t.Fatalf("remove unknown: %v", err)
	}
	if err := s.RemoveNamespace(3); err != nil {
		t.Fatal(err)
	}
	// The NGUID is free again once its namespace is gone.
	if err := s2.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: m, NGUID: nguid}); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddPort(target.Port{ID: 1, TrType: nvme.TrTypeRDMA, TrAddr: "10.0.0.1", TrSvcID: "4420"}); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddPort(target.Port{ID: 1}); !errors.Is(err, target.ErrExists) {
		t.Fatalf("same port: %v", err)
	}
	if ps := tg.Ports(); len(ps) != 1 || ps[0].RDMA.QPType != nvme.RDMAQPTypeConnected {
		t.Fatalf("ports %+v", ps)
	}
	if err := tg.AddPort(target.Port{ID: 2, TrType: nvme.TrTypeTCP, TCP: nvme.TCPTSAS{SecType: 3}}); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("unknown TCP SECTYPE: %v", err)
	}
	if err := tg.AddPort(target.Port{ID: 2, TrType: nvme.TrTypeTCP, Limits: &target.Limits{MaxTransfer: 4096}}); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("invalid port limits: %v", err)
	}
	if err := tg.RemovePort(2); !errors.Is(err, target.ErrNotFound) {
		t.Fatalf("remove unknown port: %v", err)
	}
	if err := tg.RemovePort(1); err != nil {
		t.Fatal(err)
	}
	if err := tg.RemoveSubsystem(subB); err != nil {
		t.Fatal(err)
	}
	if err := tg.RemoveSubsystem(subB); !errors.Is(err, target.ErrNotFound) {
		t.Fatalf("remove twice: %v", err)
	}
	if err := s2.AddNamespace(target.NamespaceConfig{NSID: 5, Backend: m}); !errors.Is(err, target.ErrNotFound) {
		t.Fatalf("namespace on a removed subsystem: %v", err)
	}
	if ss := tg.Subsystems(); len(ss) != 1 {
		t.Fatalf("subsystems %d", len(ss))
	}
	if _, err := target.NewMemBackend(1000, 8); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("mem backend block size: %v", err)
	}
	if err := tg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tg.NewQueue(&tq{h: h}, target.QueueParams{}); !errors.Is(err, target.ErrClosed) {
		t.Fatalf("NewQueue after Close: %v", err)
	}
	if _, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subB}); !errors.Is(err, target.ErrClosed) {
		t.Fatalf("AddSubsystem after Close: %v", err)
	}
}

// TestCoalescing: Set Features Interrupt Coalescing reaches the binding
// through the admin queue's QueueParams.Coalescing.
func TestCoalescing(t *testing.T) {
	h := newHarness(t)
	h.mustSubsystem(subA, 0)
	var thr, tm uint8
	q := h.queue("admin", target.QueueParams{QID: 0, SQSize: 31,
		Coalescing: func(a, b uint8) error { thr, tm = a, b; return nil }})
	mustOK(t, h.exec(q, connectCmd(0, 31, 0), connectData(hostA, subA, 0xFFFF, hostIDA)), "connect")
	mustOK(t, h.exec(q, propSet(nvme.PropCC, ccEnable), nil), "enable")
	mustOK(t, h.exec(q, setFeatCmd(nvme.FeatureIRQCoalescing, 0x0a07), nil), "set")
	if thr != 7 || tm != 10 {
		t.Fatalf("applied %d %d", thr, tm)
	}
	if c := h.exec(q, getFeatCmd(nvme.FeatureIRQCoalescing, 0), nil); c.dw0() != 0x0a07 {
		t.Fatalf("get %#x", c.dw0())
	}
}

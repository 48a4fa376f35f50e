package initiator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

func TestIOQueueDepth(t *testing.T) {
	capMQES := func(m uint16) nvme.CAP { return nvme.MakeCAP(nvme.CAPFields{MQES: m}) }
	for _, c := range []struct {
		req    int
		mqes   uint16
		maxcmd uint16
		want   int
	}{
		{128, 1023, 0, 128},   // Linux target TCP: MQES 1023
		{128, 127, 128, 128},  // Linux target RDMA: MQES 127 → 128 entries
		{128, 63, 0, 64},      // clamped to MQES+1
		{128, 1023, 32, 32},   // clamped to MAXCMD
		{256, 0xFFFF, 0, 256}, // MaxQueueDepth
		{16, 127, 0, 16},
	} {
		got, err := ioQueueDepth(c.req, capMQES(c.mqes), c.maxcmd)
		if err != nil || got != c.want {
			t.Errorf("ioQueueDepth(%d, MQES %d, MAXCMD %d) = %d, %v; want %d", c.req, c.mqes, c.maxcmd, got, err, c.want)
		}
	}
	if _, err := ioQueueDepth(128, capMQES(0), 0); !errors.Is(err, ErrProtocol) {
		t.Errorf("MQES 0: %v", err)
	}
	if _, err := ioQueueDepth(128, capMQES(127), 1); !errors.Is(err, ErrProtocol) {
		t.Errorf("MAXCMD 1: %v", err)
	}
}

func TestMaxTransfer(t *testing.T) {
	info := transport.AdapterInfo{MaxTransferLength: 16 << 20}
	for _, c := range []struct {
		cfg  int
		mdts uint8
		want int
	}{
		{128 << 10, 0, 128 << 10},
		{128 << 10, 8, 128 << 10}, // Linux target: MDTS 8 = 1 MiB
		{128 << 10, 2, 16 << 10},  // 4 KiB << 2
		{8 << 20, 0, 8 << 20},
	} {
		id := ctrlIdentity{MDTS: c.mdts}
		if got, err := maxTransfer(c.cfg, &id, info); err != nil || got != c.want {
			t.Errorf("maxTransfer(%d, MDTS %d) = %d, %v; want %d", c.cfg, c.mdts, got, err, c.want)
		}
	}
	id := ctrlIdentity{}
	if got, _ := maxTransfer(8<<20, &id, transport.AdapterInfo{MaxTransferLength: 100000}); got != 98304 {
		t.Errorf("adapter limit: %d", got)
	}
	if _, err := maxTransfer(8<<20, &id, transport.AdapterInfo{MaxTransferLength: 1000}); !errors.Is(err, ErrProtocol) {
		t.Errorf("adapter below a page: %v", err)
	}
}

// engineSizing keeps the SRQ invariant under the engine's real placement:
// on every core, the I/O QPs placed there can have no more responses in
// flight than the core's posted receive buffers, and the sizes pass the
// engine's own validation for the soft adapter.
func TestEngineSizing(t *testing.T) {
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, info := range []transport.AdapterInfo{
		{Cores: 1}, {Cores: 2}, {Cores: 8}, {Cores: 64},
	} {
		for _, queues := range []int{0, 1, 2, 3, 7, 8, 64} {
			for _, depth := range []int{2, 16, 128, 256} {
				name := fmt.Sprintf("cores %d queues %d depth %d", info.Cores, queues, depth)
				s, err := engineSizing(info, queues, depth)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				e := s.Engine
				if e.Cores < 1 || e.Cores > max(info.Cores, 1) || (queues > 0 && e.Cores > queues) {
					t.Errorf("%s: %d cores", name, e.Cores)
				}
				// Simulate PlaceQP: least loaded core, ties to the lowest;
				// admin first.
				load := make([]int, e.Cores)
				ioOn := make([]int, e.Cores)
				for qp := 0; qp <= queues; qp++ {
					best := 0
					for i := range load {
						if load[i] < load[best] {
							best = i
						}
					}
					if uint32(load[best]) >= e.QPsPerCore {
						t.Fatalf("%s: QP %d cannot be placed", name, qp)
					}
					load[best]++
					if qp > 0 {
						ioOn[best]++
					}
				}
				for i, n := range ioOn {
					if uint64(n*depth) > uint64(e.Buffers) || e.Buffers > e.SRQDepth {
						t.Errorf("%s: core %d has %d I/O QPs × %d responses > %d buffers", name, i, n, depth, e.Buffers)
					}
				}
				if s.IOInitiator < uint32(depth) || s.AdminInitiator+s.AdminRecv > e.InitiatorDepth || s.IOInitiator > e.InitiatorDepth {
					t.Errorf("%s: initiator depths %+v vs %d", name, s, e.InitiatorDepth)
				}
				if e.BufferSize != nvme.CQESize || e.InitiatorSGE != 2 {
					t.Errorf("%s: buffer %d, SGEs %d", name, e.BufferSize, e.InitiatorSGE)
				}
				full := e.WithDefaults(a.Info())
				if err := full.ValidateFor(a.Info()); err != nil && info.Cores <= 8 {
					t.Errorf("%s: %v", name, err)
				}
			}
		}
	}
	if _, err := engineSizing(transport.AdapterInfo{Cores: 1, MaxSrqDepth: 100}, 4, 128); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("SRQ too small: %v", err)
	}
}

func TestConfig(t *testing.T) {
	a, _ := soft.New(soft.Config{})
	defer a.Close()
	c := Config{Adapter: a}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.QueueDepth != 128 || c.KATO != 5*time.Second || c.CtrlLossTimeout != time.Minute || c.Queues < 1 ||
		c.MaxTransfer != 128<<10 || c.ReconnectDelay != time.Second || c.MaxReconnectDelay != 10*time.Second {
		t.Errorf("defaults %+v", c)
	}
	// A default host identity: the NQN is the UUID form of the ID, and
	// completing again keeps it.
	if c.HostNQN != "nqn.2014-08.org.nvmexpress:uuid:"+formatUUID(c.HostID) || c.HostID == ([16]byte{}) {
		t.Errorf("host %q %x", c.HostNQN, c.HostID)
	}
	if again := c.WithDefaults(); again.HostID != c.HostID || again.HostNQN != c.HostNQN {
		t.Error("defaults not stable")
	}
	if c.katoMillis() != 5000 {
		t.Errorf("kato %d", c.katoMillis())
	}
	c.KATO = -1
	if c.katoMillis() != 0 || c.Validate() != nil {
		t.Error("negative KATO disables keep-alive")
	}
	for name, mod := range map[string]func(*Config){
		"no adapter":      func(c *Config) { c.Adapter = nil },
		"transport":       func(c *Config) { c.Transport = "fc" },
		"rdma digest":     func(c *Config) { c.HeaderDigest = true },
		"depth":           func(c *Config) { c.QueueDepth = 257 },
		"depth 1":         func(c *Config) { c.QueueDepth = 1 },
		"transfer":        func(c *Config) { c.MaxTransfer = 5000 },
		"loss timeout":    func(c *Config) { c.CtrlLossTimeout = -1 },
		"backoff":         func(c *Config) { c.MaxReconnectDelay = c.ReconnectDelay / 2 },
		"host nqn":        func(c *Config) { c.HostNQN = "host" },
		"queues":          func(c *Config) { c.Queues = 70000 },
		"sub-ms kato":     func(c *Config) { c.KATO = time.Microsecond },
		"timeout":         func(c *Config) { c.IOTimeout = -1 },
		"connect timeout": func(c *Config) { c.ConnectTimeout = -1 },
	} {
		bad := Config{Adapter: a}.WithDefaults()
		mod(&bad)
		if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if id, ok := parseUUID("7a1c4bd2-0f3e-4a45-9c1e-3f1b2a6d8e90"); !ok || formatUUID(id) != "7a1c4bd2-0f3e-4a45-9c1e-3f1b2a6d8e90" {
		t.Error("UUID round trip")
	}
	if _, ok := parseUUID("7a1c4bd2-0f3e-4a45-9c1e"); ok {
		t.Error("short UUID accepted")
	}
	if withDefaultPort("10.0.0.1", "4420") != "10.0.0.1:4420" || withDefaultPort("[::1]:9", "8009") != "[::1]:9" || withDefaultPort("::1", "8009") != "[::1]:8009" {
		t.Error("default port")
	}
}

func TestParseIdentify(t *testing.T) {
	b := make([]byte, identifySize)
	le := binary.LittleEndian
	copy(b[idCtrlSN:], "SN42                ")
	b[idCtrlMDTS] = 8
	le.PutUint16(b[idCtrlCNTLID:], 5)
	le.PutUint16(b[idCtrlKAS:], 10)
	le.PutUint32(b[idCtrlSGLS:], 0x00100005)
	le.PutUint32(b[idCtrlIOCCSZ:], 260)
	le.PutUint32(b[idCtrlIORCSZ:], 1)
	copy(b[idCtrlSUBNQN:], "nqn.2024-01.io.blk:x")
	id, err := parseIdentifyController(b)
	if err != nil || id.SerialNumber != "SN42" || id.SubNQN != "nqn.2024-01.io.blk:x" || id.mdtsBytes() != 1<<20 {
		t.Fatalf("%+v %v", id, err)
	}
	if err := id.checkIO(5, false); err != nil {
		t.Fatal(err)
	}
	if id.ioInCapsule(false) != 4096 { // Linux target default: IOCCSZ 260
		t.Errorf("in-capsule %d", id.ioInCapsule(false))
	}
	for name, mod := range map[string]func(*ctrlIdentity){
		"cntlid": func(i *ctrlIdentity) { i.CNTLID = 6 },
		"kas":    func(i *ctrlIdentity) { i.KAS = 0 },
		"ioccsz": func(i *ctrlIdentity) { i.IOCCSZ = 3 },
		"iorcsz": func(i *ctrlIdentity) { i.IORCSZ = 0 },
		"icdoff": func(i *ctrlIdentity) { i.ICDOFF = 1 },
		"sgls":   func(i *ctrlIdentity) { i.SGLS = 1 },
	} {
		bad := id
		mod(&bad)
		if err := bad.checkIO(5, false); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v", name, err)
		}
	}
	id.SGLS = sglsKeyed
	if id.ioInCapsule(false) != 0 {
		t.Error("in-capsule data without SGLS bit 20")
	}

	// Namespace: FLBAS selects format 1 (4 KiB); with more than 16
	// formats FLBAS bits 6:5 extend the index.
	ns := make([]byte, identifySize)
	le.PutUint64(ns[idNsNSZE:], 1000)
	le.PutUint64(ns[idNsNCAP:], 1000)
	ns[idNsNLBAF] = 1
	ns[idNsFLBAS] = 1
	le.PutUint32(ns[idNsLBAF:], 9<<16)
	le.PutUint32(ns[idNsLBAF+4:], 12<<16)
	got, err := parseIdentifyNamespace(ns)
	if err != nil || got.Blocks != 1000 || got.BlockSize != 4096 {
		t.Fatalf("%+v %v", got, err)
	}
	ns[idNsNLBAF] = 20
	ns[idNsFLBAS] = 0x22 // index 2 | (1 << 4)
	le.PutUint32(ns[idNsLBAF+4*18:], 10<<16|8)
	if got, err := parseIdentifyNamespace(ns); err != nil || got.BlockSize != 1024 || got.Metadata != 8 {
		t.Fatalf("extended FLBAS: %+v %v", got, err)
	}
	ns[idNsNLBAF] = 0
	ns[idNsFLBAS] = 1
	if _, err := parseIdentifyNamespace(ns); !errors.Is(err, ErrProtocol) {
		t.Errorf("FLBAS beyond NLBAF: %v", err)
	}

	// Active namespace list: zero-terminated, full page.
	list := make([]byte, identifySize)
	le.PutUint32(list[0:], 1)
	le.PutUint32(list[4:], 7)
	if ids, full := parseNSList(list, nil); full || len(ids) != 2 || ids[1] != 7 {
		t.Errorf("list %v %v", ids, full)
	}
	for i := 0; i < 1024; i++ {
		le.PutUint32(list[4*i:], uint32(i+1))
	}
	if ids, full := parseNSList(list, nil); !full || len(ids) != 1024 {
		t.Errorf("full list: %d %v", len(ids), full)
	}

	// Descriptors: NGUID then CSI; a wrong length for a known type fails.
	d := make([]byte, identifySize)
	d[0], d[1] = nidtNGUID, 16
	d[4] = 0xAA
	d[20], d[21] = nidtCSI, 1
	d[24] = 0
	desc, err := parseNSDescriptors(d)
	if err != nil || desc.NGUID[0] != 0xAA || !desc.HasCSI || desc.CSI != 0 {
		t.Errorf("%+v %v", desc, err)
	}
	d[1] = 8
	if _, err := parseNSDescriptors(d); !errors.Is(err, ErrProtocol) {
		t.Errorf("bad NIDL: %v", err)
	}
}

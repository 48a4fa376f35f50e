package tcp_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

const (
	testSubNQN  = "nqn.2026-11.io.blk:test"
	testHostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"
	testBlock   = 4096
	testBlocks  = 16384 // 64 MiB
)

type testTarget struct {
	t    *target.Target
	port *tcp.Port
	mem  *target.MemBackend
	addr string
}

// newTestTarget serves one subsystem with one 64 MiB namespace in memory
// (4 KiB blocks) on a port on loopback with 2 poll groups.
func newTestTarget(t testing.TB, cfg tcp.Config) *testTarget {
	t.Helper()
	return newTestTargetWith(t, cfg, target.Config{})
}

// newTestTargetWith is newTestTarget with the core's configuration tc
// (its Limits are the port's).
func newTestTargetWith(t testing.TB, cfg tcp.Config, tc target.Config) *testTarget {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Cores == 0 {
		cfg.Cores = 2
	}
	lim, err := tcp.Limits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tt := &testTarget{}
	tc.Limits = lim
	if tt.t, err = target.New(tc); err != nil {
		t.Fatal(err)
	}
	if tt.mem, err = target.NewMemBackend(testBlock, testBlocks); err != nil {
		t.Fatal(err)
	}
	sub, err := tt.t.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-test-1", Model: "blk test", Hosts: []string{testHostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	if err = sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: tt.mem}); err != nil {
		t.Fatal(err)
	}
	if tt.port, err = tcp.Listen(tt.t, cfg); err != nil {
		t.Fatal(err)
	}
	tt.addr = tt.port.Addr().String()
	t.Cleanup(func() {
		tt.port.Close()
		tt.t.Close()
	})
	return tt
}

// adminUp connects an admin queue, enables the controller and asks for
// queues; it returns the host and the CNTLID.
func (tt *testTarget) adminUp(t testing.TB, dg nvme.TCPDigests) (*rawHost, uint16) {
	t.Helper()
	h := dialRaw(t, tt.addr)
	h.mustIC(dg)
	rsp := h.connect(0, 31, 0, nvme.CNTLIDDynamic)
	if rsp.Status != 0 {
		t.Fatalf("admin Connect: status %v", rsp.Status)
	}
	cntlid := nvme.ConnectResponseCNTLID(rsp.DW0)
	cc := nvme.MakeCC(nvme.CCFields{EN: true, IOSQES: 6, IOCQES: 4})
	if res := h.mustExchange(propSet(nvme.PropCC, uint64(cc)), nil, nil, nil); res.rsp.Status != 0 {
		t.Fatalf("Property Set CC: %v", res.rsp.Status)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		res := h.mustExchange(propGet(nvme.PropCSTS, false), nil, nil, nil)
		if res.rsp.DW0&1 != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("CSTS.RDY never set")
		}
		time.Sleep(time.Millisecond)
	}
	var sf nvme.Command
	(&nvme.FeatureCommand{FID: nvme.FeatureNumQueues, CDW11: nvme.NumQueues(4, 4)}).EncodeSet(&sf)
	if res := h.mustExchange(sf, nil, nil, nil); res.rsp.Status != 0 {
		t.Fatalf("Set Features Number of Queues: %v", res.rsp.Status)
	}
	return h, cntlid
}

// ioUp connects I/O queue qid of controller cntlid.
func (tt *testTarget) ioUp(t testing.TB, cntlid, qid, sqsize uint16, cattr uint8, dg nvme.TCPDigests) *rawHost {
	t.Helper()
	h := dialRaw(t, tt.addr)
	h.mustIC(dg)
	if rsp := h.connect(qid, sqsize, cattr, cntlid); rsp.Status != 0 {
		t.Fatalf("I/O Connect: status %v", rsp.Status)
	}
	return h
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed ^ byte(i>>12)
	}
	return b
}

// TestEndToEnd: connect, enable, identify, an I/O queue, then writes in
// the capsule and by R2T and reads back, with every digest combination,
// and reads ending in SUCCESS when the I/O queue disabled SQ flow control.
func TestEndToEnd(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{})
	for _, tc := range []struct {
		name    string
		dg      nvme.TCPDigests
		flowOff bool
	}{
		{"plain", nvme.TCPDigests{}, false},
		{"hdgst", nvme.TCPDigests{Header: true}, false},
		{"ddgst", nvme.TCPDigests{Data: true}, false},
		{"both", nvme.TCPDigests{Header: true, Data: true}, false},
		{"sqflow-off", nvme.TCPDigests{}, true},
		{"sqflow-off-digests", nvme.TCPDigests{Header: true, Data: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin, cntlid := tt.adminUp(t, tc.dg)
			id := make([]byte, nvme.IdentifySize)
			res := admin.mustExchange(identify(1, 0), nil, nil, id)
			if res.rsp.Status != 0 || res.c2h != 1 {
				t.Fatalf("Identify Controller: %+v", res)
			}
			var ic nvme.IdentifyController
			if err := ic.Unmarshal(id); err != nil {
				t.Fatal(err)
			}
			if ic.CNTLID != cntlid || ic.IOCCSZ != (64+tcp.DefaultInCapsule)/16 || ic.SGLS&nvme.SGLSKeyed != 0 {
				t.Fatalf("Identify Controller: CNTLID %d (want %d) IOCCSZ %d SGLS %#x", ic.CNTLID, cntlid, ic.IOCCSZ, ic.SGLS)
			}
			var cattr uint8
			if tc.flowOff {
				cattr = nvme.ConnectAttrDisableSQFlow
			}
			io := tt.ioUp(t, cntlid, 1, 31, cattr, tc.dg)
			for _, size := range []int{4096, 8192, 12288, 128 << 10} {
				lba := uint64(size / testBlock * 3)
				w := pattern(size, byte(size>>10)^tc.dg.DGST())
				cmd := rw(nvme.IOWrite, 1, lba, uint32(size/testBlock))
				var res result
				if size <= tcp.DefaultInCapsule {
					res = io.mustExchange(cmd, w, nil, nil)
					if res.r2ts != 0 {
						t.Fatalf("in-capsule write of %d got %d R2Ts", size, res.r2ts)
					}
				} else {
					res = io.mustExchange(cmd, nil, w, nil)
					if res.r2ts != 1 {
						t.Fatalf("write of %d: %d R2Ts, want 1", size, res.r2ts)
					}
				}
				if res.rsp.Status != 0 {
					t.Fatalf("write of %d: %v", size, res.rsp.Status)
				}
				r := make([]byte, size)
				res = io.mustExchange(rw(nvme.IORead, 1, lba, uint32(size/testBlock)), nil, nil, r)
				if res.rsp.Status != 0 || res.c2h != 1 {
					t.Fatalf("read of %d: %+v", size, res)
				}
				if res.success != tc.flowOff {
					t.Fatalf("read of %d: SUCCESS %v with SQ flow control off %v", size, res.success, tc.flowOff)
				}
				if !bytes.Equal(r, w) {
					t.Fatalf("read of %d bytes differs from the write", size)
				}
				if !tc.flowOff && res.rsp.SQHead == 0xFFFF || tc.flowOff && !res.success {
					t.Fatalf("SQHD %#x", res.rsp.SQHead)
				}
			}
		})
	}
	st := tt.port.Stats()
	if st.R2Ts == 0 || st.InCapsule == 0 || st.SuccessFlags == 0 || st.Terminations != 0 {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("stats %+v", st)
}

package target_test

import (
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestLinuxHostChecks asserts, field by field, what a Linux host checks
// during nvme connect and nvme discover (wire doc §2.2, §6.2, §7, §8):
// a failure here is a host that refuses the target.
func TestLinuxHostChecks(t *testing.T) {
	for _, l := range []target.Limits{
		testLimits(),
		{MaxTransfer: 1 << 20, InCapsule: 0, MaxQueueEntries: 1024, AdminQueueEntries: 32, MaxIOQueues: 16, KeyedSGL: true},
	} {
		h := newHarness(t, func(c *target.Config) { c.Limits = l })
		h.mustSubsystem(subA, 64)
		admin, cntlid := h.adminConnect("admin", hostA, subA, 5000)

		pc := h.exec(admin, propGet(nvme.PropCAP, true), nil)
		pc.mu.Lock()
		capReg := nvme.CAP(pc.rsp.Result64())
		pc.mu.Unlock()
		if capReg.MPSMIN() != 0 {
			t.Errorf("CAP.MPSMIN %d: the host needs 0", capReg.MPSMIN())
		}
		if capReg.TO() < 2 {
			t.Errorf("CAP.TO %d: below 2 the host's ready wait is zero", capReg.TO())
		}
		if capReg.CSS()&nvme.CAPCSSIOCS != 0 || capReg.CSS()&nvme.CAPCSSNVM == 0 {
			t.Errorf("CAP.CSS %#x: want the NVM command set only", capReg.CSS())
		}
		if uint32(capReg.MQES())+1 != l.MaxQueueEntries || capReg.CRIMS() || capReg.CRWMS() {
			t.Errorf("CAP %#x", uint64(capReg))
		}
		if v := h.exec(admin, propGet(nvme.PropCSTS, false), nil).dw0(); v != uint32(nvme.CSTSReady) {
			t.Errorf("CSTS %#x after enable", v)
		}

		c := h.exec(admin, identifyCmd(nvme.CNSController, 0), make([]byte, 4096))
		var id nvme.IdentifyController
		_ = id.Unmarshal(c.data)
		switch {
		case id.CNTLID != cntlid:
			t.Errorf("CNTLID %d, Connect said %d", id.CNTLID, cntlid)
		case id.KAS == 0:
			t.Error("KAS 0 is fatal for an I/O controller")
		case id.IOCCSZ < 4 || id.IORCSZ < 1 || id.ICDOFF != 0:
			t.Errorf("IOCCSZ %d IORCSZ %d ICDOFF %d", id.IOCCSZ, id.IORCSZ, id.ICDOFF)
		case id.SGLS&3 == 0:
			t.Error("SGLS bits 1:0 zero: 'Mandatory sgls are not supported'")
		case id.SGLS&nvme.SGLSKeyed == 0:
			t.Error("SGLS bit 2 clear: an RDMA host refuses")
		case (id.SGLS&nvme.SGLSOffset != 0) != (l.InCapsule > 0):
			t.Errorf("SGLS bit 20 %v with %d bytes in capsule", id.SGLS&nvme.SGLSOffset != 0, l.InCapsule)
		case id.IOCCSZ*16-64 != l.InCapsule:
			t.Errorf("IOCCSZ %d for %d bytes in capsule", id.IOCCSZ, l.InCapsule)
		case 4096<<id.MDTS != l.MaxTransfer:
			t.Errorf("MDTS %d for %d bytes", id.MDTS, l.MaxTransfer)
		case uint32(id.MAXCMD) != l.MaxQueueEntries:
			t.Errorf("MAXCMD %d", id.MAXCMD)
		case id.CMIC&nvme.CMICMultiCtrl == 0 || id.CMIC&nvme.CMICANA != 0:
			t.Errorf("CMIC %#x: multi-controller on, ANA off", id.CMIC)
		case id.CNTRLTYPE != nvme.CtrlTypeIO || !id.SubNQN.Equal(subA):
			t.Errorf("CNTRLTYPE %d SUBNQN %q", id.CNTRLTYPE, id.SubNQN.String())
		case id.VER != 0x10400 || id.OACS != 0 || id.APSTA != 0 || id.CTRATT&nvme.CtrAttELBAS != 0 || id.CRDT != [3]uint16{}:
			t.Errorf("VER %#x OACS %#x APSTA %d CTRATT %#x CRDT %v: optional host paths switched on",
				uint32(id.VER), id.OACS, id.APSTA, id.CTRATT, id.CRDT)
		case id.ONCS&nvme.ONCSTimestamp != 0 || id.OAES&^nvme.AENNSAttr != 0:
			t.Errorf("ONCS %#x OAES %#x", id.ONCS, id.OAES)
		case id.MSDBD != 1 || id.VWC&nvme.VWCPresent == 0:
			t.Errorf("MSDBD %d VWC %d", id.MSDBD, id.VWC)
		}

		// Number of Queues: any error, or 0 granted, fails the connect.
		c = h.exec(admin, setFeatCmd(nvme.FeatureNumQueues, nvme.NumQueues(64, 64)), nil)
		mustOK(t, c, "number of queues")
		if nsq, ncq := nvme.SplitNumQueues(c.dw0()); nsq == 0 || nsq != uint32(l.MaxIOQueues) || ncq != nsq {
			t.Errorf("granted %d/%d of %d", nsq, ncq, l.MaxIOQueues)
		}

		// Namespace scan: CNS 0x03 must succeed (VER 1.3+) and have the
		// NGUID; CNS 0x00 must give NCAP > 0 and a usable LBADS, NMIC 1.
		c = h.exec(admin, identifyCmd(nvme.CNSNSDescriptorList, 1), make([]byte, 4096))
		mustOK(t, c, "descriptors")
		var kinds []uint8
		_ = nvme.WalkNSDescriptors(c.data, func(nidt uint8, _ []byte) { kinds = append(kinds, nidt) })
		if len(kinds) != 2 || kinds[0] != nvme.NIDTNGUID || kinds[1] != nvme.NIDTCSI {
			t.Errorf("descriptor types %v", kinds)
		}
		c = h.exec(admin, identifyCmd(nvme.CNSNamespace, 1), make([]byte, 4096))
		var ns nvme.IdentifyNamespace
		_ = ns.Unmarshal(c.data)
		if ns.NCAP == 0 || ns.NSZE != ns.NCAP || ns.BlockSize() != 4096 || ns.NMIC != nvme.NMICShared ||
			ns.NLBAF != 0 || ns.LBAF[0].MS != 0 || ns.NGUID == ([16]byte{}) {
			t.Errorf("namespace %+v", ns)
		}
	}
}

// TestDiscoveryHostChecks: what nvme discover needs from the discovery
// controller (wire doc §7).
func TestDiscoveryHostChecks(t *testing.T) {
	h := newHarness(t)
	h.mustSubsystem(subA, 0)
	if err := h.tgt.AddPort(target.Port{ID: 7, TrType: nvme.TrTypeRDMA, AdrFam: nvme.AdrFamIPv4,
		TrAddr: "10.0.0.1", TrSvcID: "4420"}); err != nil {
		t.Fatal(err)
	}
	q := h.queue("disc", target.QueueParams{QID: 0, SQSize: 31, LocalAddr: "10.0.0.1", LocalPort: "4420"})
	mustOK(t, h.exec(q, connectCmd(0, 31, 0), connectData(hostA, nvme.DiscoveryNQN, 0xFFFF, hostIDA)), "connect")
	mustOK(t, h.exec(q, propSet(nvme.PropCC, ccEnable), nil), "enable")
	c := h.exec(q, identifyCmd(nvme.CNSController, 0), make([]byte, 4096))
	var id nvme.IdentifyController
	_ = id.Unmarshal(c.data)
	if id.CNTRLTYPE != nvme.CtrlTypeDiscovery || !id.SubNQN.Equal(nvme.DiscoveryNQN) || id.ICDOFF != 0 ||
		id.SGLS&3 == 0 || id.MDTS != 0 || id.OAES != nvme.AENDiscoveryLogs || id.LPA&nvme.LPAExtendedData == 0 {
		t.Errorf("discovery identify: %+v", id)
	}
	// libnvme's reads: header, entries, header.
	c = h.exec(q, getLogCmd(nvme.LogDiscovery, 0, 20, 0, true), make([]byte, 20))
	var hdr nvme.DiscoveryLogHeader
	_ = hdr.Unmarshal(c.data)
	if hdr.NumRec != 2 || hdr.RecFmt != 0 {
		t.Fatalf("header %+v", hdr)
	}
	c = h.exec(q, getLogCmd(nvme.LogDiscovery, 0, 2048, 1024, false), make([]byte, 2048))
	var e nvme.DiscoveryLogEntry
	_ = e.Unmarshal(c.data[1024:])
	if e.SubType != nvme.SubTypeNVM || !e.SubNQN.Equal(subA) || e.PortID != 7 || e.CNTLID != 0xFFFF ||
		e.TrType != nvme.TrTypeRDMA || string(e.TrAddr[:8]) != "10.0.0.1" || e.RDMATSAS().CMS != nvme.RDMACMSRDMACM {
		t.Errorf("entry %+v", e)
	}
	c = h.exec(q, getLogCmd(nvme.LogDiscovery, 0, 20, 0, false), make([]byte, 20))
	var again nvme.DiscoveryLogHeader
	_ = again.Unmarshal(c.data)
	if again != hdr {
		t.Errorf("GENCTR moved with nothing changed: %+v %+v", hdr, again)
	}
}

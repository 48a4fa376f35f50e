package nvme

import "testing"

func TestDiscoveryLogHeader(t *testing.T) {
	h := DiscoveryLogHeader{GenCtr: 0x0102030405060708, NumRec: 2}
	var b [DiscoveryLogHeaderSize]byte
	for i := range b {
		b[i] = 0xEE
	}
	h.Marshal(&b)
	// nvme.h struct nvmf_disc_rsp_page_hdr: genctr 0, numrec 8, recfmt 16.
	equalBytes(t, "header", b[:18], hexBytes(t, "08 07 06 05 04 03 02 01 | 02 00 00 00 00 00 00 00 | 00 00"))
	equalBytes(t, "reserved", b[18:], make([]byte, DiscoveryLogHeaderSize-18))
	var back DiscoveryLogHeader
	// nvme-cli first reads only 20 bytes.
	if err := back.Unmarshal(b[:20]); err != nil || back != h {
		t.Fatalf("round trip %v %+v", err, back)
	}
	if err := back.Unmarshal(b[:17]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
}

func TestDiscoveryLogEntryRDMA(t *testing.T) {
	e := DiscoveryLogEntry{
		TrType: TrTypeRDMA, AdrFam: AdrFamIPv4, SubType: SubTypeNVM,
		TReq: TReqSecureNotSpecified | TReqDisableSQFlow, PortID: 0x0102,
		CNTLID: CNTLIDDynamic, ASQSZ: 32, EFlags: EFlagEPCSD,
	}
	if err := e.SetTrSvcID("4420"); err != nil {
		t.Fatal(err)
	}
	if err := e.SetTrAddr("10.0.2.15"); err != nil {
		t.Fatal(err)
	}
	e.SubNQN, _ = MakeNQNField("nqn.2026-01.io.blk:vol1")
	e.SetRDMATSAS(RDMATSAS{QPType: RDMAQPTypeConnected, PrType: RDMAPrTypeRoCEv2, CMS: RDMACMSRDMACM, PKey: 0xFFFF})

	var b [DiscoveryLogEntrySize]byte
	for i := range b {
		b[i] = 0xEE
	}
	e.Marshal(&b)
	// nvme.h struct nvmf_disc_rsp_page_entry: trtype 0, adrfam 1, subtype 2,
	// treq 3, portid 4, cntlid 6, asqsz 8, eflags 10, resv 12..31, trsvcid
	// 32, resv 64..255, subnqn 256, traddr 512, tsas 768 (rdma: qptype,
	// prtype, cms, resv[5], pkey at 8).
	equalBytes(t, "fixed", b[:12], hexBytes(t, "01 01 02 04 | 02 01 | ff ff | 20 00 | 02 00"))
	equalBytes(t, "resv10", b[12:32], make([]byte, 20))
	equalBytes(t, "trsvcid", b[32:64], append([]byte("4420"), make([]byte, 28)...))
	equalBytes(t, "resv64", b[64:256], make([]byte, 192))
	if string(b[256:279]) != "nqn.2026-01.io.blk:vol1" || b[279] != 0 {
		t.Errorf("subnqn: %q", b[256:280])
	}
	equalBytes(t, "traddr", b[512:768], append([]byte("10.0.2.15"), make([]byte, 256-9)...))
	equalBytes(t, "tsas", b[768:780], hexBytes(t, "01 04 01 00 00 00 00 00 ff ff 00 00"))
	equalBytes(t, "tsas rest", b[780:], make([]byte, 1024-780))

	var back DiscoveryLogEntry
	if err := back.Unmarshal(b[:]); err != nil || back != e {
		t.Fatalf("round trip %v", err)
	}
	if back.RDMATSAS() != (RDMATSAS{QPType: 1, PrType: 4, CMS: 1, PKey: 0xFFFF}) {
		t.Fatalf("tsas: %+v", back.RDMATSAS())
	}
	if err := back.Unmarshal(b[:1023]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
	if err := e.SetTrSvcID("0123456789012345678901234567890123"); err != ErrFieldTooLong {
		t.Fatalf("long trsvcid: %v", err)
	}
	if err := e.SetTrAddr(string(make([]byte, 256))); err != ErrFieldTooLong {
		t.Fatalf("long traddr: %v", err)
	}
}

func TestDiscoveryLogEntryTCP(t *testing.T) {
	e := DiscoveryLogEntry{
		TrType: TrTypeTCP, AdrFam: AdrFamIPv6, SubType: SubTypeNVM,
		TReq: TReqSecureRequired, PortID: 7, CNTLID: CNTLIDDynamic, ASQSZ: 32,
	}
	_ = e.SetTrSvcID("4420")
	_ = e.SetTrAddr("fd00::1")
	e.SubNQN, _ = MakeNQNField("nqn.2026-01.io.blk:vol1")
	// A stale RDMA TSAS must not survive: SetTCPTSAS clears the field.
	e.SetRDMATSAS(RDMATSAS{QPType: 1, PrType: 4, CMS: 1, PKey: 0xFFFF})
	e.SetTCPTSAS(TCPTSAS{SecType: TCPSecTypeTLS13})

	var b [DiscoveryLogEntrySize]byte
	e.Marshal(&b)
	// nvme.h struct nvmf_disc_rsp_page_entry, tsas.tcp: sectype at 768,
	// the rest reserved.
	equalBytes(t, "fixed", b[:12], hexBytes(t, "03 02 02 01 | 07 00 | ff ff | 20 00 | 00 00"))
	equalBytes(t, "tsas", b[768:], append([]byte{2}, make([]byte, 255)...))
	var back DiscoveryLogEntry
	if err := back.Unmarshal(b[:]); err != nil || back != e {
		t.Fatalf("round trip %v", err)
	}
	if back.TCPTSAS() != (TCPTSAS{SecType: TCPSecTypeTLS13}) {
		t.Fatalf("tsas: %+v", back.TCPTSAS())
	}
	if TCPSecTypeNone != 0 || TCPSecTypeTLS12 != 1 || TCPSecTypeTLS13 != 2 || TrTypeTCP != 3 {
		t.Fatal("TCP values are not the spec's")
	}
}

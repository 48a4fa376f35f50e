package nvme

import (
	"encoding/binary"
	"testing"
)

// struct nvme_get_log_page_command: lid 40, lsp 41, numdl 42, numdu 44,
// lsi 46, lpo 48, csi 63.
func TestGetLogPageCommand(t *testing.T) {
	g := GetLogPageCommand{NSID: NSIDAll, LID: LogDiscovery, LSP: 0x15, RAE: true,
		NUMD: 0x12345, LSI: 0x77, LPO: 0x1_0000_0400, UUID: 5, OT: true, CSI: 2}
	var c Command
	g.Encode(&c)
	var b [SQESize]byte
	_ = c.Marshal(&b)
	equalBytes(t, "cdw10-15", b[40:64], hexBytes(t,
		"70 95 45 23 | 01 00 77 00 | 00 04 00 00 01 00 00 00 | 05 00 80 02 | 00 00 00 00"))
	if b[0] != 0x02 || binary.LittleEndian.Uint32(b[4:]) != NSIDAll {
		t.Fatalf("opcode/nsid % x", b[:8])
	}
	var back GetLogPageCommand
	back.Decode(&c)
	if back != g {
		t.Fatalf("round trip %+v", back)
	}
	if g.Length() != 0x12346*4 || LogNUMD(4096) != 1023 {
		t.Fatalf("length %d", g.Length())
	}
}

func TestErrorLogEntryLayout(t *testing.T) {
	e := ErrorLogEntry{ErrorCount: 0x0102, SQID: 3, CID: 0x1004, Status: StatusLBAOutOfRange.WithDNR(),
		ParamLoc: 0x28, LBA: 0x55, NSID: 6, VS: 1, CS: 0x77}
	var b [ErrorLogEntrySize]byte
	e.Marshal(&b)
	// struct nvme_error_slot: error_count 0, sqid 8, cmdid 10,
	// status_field 12, param_error_location 14, lba 16, nsid 24, vs 28,
	// resv 29-31, cs 32, resv2 40-63.
	equalBytes(t, "entry", b[:40], hexBytes(t,
		"02 01 00 00 00 00 00 00 | 03 00 | 04 10 | 00 81 | 28 00 | 55 00 00 00 00 00 00 00 | 06 00 00 00 | 01 00 00 00 | 77 00 00 00 00 00 00 00"))
	equalBytes(t, "resv2", b[40:], make([]byte, 24))
	var back ErrorLogEntry
	if err := back.Unmarshal(b[:]); err != nil || back != e {
		t.Fatalf("round trip %v %+v", err, back)
	}
	if err := back.Unmarshal(b[:63]); err != ErrShortBuffer {
		t.Fatal(err)
	}
}

func TestSMARTLogLayout(t *testing.T) {
	s := SMARTLog{CriticalWarning: SMARTCritReadOnly, Temperature: 300, AvailSpare: 100, SpareThresh: 10,
		PercentUsed: 1, EnduranceCW: 2,
		DataUnitsRead: Uint128{Lo: 1, Hi: 2}, DataUnitsWritten: Uint128{Lo: 3}, HostReads: Uint128{Lo: 4},
		HostWrites: Uint128{Lo: 5}, CtrlBusyTime: Uint128{Lo: 6}, PowerCycles: Uint128{Lo: 7},
		PowerOnHours: Uint128{Lo: 8}, UnsafeShutdowns: Uint128{Lo: 9}, MediaErrors: Uint128{Lo: 10},
		NumErrLogEntries: Uint128{Lo: 11}, WarningTempTime: 12, CriticalTempTime: 13,
		TempSensor: [8]uint16{14, 0, 0, 0, 0, 0, 0, 15}}
	var b [SMARTLogSize]byte
	s.Marshal(&b)
	le := binary.LittleEndian
	// struct nvme_smart_log offsets.
	for _, c := range []struct {
		off  int
		want uint64
	}{{32, 1}, {40, 2}, {48, 3}, {64, 4}, {80, 5}, {96, 6}, {112, 7}, {128, 8}, {144, 9}, {160, 10}, {176, 11}} {
		if got := le.Uint64(b[c.off:]); got != c.want {
			t.Errorf("offset %d: %d, want %d", c.off, got, c.want)
		}
	}
	equalBytes(t, "head", b[:7], hexBytes(t, "08 2c 01 64 0a 01 02"))
	if le.Uint32(b[192:]) != 12 || le.Uint32(b[196:]) != 13 || le.Uint16(b[200:]) != 14 || le.Uint16(b[214:]) != 15 {
		t.Errorf("tail % x", b[192:216])
	}
	var back SMARTLog
	if err := back.Unmarshal(b[:]); err != nil || back != s {
		t.Fatalf("round trip %v", err)
	}
	for _, c := range []struct{ bytes, units uint64 }{{0, 0}, {1, 1}, {512, 1}, {512 * 1000, 1}, {512*1000 + 1, 2}} {
		if got := DataUnits(c.bytes); got != c.units {
			t.Errorf("DataUnits(%d) = %d, want %d", c.bytes, got, c.units)
		}
	}
}

func TestCommandEffectsLog(t *testing.T) {
	var l CommandEffectsLog
	l.ACS[AdminIdentify] = EffectsCSUPP
	l.IOCS[IOWrite] = EffectsCSUPP | EffectsLBCC
	var b [CommandEffectsLogSize]byte
	l.Marshal(&b)
	if binary.LittleEndian.Uint32(b[4*6:]) != 1 || binary.LittleEndian.Uint32(b[1024+4:]) != 3 {
		t.Fatalf("entries")
	}
	var back CommandEffectsLog
	if err := back.Unmarshal(b[:]); err != nil || back != l {
		t.Fatal("round trip")
	}
}

func TestAsyncEventResult(t *testing.T) {
	dw0 := AsyncEventResult(AERTypeNotice, AERNoticeNS, LogChangedNSList)
	if dw0 != 0x040002 {
		t.Fatalf("%#x", dw0)
	}
	if typ, info, lid := AsyncEvent(AsyncEventResult(AERTypeNotice, AERNoticeDisc, LogDiscovery)); typ != 2 || info != 0xF0 || lid != 0x70 {
		t.Fatalf("split %d %#x %#x", typ, info, lid)
	}
}

func TestRWFields(t *testing.T) {
	var c Command
	c.Opcode = uint8(IOWriteZeroes)
	c.SetRW(0x1_0000_0002, 65536, RWFUA|RWDEAC)
	var b [SQESize]byte
	_ = c.Marshal(&b)
	// struct nvme_write_zeroes_cmd: slba 40, length 48, control 50 (FUA
	// 1<<14, DEAC 1<<9).
	equalBytes(t, "cdw10-12", b[40:52], hexBytes(t, "02 00 00 00 01 00 00 00 | ff ff | 00 42"))
	if c.SLBA() != 0x1_0000_0002 || c.NLB() != 0xFFFF || c.Blocks() != 65536 || !c.FUA() || !c.DEAC() || c.PRINFO() != 0 {
		t.Fatalf("fields")
	}
	c.CDW12 = 0xF << 26
	if c.PRINFO() != 0xF {
		t.Fatalf("prinfo %d", c.PRINFO())
	}
	c.CDW10 = 255
	if c.DSMRanges() != 256 {
		t.Fatal("dsm ranges")
	}
	r := DSMRange{Attrs: 1, NLB: 8, SLBA: 0x1000}
	var rb [DSMRangeSize]byte
	r.Marshal(&rb)
	equalBytes(t, "range", rb[:], hexBytes(t, "01 00 00 00 | 08 00 00 00 | 00 10 00 00 00 00 00 00"))
	var back DSMRange
	if err := back.Unmarshal(rb[:]); err != nil || back != r {
		t.Fatal("range round trip")
	}
}

func TestFeatureCommand(t *testing.T) {
	f := FeatureCommand{FID: FeatureNumQueues, SV: true, CDW11: NumQueues(4, 2)}
	var c Command
	f.EncodeSet(&c)
	if c.Opcode != 0x09 || c.CDW10 != 0x80000007 || c.CDW11 != 0x00010003 {
		t.Fatalf("set %+v", c)
	}
	var back FeatureCommand
	back.Decode(&c)
	if !back.SV || back.FID != 7 || back.CDW11 != f.CDW11 {
		t.Fatalf("decode %+v", back)
	}
	if nsq, ncq := SplitNumQueues(back.CDW11); nsq != 4 || ncq != 2 {
		t.Fatalf("split %d %d", nsq, ncq)
	}
	g := FeatureCommand{FID: FeatureKeepAliveTimer, SEL: FeatureSelSupported}
	g.EncodeGet(&c)
	if c.Opcode != 0x0A || c.CDW10 != 0x30F {
		t.Fatalf("get %+v", c)
	}
	if thr, tm := InterruptCoalescing(0x0A05); thr != 5 || tm != 10 {
		t.Fatal("coalescing")
	}
}

// The ANA log as struct nvme_ana_rsp_hdr (chgcnt 0, ngrps 8) and struct
// nvme_ana_group_desc (grpid 0, nnsids 4, chgcnt 8, state 16, nsids 32)
// lay it out: descriptors packed, no padding after the NSID list.
func TestANALogLayout(t *testing.T) {
	l := ANALog{ChangeCount: 0x0102030405060708, Groups: []ANAGroupDesc{
		{GroupID: 1, ChangeCount: 9, State: ANAInaccessible, NSIDs: []uint32{1, 0x0a0b0c0d}},
		{GroupID: 2, ChangeCount: 10, State: ANAOptimized},
	}}
	if l.Size() != 16+32+8+32 {
		t.Fatalf("size %d", l.Size())
	}
	b := make([]byte, 100)
	for i := range b {
		b[i] = 0xEE
	}
	n, err := l.Marshal(b)
	if err != nil || n != 88 {
		t.Fatalf("marshal %d %v", n, err)
	}
	equalBytes(t, "page", b[:n], hexBytes(t,
		"08 07 06 05 04 03 02 01 | 02 00 | 00 00 00 00 00 00"+
			"| 01 00 00 00 | 02 00 00 00 | 09 00 00 00 00 00 00 00 | 03 | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"+
			"| 01 00 00 00 | 0d 0c 0b 0a"+
			"| 02 00 00 00 | 00 00 00 00 | 0a 00 00 00 00 00 00 00 | 01 | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"))
	if b[n] != 0xEE {
		t.Fatalf("wrote past the page")
	}
	var back ANALog
	if err := back.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if back.ChangeCount != l.ChangeCount || len(back.Groups) != 2 ||
		back.Groups[0].GroupID != 1 || back.Groups[0].State != ANAInaccessible ||
		!slicesEqual(back.Groups[0].NSIDs, l.Groups[0].NSIDs) || back.Groups[1].NSIDs != nil ||
		back.Groups[1].ChangeCount != 10 || back.Groups[1].State != ANAOptimized {
		t.Fatalf("round trip %+v", back)
	}
	if _, err := l.Marshal(b[:87]); err != ErrShortBuffer {
		t.Fatalf("short marshal: %v", err)
	}
	// A page cut inside a descriptor or its NSIDs is refused, not read
	// past its end.
	for _, cut := range []int{15, 47, 52, 84} {
		err := back.Unmarshal(b[:cut])
		if (cut < 16 && err != ErrShortBuffer) || (cut >= 16 && err != ErrANALog) {
			t.Errorf("cut at %d: %v", cut, err)
		}
	}
	// A huge NSID count does not allocate before it is checked.
	binary.LittleEndian.PutUint32(b[20:], 0xFFFFFFFF)
	if err := back.Unmarshal(b[:n]); err != ErrANALog {
		t.Fatalf("huge nnsids: %v", err)
	}
}

func TestANAState(t *testing.T) {
	for _, c := range []struct {
		s     ANAState
		valid bool
		st    Status
		name  string
	}{
		{ANAOptimized, true, StatusSuccess, "optimized"},
		{ANANonOptimized, true, StatusSuccess, "non-optimized"},
		{ANAInaccessible, true, StatusANAInaccessible, "inaccessible"},
		{ANAPersistentLoss, true, StatusANAPersistentLoss, "persistent-loss"},
		{ANAChange, true, StatusANATransition, "change"},
		{0, false, StatusSuccess, "ana-state(0)"},
		{5, false, StatusSuccess, "ana-state(5)"},
	} {
		if c.s.Valid() != c.valid || c.s.IOStatus() != c.st || c.s.String() != c.name {
			t.Errorf("%#x: valid %v status %v name %q", uint8(c.s), c.s.Valid(), c.s.IOStatus(), c.s.String())
		}
		// Path Related (SCT 3h), no DNR: the host retries elsewhere.
		if st := c.s.IOStatus(); st != StatusSuccess && (st.SCT() != 3 || st.DNR()) {
			t.Errorf("%v: status %#x", c.s, uint16(st))
		}
	}
}

func slicesEqual(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

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

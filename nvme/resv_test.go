package nvme

import (
	"bytes"
	"testing"
)

func TestResvCDW10(t *testing.T) {
	var c Command
	c.SetResv(RREGAReplace, true, 0, CPTPLSet)
	if c.CDW10 != 0xC000000A || c.ResvAction() != RREGAReplace || !c.ResvIEKEY() || c.ResvCPTPL() != CPTPLSet {
		t.Fatalf("register CDW10 %#x", c.CDW10)
	}
	c.SetResv(RACQAPreemptAndAbort, false, 6, 0)
	if c.CDW10 != 0x602 || c.ResvAction() != 2 || c.ResvIEKEY() || c.ResvType() != 6 || c.ResvCPTPL() != 0 {
		t.Fatalf("acquire CDW10 %#x", c.CDW10)
	}
	// The Linux host's pr_register: RREGA 0, CPTPL 11b always.
	c.CDW10 = 3 << 30
	if c.ResvAction() != RREGARegister || c.ResvCPTPL() != CPTPLSet {
		t.Fatalf("linux register %#x", c.CDW10)
	}
	c.CDW10, c.CDW11 = 0x3F, 1
	if c.ResvReportLength() != 256 || !c.ResvReportEDS() {
		t.Fatalf("report %d %v", c.ResvReportLength(), c.ResvReportEDS())
	}
}

func TestResvKeys(t *testing.T) {
	k := ResvKeys{CRKEY: 0x0102030405060708, Key2: 0x1112131415161718}
	var b [ResvDataSize]byte
	k.Marshal(&b)
	want := []byte{8, 7, 6, 5, 4, 3, 2, 1, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("marshal %x", b)
	}
	var got ResvKeys
	if err := got.Unmarshal(b[:]); err != nil || got != k {
		t.Fatalf("unmarshal %+v %v", got, err)
	}
	got.Key2 = 99
	if err := got.Unmarshal(b[:ResvReleaseDataSize]); err != nil || got.CRKEY != k.CRKEY || got.Key2 != 0 {
		t.Fatalf("release data %+v %v", got, err)
	}
	if err := got.Unmarshal(b[:7]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
}

func TestResvNotifLog(t *testing.T) {
	l := ResvNotifLog{Count: 0x0102030405060708, Type: ResvNotifReservationPreempted, Available: 5, NSID: 1}
	var b [ResvNotifLogSize]byte
	for i := range b {
		b[i] = 0xEE
	}
	l.Marshal(&b)
	want := make([]byte, 64)
	copy(want, []byte{8, 7, 6, 5, 4, 3, 2, 1, 3, 5, 0, 0, 1, 0, 0, 0})
	if !bytes.Equal(b[:], want) {
		t.Fatalf("marshal %x", b)
	}
	var got ResvNotifLog
	if err := got.Unmarshal(b[:]); err != nil || got != l {
		t.Fatalf("unmarshal %+v %v", got, err)
	}
	if err := got.Unmarshal(b[:63]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
	if a := testing.AllocsPerRun(100, func() { l.Marshal(&b); _ = got.Unmarshal(b[:]) }); a != 0 {
		t.Fatalf("allocs %.1f", a)
	}
}

func FuzzResvWire(f *testing.F) {
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		var k ResvKeys
		if k.Unmarshal(data) == nil && len(data) >= ResvDataSize {
			var b [ResvDataSize]byte
			k.Marshal(&b)
			if !bytes.Equal(b[:], data[:ResvDataSize]) {
				t.Fatalf("keys round trip %x → %x", data[:16], b)
			}
		}
		var l ResvNotifLog
		if l.Unmarshal(data) == nil {
			var b [ResvNotifLogSize]byte
			l.Marshal(&b)
			var again ResvNotifLog
			if again.Unmarshal(b[:]) != nil || again != l {
				t.Fatalf("log round trip %+v %+v", l, again)
			}
		}
	})
}

package nvme

import "testing"

// The decoders and encoders the target runs per command allocate
// nothing either.
func TestZeroAllocsCommands(t *testing.T) {
	var c Command
	c.SetRW(7, 8, RWFUA)
	var ic IdentifyCommand
	var g GetLogPageCommand
	var f FeatureCommand
	var id IdentifyController
	var ns IdentifyNamespace
	var page [IdentifySize]byte
	var e ErrorLogEntry
	var eb [ErrorLogEntrySize]byte
	var r DSMRange
	var rb [DSMRangeSize]byte
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"rw fields", func() { _, _, _, _ = c.SLBA(), c.Blocks(), c.FUA(), c.DEAC() }},
		{"identify command", func() { ic.Decode(&c); ic.Encode(&c) }},
		{"get log page command", func() { g.Decode(&c); g.Encode(&c) }},
		{"feature command", func() { f.Decode(&c); f.EncodeSet(&c) }},
		{"identify controller", func() { id.Marshal(&page); _ = id.Unmarshal(page[:]) }},
		{"identify namespace", func() { ns.Marshal(&page); _ = ns.Unmarshal(page[:]) }},
		{"error log entry", func() { e.Marshal(&eb); _ = e.Unmarshal(eb[:]) }},
		{"dsm range", func() { r.Marshal(&rb); _ = r.Unmarshal(rb[:]) }},
	} {
		if n := testing.AllocsPerRun(100, tc.fn); n != 0 {
			t.Errorf("%s: %v allocations per run, want 0", tc.name, n)
		}
	}
}

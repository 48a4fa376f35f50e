package nvme

import "testing"

// The codec must not allocate: target and initiator encode and decode a
// capsule per I/O.
func TestZeroAllocs(t *testing.T) {
	cmd := Command{
		Opcode: uint8(IORead), Flags: FlagSGLMetaBuf, CID: 0x1001, NSID: 1,
		DPTR:  KeyedSGL(0x7f0000001000, 4096, 0x1234, true),
		CDW10: 0x1000, CDW12: 7,
	}
	var sqe [SQESize]byte
	var c2 Command
	cqe := Completion{DW0: 1, SQHead: 3, SQID: 1, CID: 0x1001, Status: StatusLBAOutOfRange.WithDNR()}
	var cqeb [CQESize]byte
	var q2 Completion
	var cd ConnectData
	cd.SubNQN, _ = MakeNQNField(DiscoveryNQN)
	cd.HostNQN, _ = MakeNQNField(testHostNQN)
	var cdb [ConnectDataSize]byte
	var cd2 ConnectData
	var cc ConnectCommand
	var pc PropertyCommand
	var cm RDMACMRequest
	var cmb [RDMACMRequestSize]byte

	cases := []struct {
		name string
		fn   func()
	}{
		{"SQE marshal", func() { _ = cmd.Marshal(&sqe) }},
		{"SQE unmarshal", func() { _ = c2.Unmarshal(sqe[:]) }},
		{"CQE marshal", func() { cqe.Marshal(&cqeb) }},
		{"CQE unmarshal", func() { _ = q2.Unmarshal(cqeb[:]) }},
		{"SGL error", func() { _ = (&Command{DPTR: KeyedSGL(0, 1<<24, 0, false)}).Marshal(&sqe) }},
		{"connect data", func() { cd.Marshal(&cdb); _ = cd2.Unmarshal(cdb[:]); _ = cd2.Validate() }},
		{"connect command", func() { cc.Encode(&c2); _ = cc.Decode(&c2) }},
		{"property command", func() {
			(&PropertyCommand{Set: true, Offset: PropCC, Value: 1}).Encode(&c2)
			_ = pc.Decode(&c2)
		}},
		{"cm request", func() { cm.Marshal(&cmb); _ = cm.Unmarshal(cmb[:]) }},
		{"validate nqn", func() { _ = ValidateNQN(testHostNQN) }},
		{"nqn equal", func() { _ = cd2.SubNQN.Equal(DiscoveryNQN) }},
	}
	for _, tc := range cases {
		if n := testing.AllocsPerRun(100, tc.fn); n != 0 {
			t.Errorf("%s: %v allocations per run, want 0", tc.name, n)
		}
	}
}

func BenchmarkSQERoundTrip(b *testing.B) {
	cmd := Command{Opcode: uint8(IOWrite), Flags: FlagSGLMetaBuf, CID: 1, NSID: 1,
		DPTR: KeyedSGL(0x1000, 4096, 0x1234, true), CDW10: 8}
	var buf [SQESize]byte
	var out Command
	b.ReportAllocs()
	for b.Loop() {
		_ = cmd.Marshal(&buf)
		_ = out.Unmarshal(buf[:])
	}
}

func BenchmarkCQERoundTrip(b *testing.B) {
	c := Completion{CID: 1, SQHead: 2, SQID: 1}
	var buf [CQESize]byte
	var out Completion
	b.ReportAllocs()
	for b.Loop() {
		c.Marshal(&buf)
		_ = out.Unmarshal(buf[:])
	}
}

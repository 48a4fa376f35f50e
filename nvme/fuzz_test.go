package nvme

import "testing"

// Decoding arbitrary bytes must never panic, and decode(encode(decode(x)))
// must equal decode(x): whatever a peer sends, what we decode re-encodes
// to the same meaning.

func FuzzCommand(f *testing.F) {
	f.Add(make([]byte, SQESize))
	f.Add([]byte{0x7f, 0x40, 0, 0, 1})
	seed := [SQESize]byte{0: 0x7f, 1: 0x40, 4: 1, 33: 0x04, 39: 0x4f, 44: 0x1f}
	f.Add(seed[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Command
		if err := c.Unmarshal(b); err != nil {
			if len(b) >= SQESize {
				t.Fatalf("unmarshal of %d bytes: %v", len(b), err)
			}
			return
		}
		var out [SQESize]byte
		if err := c.Marshal(&out); err != nil {
			t.Fatalf("re-marshal: %v", err) // a decoded keyed length always fits 24 bits
		}
		var c2 Command
		if err := c2.Unmarshal(out[:]); err != nil || c2 != c {
			t.Fatalf("unstable: %+v vs %+v", c, c2)
		}
		// The fabrics views must not panic either.
		var cc ConnectCommand
		_ = cc.Decode(&c)
		var pc PropertyCommand
		_ = pc.Decode(&c)
		_ = c.DataDirection()
	})
}

func FuzzCompletion(f *testing.F) {
	f.Add(make([]byte, CQESize))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0x4f, 0, 0x09, 0x83})
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Completion
		if err := c.Unmarshal(b); err != nil {
			if len(b) >= CQESize {
				t.Fatalf("unmarshal of %d bytes: %v", len(b), err)
			}
			return
		}
		var out [CQESize]byte
		c.Marshal(&out)
		// Every CQE bit is a field, so the bytes round-trip exactly.
		for i := range out {
			if out[i] != b[i] {
				t.Fatalf("byte %d: %#02x vs %#02x", i, out[i], b[i])
			}
		}
		_ = c.Status.String()
	})
}

func FuzzConnectData(f *testing.F) {
	var seed [ConnectDataSize]byte
	d := ConnectData{CNTLID: CNTLIDDynamic}
	d.SubNQN, _ = MakeNQNField(DiscoveryNQN)
	d.HostNQN, _ = MakeNQNField(testHostNQN)
	d.Marshal(&seed)
	f.Add(seed[:])
	f.Add(make([]byte, 100))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d ConnectData
		if err := d.Unmarshal(b); err != nil {
			if len(b) >= ConnectDataSize {
				t.Fatalf("unmarshal of %d bytes: %v", len(b), err)
			}
			return
		}
		_ = d.Validate()
		_ = d.SubNQN.String()
		var out [ConnectDataSize]byte
		d.Marshal(&out)
		var d2 ConnectData
		if err := d2.Unmarshal(out[:]); err != nil || d2 != d {
			t.Fatal("unstable connect data")
		}
	})
}

func FuzzValidateNQN(f *testing.F) {
	f.Add(DiscoveryNQN)
	f.Add(testHostNQN)
	f.Add("nqn.2026-13.x")
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidateNQN(s)
		if err == nil && (len(s) > MaxNQNLen || len(s) < 13 || s[:4] != "nqn.") {
			t.Fatalf("accepted %q", s)
		}
	})
}

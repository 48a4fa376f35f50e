package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"reflect"
	"testing"
)

// TestKeyFormat: keys round-trip through the DHHC-1 format; the secret
// blktests uses (nvme/041, made by nvme gen-dhchap-key) parses; bad
// prefixes, transformations, lengths and checksums are refused.
func TestKeyFormat(t *testing.T) {
	k, err := ParseKey("DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:")
	if err != nil {
		t.Fatalf("an nvme gen-dhchap-key secret: %v", err)
	}
	if k.Transform != 0 || len(k.Secret) != 32 {
		t.Fatalf("parsed %v, %d bytes", k.Transform, len(k.Secret))
	}
	for _, tc := range []struct {
		t HashID
		n int
	}{{0, 32}, {0, 48}, {0, 64}, {SHA256, 32}, {SHA384, 48}, {SHA512, 64}} {
		k, err := GenerateKey(tc.t, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseKey(k.Encode())
		if err != nil || back.Transform != k.Transform || !bytes.Equal(back.Secret, k.Secret) {
			t.Fatalf("round trip of %s: %+v, %v", k, back, err)
		}
		if _, err := ParseKey(k.Encode()[:len(k.Encode())-1]); err != nil {
			t.Fatalf("without the trailing colon: %v", err)
		}
	}
	if _, err := GenerateKey(SHA256, 64); err == nil {
		t.Fatal("a 64-byte key with a SHA-256 transformation")
	}
	good, _ := GenerateKey(0, 32)
	s := good.Encode()
	flip := []byte(s)
	// Another valid base64 character in the secret's part: it changes at
	// most 6 bits within two bytes, which CRC-32 always detects.
	if flip[12] == 'A' {
		flip[12] = 'B'
	} else {
		flip[12] = 'A'
	}
	for in, want := range map[string]error{
		"":                          ErrKeyFormat,
		"DHHC-2:00:" + s[10:]:       ErrKeyFormat,
		"DHHC-1:04:" + s[10:]:       ErrKeyFormat,
		"DHHC-1:00:AAAA:":           ErrKeyFormat,
		"DHHC-1:03:" + s[10:]:       ErrKeyFormat, // 32 bytes with a SHA-512 transformation
		"DHHC-1:00:!!not base64!!:": ErrKeyFormat,
		string(flip):                ErrKeyCRC,
	} {
		if _, err := ParseKey(in); !errors.Is(err, want) {
			t.Errorf("ParseKey(%q): %v, want %v", in, err, want)
		}
	}
}

// TestTransformed: an untransformed key is used as is; a transformed one is
// HMAC(secret, NQN || "NVMe-over-Fabrics") with its hash.
func TestTransformed(t *testing.T) {
	k, _ := GenerateKey(0, 32)
	if !bytes.Equal(k.Transformed("nqn.x"), k.Secret) {
		t.Fatal("transform 00 changed the key")
	}
	k.Transform = SHA256
	m := hmac.New(sha256.New, k.Secret)
	m.Write([]byte("nqn.2014-08.org.nvmexpress:uuid:1NVMe-over-Fabrics"))
	if got := k.Transformed("nqn.2014-08.org.nvmexpress:uuid:1"); !bytes.Equal(got, m.Sum(nil)) {
		t.Fatal("transform 01 is not HMAC-SHA-256(secret, nqn || \"NVMe-over-Fabrics\")")
	}
}

// TestMessages: every message round-trips, its layout is the Linux one
// (sizes and key offsets), and short or mistyped buffers are refused.
func TestMessages(t *testing.T) {
	n := Negotiate{TID: 7, Hashes: []HashID{SHA256, SHA384, SHA512}, DHGroups: []DHGroup{DHNull, FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192}}
	b, err := n.Marshal()
	if err != nil || len(b) != 72 || b[0] != 0x00 || b[1] != 0x00 || b[7] != 1 || b[8] != 1 || b[10] != 3 || b[11] != 6 || b[12] != 1 || b[42] != 0 || b[43] != 1 {
		t.Fatalf("negotiate bytes % x (%v)", b, err)
	}
	if back, err := UnmarshalNegotiate(b); err != nil || !reflect.DeepEqual(back, n) {
		t.Fatalf("negotiate: %+v, %v", back, err)
	}

	c := Challenge{TID: 7, Hash: SHA256, DHGroup: FFDHE2048, SeqNum: 42, C: bytes.Repeat([]byte{0xc1}, 32), DHValue: bytes.Repeat([]byte{0xd1}, 256)}
	b, _ = c.Marshal()
	if len(b) != 16+32+256 || b[0] != 1 || b[1] != 1 || b[6] != 32 || b[8] != 1 || b[9] != 1 || b[10] != 0 || b[11] != 1 {
		t.Fatalf("challenge header % x", b[:16])
	}
	if back, err := UnmarshalChallenge(b); err != nil || !reflect.DeepEqual(back, c) {
		t.Fatalf("challenge: %+v, %v", back, err)
	}

	r := Reply{TID: 7, Response: bytes.Repeat([]byte{0xa1}, 48), CValid: true, SeqNum: 9, C2: bytes.Repeat([]byte{0xc2}, 48), DHValue: []byte{1, 2, 3}}
	b, _ = r.Marshal()
	if len(b) != 16+2*48+3 || b[1] != 2 || b[8] != 1 {
		t.Fatalf("reply header % x", b[:16])
	}
	if back, err := UnmarshalReply(b); err != nil || !reflect.DeepEqual(back, r) {
		t.Fatalf("reply: %+v, %v", back, err)
	}

	s1 := Success1{TID: 7, HashLen: 32, RValid: true, Response: bytes.Repeat([]byte{0x51}, 32)}
	b, _ = s1.Marshal()
	if len(b) != 48 || b[1] != 3 || b[8] != 1 {
		t.Fatalf("success1 % x", b)
	}
	if back, err := UnmarshalSuccess1(b); err != nil || !reflect.DeepEqual(back, s1) {
		t.Fatalf("success1: %+v, %v", back, err)
	}
	if back, err := UnmarshalSuccess2(Success2{TID: 7}.Marshal()); err != nil || back.TID != 7 {
		t.Fatalf("success2: %+v, %v", back, err)
	}
	f := Failure{TID: 7, FromHost: true, Explanation: FailHashUnusable}
	b = f.Marshal()
	if len(b) != 8 || b[0] != 0 || b[1] != 0xf0 || b[6] != 1 || b[7] != 4 {
		t.Fatalf("failure2 % x", b)
	}
	if back, err := UnmarshalFailure(b); err != nil || back != f {
		t.Fatalf("failure: %+v, %v", back, err)
	}

	// Truncated and mistyped.
	full, _ := c.Marshal()
	for _, in := range [][]byte{nil, full[:15], full[:16+31], full[:len(full)-1]} {
		if _, err := UnmarshalChallenge(in); !errors.Is(err, ErrMessage) {
			t.Errorf("challenge of %d bytes: %v", len(in), err)
		}
	}
	if _, err := UnmarshalReply(full); !errors.Is(err, ErrMessage) {
		t.Errorf("a challenge decoded as a reply: %v", err)
	}
	neg, _ := n.Marshal()
	neg[7] = 2 // two descriptors announced, one present
	if _, err := UnmarshalNegotiate(neg); !errors.Is(err, ErrMessage) {
		t.Errorf("negotiate with a missing descriptor: %v", err)
	}
}

// FuzzUnmarshal: no input makes a decoder panic, and what a decoder
// accepts re-encodes to a message it decodes to the same value.
func FuzzUnmarshal(f *testing.F) {
	for _, m := range []interface{ Marshal() ([]byte, error) }{
		Negotiate{TID: 1, Hashes: []HashID{SHA256}, DHGroups: []DHGroup{DHNull}},
		Challenge{TID: 2, Hash: SHA256, C: make([]byte, 32)},
		Reply{TID: 3, Response: make([]byte, 32)},
		Success1{TID: 4, HashLen: 32},
	} {
		b, _ := m.Marshal()
		f.Add(b)
	}
	f.Add(Success2{TID: 5}.Marshal())
	f.Add(Failure{TID: 6}.Marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := UnmarshalNegotiate(b); err == nil {
			if e, err := v.Marshal(); err != nil {
				t.Fatalf("negotiate %+v does not re-encode: %v", v, err)
			} else if w, err := UnmarshalNegotiate(e); err != nil || !reflect.DeepEqual(v, w) {
				t.Fatalf("negotiate %+v -> %+v, %v", v, w, err)
			}
		}
		if v, err := UnmarshalChallenge(b); err == nil {
			if e, err := v.Marshal(); err == nil {
				if w, err := UnmarshalChallenge(e); err != nil || !reflect.DeepEqual(v, w) {
					t.Fatalf("challenge %+v -> %+v, %v", v, w, err)
				}
			}
		}
		if v, err := UnmarshalReply(b); err == nil {
			if e, err := v.Marshal(); err == nil {
				if w, err := UnmarshalReply(e); err != nil || !reflect.DeepEqual(v, w) {
					t.Fatalf("reply %+v -> %+v, %v", v, w, err)
				}
			}
		}
		if v, err := UnmarshalSuccess1(b); err == nil {
			if e, err := v.Marshal(); err == nil {
				if w, err := UnmarshalSuccess1(e); err != nil || !reflect.DeepEqual(v, w) {
					t.Fatalf("success1 %+v -> %+v, %v", v, w, err)
				}
			}
		}
		_, _ = UnmarshalSuccess2(b)
		_, _ = UnmarshalFailure(b)
		_, _, _ = Kind(b)
	})
}

package auth

import (
	"bytes"
	"errors"
	"math/big"
	"testing"
)

// The ffdhe primes built from RFC 7919's definition are safe primes with
// the RFC's shape: 64 leading and 64 trailing one bits, and e's binary
// expansion (0xADF85458A2BB4A9A...) right after the leading ones.
func TestGroupsAreSafePrimes(t *testing.T) {
	for g, d := range groupDefs {
		gp := params(g)
		p := gp.p
		if p.BitLen() != d.bits || gp.size != d.bits/8 {
			t.Fatalf("%v: %d bits", g, p.BitLen())
		}
		b := p.FillBytes(make([]byte, gp.size))
		ones := bytes.Repeat([]byte{0xff}, 8)
		if !bytes.Equal(b[:8], ones) || !bytes.Equal(b[len(b)-8:], ones) {
			t.Fatalf("%v: %x...%x", g, b[:8], b[len(b)-8:])
		}
		if !bytes.Equal(b[8:16], []byte{0xad, 0xf8, 0x54, 0x58, 0xa2, 0xbb, 0x4a, 0x9a}) {
			t.Fatalf("%v: bits after the leading ones %x, want e's", g, b[8:16])
		}
		q := new(big.Int).Rsh(p, 1)
		if testing.Short() && d.bits > 3072 {
			continue
		}
		if !p.ProbablyPrime(1) || !q.ProbablyPrime(1) {
			t.Fatalf("%v (X = %d) is not a safe prime", g, d.x)
		}
	}
}

func TestDHAgreement(t *testing.T) {
	for _, g := range []DHGroup{FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192} {
		a, err := GenerateDH(g, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := GenerateDH(g, nil)
		if len(a.Public) != g.ValueSize() {
			t.Fatalf("%v: public value of %d bytes", g, len(a.Public))
		}
		za, err := a.Shared(b.Public)
		if err != nil {
			t.Fatal(err)
		}
		zb, _ := b.Shared(a.Public)
		if !bytes.Equal(za, zb) || len(za) != g.ValueSize() {
			t.Fatalf("%v: shared secrets differ", g)
		}
		bad := [][]byte{
			a.Public[1:],                                             // short
			make([]byte, g.ValueSize()),                              // 0
			append(make([]byte, g.ValueSize()-1), 1),                 // 1
			params(g).pMinus1.FillBytes(make([]byte, g.ValueSize())), // p-1: order 2
			params(g).p.FillBytes(make([]byte, g.ValueSize())),
		}
		for i, v := range bad {
			if _, err := a.Shared(v); !errors.Is(err, ErrDHValue) {
				t.Errorf("%v: bad value %d accepted: %v", g, i, err)
			}
		}
	}
	if _, err := GenerateDH(DHNull, nil); err == nil {
		t.Fatal("a DH key in the null group")
	}
}

// BenchmarkExchange is one whole DH-HMAC-CHAP transaction (host and
// controller sides, in memory) per op, per DH group: the CPU a queue's
// authentication costs both ends together.
func BenchmarkExchange(b *testing.B) {
	hk, _ := GenerateKey(SHA256, 32)
	for _, g := range []DHGroup{DHNull, FFDHE2048, FFDHE4096, FFDHE8192} {
		b.Run(g.String(), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				s := NewCtrlSession(Config{HostNQN: "nqn.h", SubNQN: "nqn.s", HostKey: hk, DHGroups: []DHGroup{g}})
				if _, _, err := Authenticate(Config{HostNQN: "nqn.h", SubNQN: "nqn.s", HostKey: hk}, 1, benchPipe{s}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type benchPipe struct{ s *CtrlSession }

func (p benchPipe) AuthSend(b []byte) error            { return p.s.Send(b) }
func (p benchPipe) AuthReceive(al int) ([]byte, error) { return p.s.Receive(al) }

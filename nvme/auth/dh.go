package auth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sync"
)

// The ffdhe groups of RFC 7919 (appendix A), generator 2. Each prime is
//
//	p = 2^b - 2^(b-64) + (floor(2^(b-130) * e) + X) * 2^64 - 1
//
// with X the smallest offset that makes p a safe prime. The primes are
// computed from that definition on first use (e to b bits by its series:
// microseconds) instead of being carried as hex; TestGroupsAreSafePrimes
// checks each is a safe prime with the RFC's leading and trailing 64 ones.
var groupDefs = map[DHGroup]struct {
	bits, x  int
	privBits int // private exponent: twice the group's security strength (SP 800-56A, as Linux)
}{
	FFDHE2048: {2048, 560316, 2 * 112},
	FFDHE3072: {3072, 2625351, 2 * 128},
	FFDHE4096: {4096, 5736041, 2 * 152},
	FFDHE6144: {6144, 15705020, 2 * 176},
	FFDHE8192: {8192, 10965728, 2 * 200},
}

type groupParams struct {
	p, pMinus1 *big.Int
	size       int // bytes of p: the length of public values and of the shared secret
	privBits   int
}

var (
	groupsOnce sync.Once
	groups     map[DHGroup]*groupParams
)

// eScaled returns floor(e * 2^n), from e = sum 1/k!, with 64 guard bits
// so that the truncation of each term cannot reach bit 0.
func eScaled(n uint) *big.Int {
	const guard = 64
	one := new(big.Int).Lsh(big.NewInt(1), n+guard)
	sum := new(big.Int).Set(one) // 1/0!
	term := new(big.Int).Set(one)
	for k := int64(1); term.Sign() > 0; k++ {
		term.Quo(term, big.NewInt(k))
		sum.Add(sum, term)
	}
	return sum.Rsh(sum, guard)
}

func initGroups() {
	groups = make(map[DHGroup]*groupParams, len(groupDefs))
	for g, d := range groupDefs {
		b := uint(d.bits)
		p := new(big.Int).Lsh(big.NewInt(1), b)
		p.Sub(p, new(big.Int).Lsh(big.NewInt(1), b-64))
		mid := eScaled(b - 130)
		mid.Add(mid, big.NewInt(int64(d.x)))
		p.Add(p, mid.Lsh(mid, 64))
		p.Sub(p, big.NewInt(1))
		groups[g] = &groupParams{p: p, pMinus1: new(big.Int).Sub(p, big.NewInt(1)), size: d.bits / 8, privBits: d.privBits}
	}
}

func params(g DHGroup) *groupParams {
	groupsOnce.Do(initGroups)
	return groups[g]
}

// Known reports whether g is a group this package implements (DHNull
// included).
func (g DHGroup) Known() bool { return g == DHNull || params(g) != nil }

// ValueSize is the length of g's public values and shared secret in bytes
// (0 for DHNull).
func (g DHGroup) ValueSize() int {
	if p := params(g); p != nil {
		return p.size
	}
	return 0
}

// ErrDHValue is a peer's public value that is not one: the wrong length,
// or outside 1 < y < p-1.
var ErrDHValue = errors.New("auth: bad DH public value")

// DHKey is one side's ephemeral Diffie-Hellman key.
type DHKey struct {
	g      DHGroup
	x      *big.Int
	Public []byte // g^x mod p, big-endian, ValueSize bytes
}

// GenerateDH makes an ephemeral key in g from rnd (crypto/rand when nil).
func GenerateDH(g DHGroup, rnd io.Reader) (*DHKey, error) {
	gp := params(g)
	if gp == nil {
		return nil, fmt.Errorf("auth: no DH group %v", g)
	}
	if rnd == nil {
		rnd = rand.Reader
	}
	buf := make([]byte, (gp.privBits+7)/8)
	if _, err := io.ReadFull(rnd, buf); err != nil {
		return nil, err
	}
	x := new(big.Int).SetBytes(buf)
	x.SetBit(x, gp.privBits-1, 1) // full length: the exponent's strength is not left to chance
	y := new(big.Int).Exp(big.NewInt(2), x, gp.p)
	return &DHKey{g: g, x: x, Public: y.FillBytes(make([]byte, gp.size))}, nil
}

// Shared returns the session key: the peer's public value raised to the
// private exponent, big-endian, ValueSize bytes (as Linux pads it). The
// peer's value must have exactly ValueSize bytes and lie in 1 < y < p-1;
// that rules out the elements of order 1 and 2. (An element of order 2q
// reveals at most the exponent's lowest bit; the full subgroup check, a
// second exponentiation of the group's size, is not made, as Linux
// outside FIPS mode.)
func (k *DHKey) Shared(peer []byte) ([]byte, error) {
	gp := params(k.g)
	if len(peer) != gp.size {
		return nil, fmt.Errorf("%w: %d bytes, want %d for %v", ErrDHValue, len(peer), gp.size, k.g)
	}
	y := new(big.Int).SetBytes(peer)
	if y.Cmp(big.NewInt(1)) <= 0 || y.Cmp(gp.pMinus1) >= 0 {
		return nil, fmt.Errorf("%w: outside 1 < y < p-1", ErrDHValue)
	}
	z := new(big.Int).Exp(y, k.x, gp.p)
	return z.FillBytes(make([]byte, gp.size)), nil
}

func (g DHGroup) String() string {
	switch g {
	case DHNull:
		return "null"
	case FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192:
		return fmt.Sprintf("ffdhe%d", groupDefs[g].bits)
	}
	return fmt.Sprintf("dhgroup(%#x)", uint8(g))
}

// ParseDHGroup reads a group's name as String writes it ("null",
// "ffdhe2048", ...).
func ParseDHGroup(s string) (DHGroup, error) {
	for _, g := range []DHGroup{DHNull, FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192} {
		if s == g.String() {
			return g, nil
		}
	}
	return dhgInvalid, fmt.Errorf("auth: DH group %q: want null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192", s)
}

// ParseHash reads a hash's name as String writes it ("sha256", ...).
func ParseHash(s string) (HashID, error) {
	for _, h := range []HashID{SHA256, SHA384, SHA512} {
		if s == h.String() {
			return h, nil
		}
	}
	return 0, fmt.Errorf("auth: hash %q: want sha256, sha384 or sha512", s)
}

// Package auth holds the wire side of NVMe in-band authentication,
// DH-HMAC-CHAP (NVMe Base Specification 2.0, section 8.13): the secret
// format hosts and controllers share ("DHHC-1:…", as nvme-cli's
// gen-dhchap-key writes it), the key transformation, and the AUTH_SEND /
// AUTH_RECEIVE payloads (negotiate, challenge, reply, success1, success2,
// failure1/2), byte-exact with the Linux host and target
// (include/linux/nvme.h). The protocol itself (who sends what when, the
// hashes) builds on it.
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"strings"
)

// HashID names a DH-HMAC-CHAP hash function.
type HashID uint8

// Hash functions (NVME_AUTH_HASH_*).
const (
	SHA256 HashID = 0x01
	SHA384 HashID = 0x02
	SHA512 HashID = 0x03
)

// Size is the hash's output length in bytes (0 for an unknown hash).
func (h HashID) Size() int {
	switch h {
	case SHA256:
		return 32
	case SHA384:
		return 48
	case SHA512:
		return 64
	}
	return 0
}

// New returns the hash's constructor (nil for an unknown hash).
func (h HashID) New() func() hash.Hash {
	switch h {
	case SHA256:
		return sha256.New
	case SHA384:
		return sha512.New384
	case SHA512:
		return sha512.New
	}
	return nil
}

func (h HashID) String() string {
	switch h {
	case SHA256:
		return "sha256"
	case SHA384:
		return "sha384"
	case SHA512:
		return "sha512"
	}
	return fmt.Sprintf("hash(%#x)", uint8(h))
}

// DHGroup names a finite-field Diffie-Hellman group (NVME_AUTH_DHGROUP_*).
type DHGroup uint8

// Diffie-Hellman groups: none, or the RFC 7919 ffdhe groups.
const (
	DHNull     DHGroup = 0x00
	FFDHE2048  DHGroup = 0x01
	FFDHE3072  DHGroup = 0x02
	FFDHE4096  DHGroup = 0x03
	FFDHE6144  DHGroup = 0x04
	FFDHE8192  DHGroup = 0x05
	dhgInvalid DHGroup = 0xff
)

// Errors of key parsing.
var (
	ErrKeyFormat = errors.New("auth: not a DHHC-1 secret")
	ErrKeyCRC    = errors.New("auth: DHHC-1 secret checksum mismatch")
)

// Key is a DH-HMAC-CHAP secret: its bytes, and the hash the secret is to be
// transformed with before use (0: used as is).
type Key struct {
	Transform HashID
	Secret    []byte
}

// ParseKey reads a secret in the DHHC-1 format: "DHHC-1:XX:BASE64:" where
// XX is the transformation hash (00 none, 01 SHA-256, 02 SHA-384, 03
// SHA-512) and BASE64 encodes the 32, 48 or 64 secret bytes followed by
// their CRC-32 (IEEE, little-endian). The trailing colon is optional.
func ParseKey(s string) (Key, error) {
	rest, ok := strings.CutPrefix(s, "DHHC-1:")
	if !ok || len(rest) < 3 || rest[2] != ':' {
		return Key{}, fmt.Errorf("%w: want DHHC-1:XX:BASE64: (nvme gen-dhchap-key writes it)", ErrKeyFormat)
	}
	var t HashID
	switch rest[:2] {
	case "00":
	case "01":
		t = SHA256
	case "02":
		t = SHA384
	case "03":
		t = SHA512
	default:
		return Key{}, fmt.Errorf("%w: transformation %q, want 00, 01, 02 or 03", ErrKeyFormat, rest[:2])
	}
	b64 := strings.TrimSuffix(rest[3:], ":")
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return Key{}, fmt.Errorf("%w: %v", ErrKeyFormat, err)
	}
	n := len(raw) - 4
	if n != 32 && n != 48 && n != 64 {
		return Key{}, fmt.Errorf("%w: %d secret bytes, want 32, 48 or 64", ErrKeyFormat, max(n, 0))
	}
	if t != 0 && n != t.Size() {
		return Key{}, fmt.Errorf("%w: %d secret bytes for a %v transformation, want %d", ErrKeyFormat, n, t, t.Size())
	}
	if binary.LittleEndian.Uint32(raw[n:]) != crc32.ChecksumIEEE(raw[:n]) {
		return Key{}, ErrKeyCRC
	}
	return Key{Transform: t, Secret: raw[:n]}, nil
}

// String names the key without revealing it ("DHHC-1:01:<secret>"), so
// that a key printed by mistake leaks nothing.
func (k Key) String() string {
	return fmt.Sprintf("DHHC-1:%02x:<secret>", uint8(k.Transform))
}

// Encode formats k as ParseKey reads it. It is the secret itself: it goes
// to the registry and to the operator who asked for it, never to a log.
func (k Key) Encode() string {
	raw := make([]byte, len(k.Secret)+4)
	copy(raw, k.Secret)
	binary.LittleEndian.PutUint32(raw[len(k.Secret):], crc32.ChecksumIEEE(k.Secret))
	return fmt.Sprintf("DHHC-1:%02x:%s:", uint8(k.Transform), base64.StdEncoding.EncodeToString(raw))
}

// GenerateKey makes a random secret of n bytes (32, 48 or 64) to be
// transformed with t (0 for none; else n must be t's size).
func GenerateKey(t HashID, n int) (Key, error) {
	if n != 32 && n != 48 && n != 64 {
		return Key{}, fmt.Errorf("auth: key length %d, want 32, 48 or 64", n)
	}
	if t != 0 && t.Size() != n {
		return Key{}, fmt.Errorf("auth: key length %d for a %v transformation, want %d", n, t, t.Size())
	}
	k := Key{Transform: t, Secret: make([]byte, n)}
	if _, err := rand.Read(k.Secret); err != nil {
		return Key{}, err
	}
	return k, nil
}

// Transformed returns the key as the protocol uses it for nqn (the host's
// NQN for a host key, the subsystem's for a controller key): the secret
// itself when Transform is 0, else HMAC-Transform(secret, nqn ||
// "NVMe-over-Fabrics").
func (k Key) Transformed(nqn string) []byte {
	if k.Transform == 0 {
		return append([]byte(nil), k.Secret...)
	}
	m := hmac.New(k.Transform.New(), k.Secret)
	m.Write([]byte(nqn))
	m.Write([]byte("NVMe-over-Fabrics"))
	return m.Sum(nil)
}

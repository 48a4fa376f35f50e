package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"io"
)

// The DH-HMAC-CHAP computations (NVMe Base Specification 2.0 §8.13.5.5,
// byte for byte as drivers/nvme/host/auth.c and target/auth.c make them).
//
// With a DH group, a challenge C is first augmented with the session key
// Z: Ca = HMAC_H(H(Z), C). The host's response to the controller's
// challenge C1 with sequence number S1 in transaction T is
//
//	R1 = HMAC_H(Kh, Ca1 || S1 (le32) || T (le16) || SC_C || "HostHost" || HostNQN || 0x00 || SubNQN)
//
// with Kh the host key transformed for the host NQN; the controller's
// response to the host's challenge C2 is
//
//	R2 = HMAC_H(Kc, Ca2 || S2 (le32) || T (le16) || 0x00 || "Controller" || SubNQN || 0x00 || HostNQN)
//
// with Kc the controller key transformed for the subsystem NQN.

// augment returns the challenge as the response hashes it: itself without
// a session key, else HMAC_H(H(sessKey), c).
func augment(h HashID, sessKey, c []byte) []byte {
	if sessKey == nil {
		return c
	}
	d := h.New()()
	d.Write(sessKey)
	m := hmac.New(h.New(), d.Sum(nil))
	m.Write(c)
	return m.Sum(nil)
}

// HostResponse computes R1 (above). sessKey is nil without a DH group.
func HostResponse(h HashID, key Key, c1, sessKey []byte, s1 uint32, tid uint16, scc uint8, hostNQN, subNQN string) []byte {
	m := hmac.New(h.New(), key.Transformed(hostNQN))
	m.Write(augment(h, sessKey, c1))
	var b [7]byte
	binary.LittleEndian.PutUint32(b[:], s1)
	binary.LittleEndian.PutUint16(b[4:], tid)
	b[6] = scc
	m.Write(b[:])
	m.Write([]byte("HostHost"))
	m.Write([]byte(hostNQN))
	m.Write([]byte{0})
	m.Write([]byte(subNQN))
	return m.Sum(nil)
}

// CtrlResponse computes R2 (above). sessKey is nil without a DH group.
func CtrlResponse(h HashID, key Key, c2, sessKey []byte, s2 uint32, tid uint16, hostNQN, subNQN string) []byte {
	m := hmac.New(h.New(), key.Transformed(subNQN))
	m.Write(augment(h, sessKey, c2))
	var b [7]byte
	binary.LittleEndian.PutUint32(b[:], s2)
	binary.LittleEndian.PutUint16(b[4:], tid)
	m.Write(b[:])
	m.Write([]byte("Controller"))
	m.Write([]byte(subNQN))
	m.Write([]byte{0})
	m.Write([]byte(hostNQN))
	return m.Sum(nil)
}

// random fills n bytes from rnd (crypto/rand when nil).
func random(rnd io.Reader, n int) ([]byte, error) {
	if rnd == nil {
		rnd = rand.Reader
	}
	b := make([]byte, n)
	_, err := io.ReadFull(rnd, b)
	return b, err
}

// seqNum draws a nonzero sequence number (0 means "no challenge" in a
// reply).
func seqNum(rnd io.Reader) (uint32, error) {
	for {
		b, err := random(rnd, 4)
		if err != nil {
			return 0, err
		}
		if s := binary.LittleEndian.Uint32(b); s != 0 {
			return s, nil
		}
	}
}

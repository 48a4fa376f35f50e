package auth

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Security protocol and message kinds of AUTH_SEND / AUTH_RECEIVE.
const (
	// SECP is the security protocol field: DH-HMAC-CHAP (0xe9).
	SECP = 0xe9
	// SPSP0 and SPSP1 are the protocol-specific fields the Linux host
	// sends (0x01, 0x01).
	SPSP0, SPSP1 = 0x01, 0x01

	typeCommon = 0x00 // auth_type of negotiate and the failures
	typeDHCHAP = 0x01 // auth_type of the others

	idNegotiate = 0x00
	idChallenge = 0x01
	idReply     = 0x02
	idSuccess1  = 0x03
	idSuccess2  = 0x04
	idFailure2  = 0xf0
	idFailure1  = 0xf1

	authIDDHCHAP = 0x01 // protocol descriptor authid
)

// Failure reason code explanations (NVME_AUTH_DHCHAP_FAILURE_*).
const (
	FailFailed           = 0x01
	FailNotUsable        = 0x02
	FailConcatMismatch   = 0x03
	FailHashUnusable     = 0x04
	FailDHGroupUnusable  = 0x05
	FailIncorrectPayload = 0x06
	FailIncorrectMessage = 0x07
)

// ErrMessage wraps every decoding error: a truncated, oversized or
// inconsistent message, or one of another kind than expected.
var ErrMessage = errors.New("auth: bad message")

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMessage}, args...)...)
}

// Kind reads the kind of a message (its auth_type and auth_id) so that a
// receiver can dispatch; it checks nothing else.
func Kind(b []byte) (authType, authID uint8, err error) {
	if len(b) < 2 {
		return 0, 0, bad("%d bytes", len(b))
	}
	return b[0], b[1], nil
}

func header(b []byte, authType, authID uint8, tid uint16) {
	b[0], b[1] = authType, authID
	binary.LittleEndian.PutUint16(b[4:], tid)
}

func check(b []byte, min int, authType, authID uint8) (tid uint16, err error) {
	if len(b) < min {
		return 0, bad("%d bytes, want at least %d", len(b), min)
	}
	if b[0] != authType || b[1] != authID {
		return 0, bad("message type %#x/%#x, want %#x/%#x", b[0], b[1], authType, authID)
	}
	return binary.LittleEndian.Uint16(b[4:]), nil
}

// Negotiate is AUTH_Negotiate: the host's transaction ID, secure-channel
// concatenation request, and the hashes and DH groups it supports.
type Negotiate struct {
	TID      uint16
	SCC      uint8
	Hashes   []HashID
	DHGroups []DHGroup
}

// negotiateLen is the header and one protocol descriptor (4 + 60 bytes).
const negotiateLen = 8 + 64

// Marshal encodes n with one DH-HMAC-CHAP protocol descriptor.
func (n Negotiate) Marshal() ([]byte, error) {
	if len(n.Hashes) > 30 || len(n.DHGroups) > 30 {
		return nil, bad("%d hashes and %d DH groups, at most 30 each", len(n.Hashes), len(n.DHGroups))
	}
	b := make([]byte, negotiateLen)
	header(b, typeCommon, idNegotiate, n.TID)
	b[6], b[7] = n.SCC, 1
	d := b[8:]
	d[0], d[2], d[3] = authIDDHCHAP, uint8(len(n.Hashes)), uint8(len(n.DHGroups))
	for i, h := range n.Hashes {
		d[4+i] = uint8(h)
	}
	for i, g := range n.DHGroups {
		d[4+30+i] = uint8(g)
	}
	return b, nil
}

// UnmarshalNegotiate decodes AUTH_Negotiate, taking the first DH-HMAC-CHAP
// protocol descriptor.
func UnmarshalNegotiate(b []byte) (Negotiate, error) {
	tid, err := check(b, 8, typeCommon, idNegotiate)
	if err != nil {
		return Negotiate{}, err
	}
	n := Negotiate{TID: tid, SCC: b[6]}
	napd := int(b[7])
	if napd == 0 {
		return Negotiate{}, bad("negotiate with no protocol descriptor")
	}
	if len(b) < 8+64*napd {
		return Negotiate{}, bad("negotiate of %d bytes for %d descriptors", len(b), napd)
	}
	for i := range napd {
		d := b[8+64*i : 8+64*(i+1)]
		if d[0] != authIDDHCHAP {
			continue
		}
		halen, dhlen := int(d[2]), int(d[3])
		if halen > 30 || dhlen > 30 {
			return Negotiate{}, bad("descriptor lists %d hashes and %d DH groups, at most 30 each", halen, dhlen)
		}
		for _, h := range d[4 : 4+halen] {
			n.Hashes = append(n.Hashes, HashID(h))
		}
		for _, g := range d[34 : 34+dhlen] {
			n.DHGroups = append(n.DHGroups, DHGroup(g))
		}
		return n, nil
	}
	return Negotiate{}, bad("no DH-HMAC-CHAP protocol descriptor")
}

// Challenge is DH-HMAC-CHAP_Challenge (controller to host).
type Challenge struct {
	TID     uint16
	Hash    HashID
	DHGroup DHGroup
	SeqNum  uint32
	C       []byte // the challenge, the hash's length
	DHValue []byte // the controller's DH public value (none with DHNull)
}

// Marshal encodes c.
func (c Challenge) Marshal() ([]byte, error) {
	if len(c.C) == 0 || len(c.C) > 255 || len(c.DHValue) > 0xffff {
		return nil, bad("challenge of %d bytes with a DH value of %d", len(c.C), len(c.DHValue))
	}
	b := make([]byte, 16+len(c.C)+len(c.DHValue))
	header(b, typeDHCHAP, idChallenge, c.TID)
	b[6], b[8], b[9] = uint8(len(c.C)), uint8(c.Hash), uint8(c.DHGroup)
	binary.LittleEndian.PutUint16(b[10:], uint16(len(c.DHValue)))
	binary.LittleEndian.PutUint32(b[12:], c.SeqNum)
	copy(b[16:], c.C)
	copy(b[16+len(c.C):], c.DHValue)
	return b, nil
}

// UnmarshalChallenge decodes DH-HMAC-CHAP_Challenge.
func UnmarshalChallenge(b []byte) (Challenge, error) {
	tid, err := check(b, 16, typeDHCHAP, idChallenge)
	if err != nil {
		return Challenge{}, err
	}
	hl, dhvlen := int(b[6]), int(binary.LittleEndian.Uint16(b[10:]))
	if hl == 0 || len(b) < 16+hl+dhvlen {
		return Challenge{}, bad("challenge of %d bytes for hl %d and dhvlen %d", len(b), hl, dhvlen)
	}
	return Challenge{
		TID: tid, Hash: HashID(b[8]), DHGroup: DHGroup(b[9]), SeqNum: binary.LittleEndian.Uint32(b[12:]),
		C: clone(b[16 : 16+hl]), DHValue: clone(b[16+hl : 16+hl+dhvlen]),
	}, nil
}

// Reply is DH-HMAC-CHAP_Reply (host to controller): the host's response,
// and, when it asks to authenticate the controller too (CValid), its own
// challenge and sequence number.
type Reply struct {
	TID      uint16
	Response []byte // the hash's length
	CValid   bool
	SeqNum   uint32
	C2       []byte // the host's challenge (same length; zeros if !CValid)
	DHValue  []byte // the host's DH public value
}

// Marshal encodes r.
func (r Reply) Marshal() ([]byte, error) {
	hl := len(r.Response)
	if hl == 0 || hl > 255 || (len(r.C2) != 0 && len(r.C2) != hl) || len(r.DHValue) > 0xffff {
		return nil, bad("reply of %d bytes, challenge %d, DH value %d", hl, len(r.C2), len(r.DHValue))
	}
	b := make([]byte, 16+2*hl+len(r.DHValue))
	header(b, typeDHCHAP, idReply, r.TID)
	b[6] = uint8(hl)
	if r.CValid {
		b[8] = 1
	}
	binary.LittleEndian.PutUint16(b[10:], uint16(len(r.DHValue)))
	binary.LittleEndian.PutUint32(b[12:], r.SeqNum)
	copy(b[16:], r.Response)
	copy(b[16+hl:], r.C2)
	copy(b[16+2*hl:], r.DHValue)
	return b, nil
}

// UnmarshalReply decodes DH-HMAC-CHAP_Reply.
func UnmarshalReply(b []byte) (Reply, error) {
	tid, err := check(b, 16, typeDHCHAP, idReply)
	if err != nil {
		return Reply{}, err
	}
	hl, dhvlen := int(b[6]), int(binary.LittleEndian.Uint16(b[10:]))
	if hl == 0 || len(b) < 16+2*hl+dhvlen {
		return Reply{}, bad("reply of %d bytes for hl %d and dhvlen %d", len(b), hl, dhvlen)
	}
	return Reply{
		TID: tid, Response: clone(b[16 : 16+hl]), CValid: b[8]&1 != 0, SeqNum: binary.LittleEndian.Uint32(b[12:]),
		C2: clone(b[16+hl : 16+2*hl]), DHValue: clone(b[16+2*hl : 16+2*hl+dhvlen]),
	}, nil
}

// Success1 is DH-HMAC-CHAP_Success1 (controller to host): with RValid,
// the controller's response to the host's challenge.
type Success1 struct {
	TID      uint16
	HashLen  uint8
	RValid   bool
	Response []byte
}

// Marshal encodes s.
func (s Success1) Marshal() ([]byte, error) {
	if s.RValid && len(s.Response) != int(s.HashLen) {
		return nil, bad("success1 response of %d bytes for hl %d", len(s.Response), s.HashLen)
	}
	n := 16
	if s.RValid {
		n += int(s.HashLen)
	}
	b := make([]byte, n)
	header(b, typeDHCHAP, idSuccess1, s.TID)
	b[6] = s.HashLen
	if s.RValid {
		b[8] = 1
		copy(b[16:], s.Response)
	}
	return b, nil
}

// UnmarshalSuccess1 decodes DH-HMAC-CHAP_Success1.
func UnmarshalSuccess1(b []byte) (Success1, error) {
	tid, err := check(b, 16, typeDHCHAP, idSuccess1)
	if err != nil {
		return Success1{}, err
	}
	s := Success1{TID: tid, HashLen: b[6], RValid: b[8]&1 != 0}
	if s.RValid {
		if len(b) < 16+int(s.HashLen) {
			return Success1{}, bad("success1 of %d bytes with a response of %d", len(b), s.HashLen)
		}
		s.Response = clone(b[16 : 16+int(s.HashLen)])
	}
	return s, nil
}

// Success2 is DH-HMAC-CHAP_Success2 (host to controller): the controller's
// response was right.
type Success2 struct{ TID uint16 }

// Marshal encodes s.
func (s Success2) Marshal() []byte {
	b := make([]byte, 16)
	header(b, typeDHCHAP, idSuccess2, s.TID)
	return b
}

// UnmarshalSuccess2 decodes DH-HMAC-CHAP_Success2.
func UnmarshalSuccess2(b []byte) (Success2, error) {
	tid, err := check(b, 16, typeDHCHAP, idSuccess2)
	return Success2{TID: tid}, err
}

// Failure is AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to
// controller): reason code 0x01 and an explanation (Fail*).
type Failure struct {
	TID         uint16
	FromHost    bool // Failure2
	Explanation uint8
}

// Marshal encodes f.
func (f Failure) Marshal() []byte {
	b := make([]byte, 8)
	id := uint8(idFailure1)
	if f.FromHost {
		id = idFailure2
	}
	header(b, typeCommon, id, f.TID)
	b[6], b[7] = 0x01, f.Explanation
	return b
}

// UnmarshalFailure decodes AUTH_Failure1 or AUTH_Failure2.
func UnmarshalFailure(b []byte) (Failure, error) {
	if len(b) >= 2 && b[1] == idFailure2 {
		tid, err := check(b, 8, typeCommon, idFailure2)
		return Failure{TID: tid, FromHost: true, Explanation: at(b, 7)}, err
	}
	tid, err := check(b, 8, typeCommon, idFailure1)
	return Failure{TID: tid, Explanation: at(b, 7)}, err
}

func at(b []byte, i int) uint8 {
	if i < len(b) {
		return b[i]
	}
	return 0
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

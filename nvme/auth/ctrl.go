package auth

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"slices"
)

// The controller's side of one queue's authentication, as a state machine
// fed by AUTH_SEND payloads (Send) and asked for AUTH_RECEIVE payloads
// (Receive). The order (NVMe 2.0 §8.13.5; drivers/nvme/target/
// fabrics-cmd-auth.c):
//
//	host: AUTH_SEND Negotiate      -> stepChallenge (or stepFailure1)
//	host: AUTH_RECEIVE             <- Challenge           -> stepReply
//	host: AUTH_SEND Reply          -> stepSuccess1 (or stepFailure1)
//	host: AUTH_RECEIVE             <- Success1            -> done, or stepSuccess2
//	host: AUTH_SEND Success2       -> done                   when the host asked
//	                                                         to authenticate the controller
//
// A refusal the host is to be told about (a wrong response, no common hash
// or group, a malformed reply) moves to stepFailure1: the next
// AUTH_RECEIVE returns AUTH_Failure1 and the session is failed. A message
// out of order, a Failure2 from the host, or an AUTH_RECEIVE with nothing
// to receive fail it at once (Send or Receive returns an error). A failed
// session is final: its queue must end. A Negotiate restarts the exchange
// at any point before that (re-authentication); the queue stays
// authenticated meanwhile, as in Linux.

type ctrlStep uint8

const (
	stepNegotiate ctrlStep = iota // waiting for AUTH_Negotiate
	stepChallenge                 // the host is to receive the challenge
	stepReply                     // waiting for the reply
	stepSuccess1                  // the host is to receive success1
	stepSuccess2                  // waiting for success2
	stepFailure1                  // the host is to receive failure1
	stepFailed                    // final
)

// DefaultHashes and DefaultDHGroups are the controller's preferences: the
// first one the host also offers is chosen. SHA-256 first, as Linux's
// target and nvme-cli default to; a DH group whenever the host offers one
// (the session key then enters both responses, so a recorded exchange
// does not let an eavesdropper test guesses of the secret offline).
var (
	DefaultHashes   = []HashID{SHA256, SHA384, SHA512}
	DefaultDHGroups = []DHGroup{FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192, DHNull}
)

// Config is one side's view of an association: the two NQNs, the
// secrets, and the hashes and DH groups it accepts.
type Config struct {
	HostNQN, SubNQN string
	// HostKey is the host's secret. CtrlKey is the controller's: on a
	// controller, nil refuses a host that asks to authenticate the
	// controller; on a host, set means the host challenges the
	// controller too (bidirectional) and accepts only one that holds it.
	HostKey Key
	CtrlKey *Key
	// Hashes and DHGroups: on a controller its preferences, first
	// match wins (nil: DefaultHashes, DefaultDHGroups); on a host what it
	// offers (nil: all this package implements, as Linux offers).
	Hashes   []HashID
	DHGroups []DHGroup
	// Rand is the source of challenges and DH keys (nil: crypto/rand).
	Rand io.Reader
}

// ErrProtocol is an authentication message out of order, or the host's
// own Failure2: the session is failed and the queue must end.
var ErrProtocol = errors.New("auth: authentication protocol violation")

// ErrAllocLength is an AUTH_RECEIVE too short for the message: the
// command fails, the session does not change.
var ErrAllocLength = errors.New("auth: AUTH_RECEIVE allocation length too short")

// CtrlSession is the controller's state for one queue. It is not safe for
// concurrent use.
type CtrlSession struct {
	cfg  Config
	step ctrlStep

	authenticated bool
	bidi          bool // the last exchange authenticated the controller too
	tid           uint16
	hash          HashID
	group         DHGroup
	s1, s2        uint32
	c1, c2        []byte
	dh            *DHKey
	sess          []byte
	explanation   uint8  // of the pending Failure1
	reason        string // why the session failed or was refused, for the log
	transactions  int    // exchanges completed
}

// NewCtrlSession starts a queue's session: nothing is authenticated yet.
func NewCtrlSession(cfg Config) *CtrlSession {
	if cfg.Hashes == nil {
		cfg.Hashes = DefaultHashes
	}
	if cfg.DHGroups == nil {
		cfg.DHGroups = DefaultDHGroups
	}
	return &CtrlSession{cfg: cfg}
}

// Authenticated reports whether the host has proven its key (and, when it
// asked, accepted the controller's response).
func (s *CtrlSession) Authenticated() bool { return s.authenticated }

// Failed reports whether the session is final: the queue must end.
func (s *CtrlSession) Failed() bool { return s.step == stepFailed }

// Reason says why the session failed (empty while it has not).
func (s *CtrlSession) Reason() string { return s.reason }

// Chosen returns the hash and DH group of the last negotiation.
func (s *CtrlSession) Chosen() (HashID, DHGroup) { return s.hash, s.group }

// Bidirectional reports whether the controller proved its key too in the
// last exchange.
func (s *CtrlSession) Bidirectional() bool { return s.bidi && s.authenticated }

// refuse moves to stepFailure1 with an explanation for the host.
func (s *CtrlSession) refuse(explanation uint8, format string, args ...any) {
	s.step, s.explanation = stepFailure1, explanation
	s.reason = fmt.Sprintf(format, args...)
	s.clear()
}

// fail ends the session at once.
func (s *CtrlSession) fail(format string, args ...any) error {
	s.step, s.authenticated = stepFailed, false
	s.reason = fmt.Sprintf(format, args...)
	s.clear()
	return fmt.Errorf("%w: %s", ErrProtocol, s.reason)
}

// clear forgets the transaction's secrets.
func (s *CtrlSession) clear() {
	clear(s.sess)
	s.c1, s.c2, s.dh, s.sess = nil, nil, nil, nil
}

// Send takes an AUTH_SEND payload. A non-nil error means the session
// failed at once (ErrProtocol).
func (s *CtrlSession) Send(b []byte) error {
	switch s.step {
	case stepFailed:
		return fmt.Errorf("%w: the session has failed", ErrProtocol)
	case stepFailure1:
		// A refused host starts no new exchange on the queue: each
		// attempt would be another free guess.
		return s.fail("a message after a refusal (%s)", s.reason)
	}
	authType, authID, err := Kind(b)
	if err != nil {
		return s.fail("AUTH_SEND of %d bytes", len(b))
	}
	switch {
	case authType == typeCommon && authID == idNegotiate:
		s.negotiate(b)
		return nil
	case authType == typeCommon && authID == idFailure2:
		f, _ := UnmarshalFailure(b)
		return s.fail("the host refused the controller (failure2, explanation %#x)", f.Explanation)
	case authType == typeDHCHAP && authID == idReply && s.step == stepReply:
		s.reply(b)
		return nil
	case authType == typeDHCHAP && authID == idSuccess2 && s.step == stepSuccess2:
		m, err := UnmarshalSuccess2(b)
		if err != nil || m.TID != s.tid {
			s.refuse(FailIncorrectPayload, "success2 malformed or of another transaction")
			return nil
		}
		s.authenticated, s.bidi, s.step = true, true, stepNegotiate
		s.transactions++
		s.clear()
		return nil
	}
	return s.fail("message %#x/%#x out of order (step %d)", authType, authID, s.step)
}

func (s *CtrlSession) negotiate(b []byte) {
	s.clear()
	s.bidi = false
	n, err := UnmarshalNegotiate(b)
	if len(b) >= 6 {
		s.tid = uint16(b[4]) | uint16(b[5])<<8
	}
	switch {
	case err != nil:
		s.refuse(FailIncorrectPayload, "negotiate: %v", err)
		return
	case n.SCC != 0:
		s.refuse(FailConcatMismatch, "negotiate asks for secure channel concatenation (SC_C %d), which blk does not offer", n.SCC)
		return
	}
	s.tid = n.TID
	s.hash = 0
	for _, h := range s.cfg.Hashes {
		if slices.Contains(n.Hashes, h) {
			s.hash = h
			break
		}
	}
	if s.hash == 0 {
		s.refuse(FailHashUnusable, "no common hash: the host offers %v, the controller takes %v", n.Hashes, s.cfg.Hashes)
		return
	}
	s.group = dhgInvalid
	for _, g := range s.cfg.DHGroups {
		if slices.Contains(n.DHGroups, g) {
			s.group = g
			break
		}
	}
	if s.group == dhgInvalid {
		s.refuse(FailDHGroupUnusable, "no common DH group: the host offers %v, the controller takes %v", n.DHGroups, s.cfg.DHGroups)
		return
	}
	s.step = stepChallenge
}

func (s *CtrlSession) reply(b []byte) {
	r, err := UnmarshalReply(b)
	switch {
	case err != nil:
		s.refuse(FailIncorrectPayload, "reply: %v", err)
		return
	case r.TID != s.tid:
		s.refuse(FailIncorrectPayload, "reply of transaction %d, want %d", r.TID, s.tid)
		return
	case len(r.Response) != s.hash.Size():
		s.refuse(FailHashUnusable, "reply with a %d-byte response for %v", len(r.Response), s.hash)
		return
	}
	if s.group != DHNull {
		if s.sess, err = s.dh.Shared(r.DHValue); err != nil {
			s.refuse(FailDHGroupUnusable, "reply: %v", err)
			return
		}
	} else if len(r.DHValue) != 0 {
		s.refuse(FailIncorrectPayload, "reply carries a DH value without a DH group")
		return
	}
	want := HostResponse(s.hash, s.cfg.HostKey, s.c1, s.sess, s.s1, s.tid, 0, s.cfg.HostNQN, s.cfg.SubNQN)
	if !hmac.Equal(want, r.Response) {
		s.refuse(FailFailed, "wrong response: the host does not hold the secret configured for it")
		return
	}
	if r.CValid {
		if s.cfg.CtrlKey == nil {
			s.refuse(FailFailed, "the host asks to authenticate the controller, which has no controller secret for it")
			return
		}
		if r.SeqNum == 0 {
			s.refuse(FailIncorrectPayload, "reply with a challenge and sequence number 0")
			return
		}
		s.c2, s.s2 = r.C2, r.SeqNum
	} else {
		s.c2 = nil
		s.authenticated = true
		s.transactions++
	}
	s.step = stepSuccess1
}

// Receive returns the AUTH_RECEIVE payload for an allocation length of
// al bytes. ErrAllocLength leaves the session as it was; ErrProtocol
// means it failed.
func (s *CtrlSession) Receive(al int) ([]byte, error) {
	switch s.step {
	case stepChallenge:
		return s.challenge(al)
	case stepSuccess1:
		m := Success1{TID: s.tid, HashLen: uint8(s.hash.Size())}
		if s.c2 != nil {
			m.RValid = true
			m.Response = CtrlResponse(s.hash, *s.cfg.CtrlKey, s.c2, s.sess, s.s2, s.tid, s.cfg.HostNQN, s.cfg.SubNQN)
		}
		b, err := m.Marshal()
		if err != nil {
			return nil, s.fail("success1: %v", err)
		}
		if len(b) > al {
			return nil, fmt.Errorf("%w: %d bytes for a %d-byte success1", ErrAllocLength, al, len(b))
		}
		if s.c2 != nil {
			s.step = stepSuccess2
		} else {
			s.step = stepNegotiate
			s.clear()
		}
		return b, nil
	case stepFailure1:
		b := Failure{TID: s.tid, Explanation: s.explanation}.Marshal()
		if len(b) > al {
			return nil, fmt.Errorf("%w: %d bytes for an 8-byte failure1", ErrAllocLength, al)
		}
		s.step, s.authenticated = stepFailed, false
		return b, nil
	}
	return nil, s.fail("AUTH_RECEIVE with nothing to receive (step %d)", s.step)
}

func (s *CtrlSession) challenge(al int) ([]byte, error) {
	need := 16 + s.hash.Size() + s.group.ValueSize()
	if need > al {
		return nil, fmt.Errorf("%w: %d bytes for a %d-byte challenge", ErrAllocLength, al, need)
	}
	var err error
	if s.c1, err = random(s.cfg.Rand, s.hash.Size()); err != nil {
		return nil, s.fail("challenge: %v", err)
	}
	if s.s1, err = seqNum(s.cfg.Rand); err != nil {
		return nil, s.fail("challenge: %v", err)
	}
	m := Challenge{TID: s.tid, Hash: s.hash, DHGroup: s.group, SeqNum: s.s1, C: s.c1}
	if s.group != DHNull {
		if s.dh, err = GenerateDH(s.group, s.cfg.Rand); err != nil {
			return nil, s.fail("challenge: %v", err)
		}
		m.DHValue = s.dh.Public
	}
	b, err := m.Marshal()
	if err != nil {
		return nil, s.fail("challenge: %v", err)
	}
	s.step = stepReply
	return b, nil
}

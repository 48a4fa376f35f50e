package auth

import (
	"crypto/hmac"
	"errors"
	"fmt"
)

// Errors of Authenticate (besides the transport's own).
var (
	// ErrRefused: the controller answered with AUTH_Failure1.
	ErrRefused = errors.New("auth: the controller refused the host")
	// ErrCtrlNotAuthenticated: the controller's response to the host's
	// challenge was wrong or missing; the host sent Failure2.
	ErrCtrlNotAuthenticated = errors.New("auth: the controller failed to authenticate")
)

// ReceiveSize is the allocation length a host gives AUTH_RECEIVE: enough
// for a challenge with an ffdhe8192 value (16 + 64 + 1024 bytes), as
// Linux's 4 KiB.
const ReceiveSize = 4096

// Transport carries one queue's AUTH_SEND and AUTH_RECEIVE commands.
type Transport interface {
	AuthSend(payload []byte) error
	AuthReceive(al int) ([]byte, error)
}

// Authenticate runs one DH-HMAC-CHAP transaction as the host on a queue.
// On an error after the challenge it tells the controller with Failure2
// (best effort) before returning.
func Authenticate(cfg Config, tid uint16, t Transport) (hash HashID, group DHGroup, err error) {
	hashes, groups := cfg.Hashes, cfg.DHGroups
	if hashes == nil {
		hashes = []HashID{SHA256, SHA384, SHA512}
	}
	if groups == nil {
		groups = []DHGroup{DHNull, FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192}
	}
	neg, err := Negotiate{TID: tid, Hashes: hashes, DHGroups: groups}.Marshal()
	if err != nil {
		return 0, 0, err
	}
	if err := t.AuthSend(neg); err != nil {
		return 0, 0, fmt.Errorf("auth: send negotiate: %w", err)
	}
	b, err := t.AuthReceive(ReceiveSize)
	if err != nil {
		return 0, 0, fmt.Errorf("auth: receive challenge: %w", err)
	}
	if err := failure1(b); err != nil {
		return 0, 0, err
	}
	ch, err := UnmarshalChallenge(b)
	if err != nil {
		return 0, 0, err
	}
	fail2 := func(explanation uint8, e error) (HashID, DHGroup, error) {
		if serr := t.AuthSend(Failure{TID: tid, FromHost: true, Explanation: explanation}.Marshal()); serr != nil {
			e = fmt.Errorf("%w (and sending failure2: %v)", e, serr)
		}
		return ch.Hash, ch.DHGroup, e
	}
	switch {
	case ch.TID != tid:
		return fail2(FailIncorrectPayload, fmt.Errorf("%w: challenge of transaction %d, want %d", ErrMessage, ch.TID, tid))
	case ch.Hash.Size() == 0 || !contains(hashes, ch.Hash) || len(ch.C) != ch.Hash.Size():
		return fail2(FailHashUnusable, fmt.Errorf("%w: challenge with hash %v and %d bytes", ErrMessage, ch.Hash, len(ch.C)))
	case !ch.DHGroup.Known() || !contains(groups, ch.DHGroup):
		return fail2(FailDHGroupUnusable, fmt.Errorf("%w: challenge with DH group %v", ErrMessage, ch.DHGroup))
	case (ch.DHGroup == DHNull) != (len(ch.DHValue) == 0):
		return fail2(FailIncorrectPayload, fmt.Errorf("%w: challenge with a %d-byte DH value for %v", ErrMessage, len(ch.DHValue), ch.DHGroup))
	}
	reply := Reply{TID: tid}
	var sess []byte
	if ch.DHGroup != DHNull {
		dh, err := GenerateDH(ch.DHGroup, cfg.Rand)
		if err != nil {
			return fail2(FailFailed, err)
		}
		if sess, err = dh.Shared(ch.DHValue); err != nil {
			return fail2(FailDHGroupUnusable, err)
		}
		defer clear(sess)
		reply.DHValue = dh.Public
	}
	reply.Response = HostResponse(ch.Hash, cfg.HostKey, ch.C, sess, ch.SeqNum, tid, 0, cfg.HostNQN, cfg.SubNQN)
	if cfg.CtrlKey != nil {
		if reply.C2, err = random(cfg.Rand, ch.Hash.Size()); err != nil {
			return fail2(FailFailed, err)
		}
		if reply.SeqNum, err = seqNum(cfg.Rand); err != nil {
			return fail2(FailFailed, err)
		}
		reply.CValid = true
	}
	rb, err := reply.Marshal()
	if err != nil {
		return fail2(FailFailed, err)
	}
	if err := t.AuthSend(rb); err != nil {
		return ch.Hash, ch.DHGroup, fmt.Errorf("auth: send reply: %w", err)
	}
	if b, err = t.AuthReceive(ReceiveSize); err != nil {
		return ch.Hash, ch.DHGroup, fmt.Errorf("auth: receive success1: %w", err)
	}
	if err := failure1(b); err != nil {
		return ch.Hash, ch.DHGroup, err
	}
	s1, err := UnmarshalSuccess1(b)
	if err != nil {
		return fail2(FailIncorrectPayload, err)
	}
	if s1.TID != tid || int(s1.HashLen) != ch.Hash.Size() {
		return fail2(FailIncorrectPayload, fmt.Errorf("%w: success1 of transaction %d with hl %d", ErrMessage, s1.TID, s1.HashLen))
	}
	if cfg.CtrlKey == nil {
		return ch.Hash, ch.DHGroup, nil
	}
	want := CtrlResponse(ch.Hash, *cfg.CtrlKey, reply.C2, sess, reply.SeqNum, tid, cfg.HostNQN, cfg.SubNQN)
	if !s1.RValid || !hmac.Equal(want, s1.Response) {
		// Unlike Linux 6.1, a success1 without a response is no
		// proof either.
		return fail2(FailFailed, ErrCtrlNotAuthenticated)
	}
	if err := t.AuthSend(Success2{TID: tid}.Marshal()); err != nil {
		return ch.Hash, ch.DHGroup, fmt.Errorf("auth: send success2: %w", err)
	}
	return ch.Hash, ch.DHGroup, nil
}

// failure1 turns an AUTH_Failure1 into ErrRefused.
func failure1(b []byte) error {
	if len(b) >= 2 && b[0] == typeCommon && b[1] == idFailure1 {
		f, _ := UnmarshalFailure(b)
		return fmt.Errorf("%w: %s", ErrRefused, Explain(f.Explanation))
	}
	return nil
}

// Explain names a failure explanation.
func Explain(e uint8) string {
	switch e {
	case FailFailed:
		return "authentication failed"
	case FailNotUsable:
		return "authentication protocol not usable"
	case FailConcatMismatch:
		return "secure channel concatenation mismatch"
	case FailHashUnusable:
		return "hash function not usable"
	case FailDHGroupUnusable:
		return "DH group not usable"
	case FailIncorrectPayload:
		return "incorrect payload"
	case FailIncorrectMessage:
		return "incorrect protocol message"
	}
	return fmt.Sprintf("explanation %#x", e)
}

func contains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

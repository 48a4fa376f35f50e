package auth

import (
	"errors"
	"fmt"
	"testing"
)

// pipe carries a host's AUTH_SEND/RECEIVE straight to a controller
// session, recording what went each way.
type pipe struct {
	s    *CtrlSession
	sent [][]byte
	// tamper, when set, may change a payload before the controller sees it.
	tamper func(b []byte) []byte
}

func (p *pipe) AuthSend(b []byte) error {
	p.sent = append(p.sent, clone(b))
	if p.tamper != nil {
		b = p.tamper(b)
	}
	return p.s.Send(b)
}

func (p *pipe) AuthReceive(al int) ([]byte, error) { return p.s.Receive(al) }

const (
	hostNQN = "nqn.2014-08.org.nvmexpress:uuid:0f6c2a1e-7d0c-4f5e-9b4a-1d2c3b4a5f60"
	subNQN  = "nqn.2024-01.io.blk:volume:vol1"
)

func keys(t *testing.T) (Key, Key) {
	t.Helper()
	h, err := GenerateKey(SHA256, 32)
	if err != nil {
		t.Fatal(err)
	}
	c, err := GenerateKey(0, 48)
	if err != nil {
		t.Fatal(err)
	}
	return h, c
}

func TestExchange(t *testing.T) {
	hk, ck := keys(t)
	for _, h := range []HashID{SHA256, SHA384, SHA512} {
		for _, g := range []DHGroup{DHNull, FFDHE2048, FFDHE3072, FFDHE4096} {
			for _, bidi := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%v/bidi=%v", h, g, bidi), func(t *testing.T) {
					s := NewCtrlSession(Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk, CtrlKey: &ck,
						Hashes: []HashID{h}, DHGroups: []DHGroup{g}})
					hc := Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk}
					if bidi {
						hc.CtrlKey = &ck
					}
					gotH, gotG, err := Authenticate(hc, 7, &pipe{s: s})
					if err != nil {
						t.Fatal(err)
					}
					if gotH != h || gotG != g || !s.Authenticated() || s.Failed() || s.Bidirectional() != bidi {
						t.Fatalf("chose %v %v; authenticated %v failed %v bidi %v", gotH, gotG, s.Authenticated(), s.Failed(), s.Bidirectional())
					}
					// Re-authentication on the same queue.
					if _, _, err := Authenticate(hc, 8, &pipe{s: s}); err != nil || !s.Authenticated() {
						t.Fatalf("re-authentication: %v", err)
					}
				})
			}
		}
	}
}

func TestExchangeRefusals(t *testing.T) {
	hk, ck := keys(t)
	other, _ := GenerateKey(SHA256, 32)
	ctrl := func(mod func(*Config)) *CtrlSession {
		c := Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk, CtrlKey: &ck}
		if mod != nil {
			mod(&c)
		}
		return NewCtrlSession(c)
	}
	host := Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk}
	for _, tc := range []struct {
		name   string
		s      *CtrlSession
		h      Config
		tamper func([]byte) []byte
		want   error
		why    string
	}{
		{"wrong host secret", ctrl(nil), Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: other}, nil, ErrRefused, "wrong response"},
		{"host NQN not the key's", ctrl(func(c *Config) { c.HostNQN = "nqn.2014-08.org.nvmexpress:uuid:other" }), host, nil, ErrRefused, "wrong response"},
		{"controller with the wrong secret", ctrl(func(c *Config) { c.CtrlKey = &other }), Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk, CtrlKey: &ck}, nil, ErrCtrlNotAuthenticated, "failure2"},
		{"bidirectional without a controller secret", ctrl(func(c *Config) { c.CtrlKey = nil }), Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk, CtrlKey: &ck}, nil, ErrRefused, "no controller secret"},
		{"no common hash", ctrl(func(c *Config) { c.Hashes = []HashID{SHA512} }), Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk, Hashes: []HashID{SHA256}}, nil, ErrRefused, "no common hash"},
		{"no common group", ctrl(func(c *Config) { c.DHGroups = []DHGroup{FFDHE2048} }), Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk, DHGroups: []DHGroup{DHNull}}, nil, ErrRefused, "no common DH group"},
		{"truncated reply", ctrl(nil), host, func(b []byte) []byte {
			if b[1] == idReply {
				return b[:20]
			}
			return b
		}, ErrRefused, "reply"},
		{"reply of another transaction", ctrl(nil), host, func(b []byte) []byte {
			if b[1] == idReply {
				b = clone(b)
				b[4]++
			}
			return b
		}, ErrRefused, "transaction"},
		{"tampered DH value", ctrl(func(c *Config) { c.DHGroups = []DHGroup{FFDHE2048} }), host, func(b []byte) []byte {
			if b[1] == idReply {
				b = clone(b)
				b[len(b)-1] ^= 1
			}
			return b
		}, ErrRefused, "wrong response"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Authenticate(tc.h, 3, &pipe{s: tc.s, tamper: tc.tamper})
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if tc.s.Authenticated() || !tc.s.Failed() {
				t.Fatalf("session authenticated %v failed %v", tc.s.Authenticated(), tc.s.Failed())
			}
			if r := tc.s.Reason(); !contains([]bool{true}, len(r) > 0 && containsStr(r, tc.why)) {
				t.Fatalf("reason %q, want it to say %q", r, tc.why)
			}
		})
	}
}

func containsStr(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// A reply recorded from one exchange does not authenticate another: the
// challenge is new each time.
func TestReplayRefused(t *testing.T) {
	hk, _ := keys(t)
	for _, g := range []DHGroup{DHNull, FFDHE2048} {
		cfg := Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk, DHGroups: []DHGroup{g}}
		p := &pipe{s: NewCtrlSession(cfg)}
		if _, _, err := Authenticate(Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk}, 1, p); err != nil {
			t.Fatal(err)
		}
		// An eavesdropper replays the negotiate and the reply on a new queue.
		s := NewCtrlSession(cfg)
		if err := s.Send(p.sent[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Receive(ReceiveSize); err != nil {
			t.Fatal(err)
		}
		if err := s.Send(p.sent[1]); err != nil {
			t.Fatal(err)
		}
		b, err := s.Receive(ReceiveSize)
		if err != nil || failure1(b) == nil || s.Authenticated() || !s.Failed() {
			t.Fatalf("%v: replayed reply: %x, %v; authenticated %v", g, b, err, s.Authenticated())
		}
	}
}

// Messages out of order end the session at once; a refused host cannot
// start over on the same queue.
func TestOutOfOrder(t *testing.T) {
	hk, _ := keys(t)
	cfg := Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk}
	neg, _ := Negotiate{TID: 1, Hashes: []HashID{SHA256}, DHGroups: []DHGroup{DHNull}}.Marshal()
	reply, _ := Reply{TID: 1, Response: make([]byte, 32)}.Marshal()
	for name, steps := range map[string]func(s *CtrlSession) error{
		"receive first": func(s *CtrlSession) error { _, err := s.Receive(ReceiveSize); return err },
		"reply first":   func(s *CtrlSession) error { return s.Send(reply) },
		"success2 first": func(s *CtrlSession) error {
			return s.Send(Success2{TID: 1}.Marshal())
		},
		"empty": func(s *CtrlSession) error { return s.Send(nil) },
		"unknown type": func(s *CtrlSession) error {
			return s.Send([]byte{0x05, 0x01, 0, 0, 1, 0, 0, 0})
		},
		"reply before the challenge was received": func(s *CtrlSession) error {
			if err := s.Send(neg); err != nil {
				return nil
			}
			return s.Send(reply)
		},
		"negotiate after a refusal": func(s *CtrlSession) error {
			_ = s.Send(neg)
			_, _ = s.Receive(ReceiveSize)
			_ = s.Send(reply) // a wrong response: refused
			return s.Send(neg)
		},
		"host failure2": func(s *CtrlSession) error {
			return s.Send(Failure{TID: 1, FromHost: true, Explanation: FailFailed}.Marshal())
		},
	} {
		s := NewCtrlSession(cfg)
		if err := steps(s); !errors.Is(err, ErrProtocol) || !s.Failed() || s.Authenticated() {
			t.Errorf("%s: %v, failed %v", name, err, s.Failed())
		}
	}
	// A short allocation length fails the command, not the session.
	s := NewCtrlSession(cfg)
	_ = s.Send(neg)
	if _, err := s.Receive(20); !errors.Is(err, ErrAllocLength) || s.Failed() {
		t.Fatalf("short AUTH_RECEIVE: %v", err)
	}
	if _, err := s.Receive(ReceiveSize); err != nil {
		t.Fatal(err)
	}
}

// FuzzCtrlSession feeds arbitrary AUTH_SEND payloads and receives: the
// session never panics, and never ends authenticated without a right
// response.
func FuzzCtrlSession(f *testing.F) {
	neg, _ := Negotiate{TID: 1, Hashes: []HashID{SHA256}, DHGroups: []DHGroup{DHNull, FFDHE2048}}.Marshal()
	reply, _ := Reply{TID: 1, Response: make([]byte, 32), CValid: true, SeqNum: 1, C2: make([]byte, 32)}.Marshal()
	f.Add(neg, reply, uint16(4096))
	f.Add(neg, []byte{1, 2, 0, 0, 1, 0, 32, 0, 1}, uint16(8))
	f.Add([]byte{0, 0xf0, 0, 0, 1, 0, 1, 1}, neg, uint16(100))
	hk, err := ParseKey("DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b []byte, al uint16) {
		s := NewCtrlSession(Config{HostNQN: hostNQN, SubNQN: subNQN, HostKey: hk, CtrlKey: &hk})
		for _, m := range [][]byte{a, b, a, b} {
			_ = s.Send(m)
			_, _ = s.Receive(int(al))
			if s.Authenticated() {
				t.Fatalf("authenticated by %x then %x", a, b)
			}
		}
	})
}

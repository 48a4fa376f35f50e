package target_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/target"
)

// authPipe carries nvme/auth's host side over a harness queue as
// AUTH_SEND / AUTH_RECEIVE fabrics commands, as a binding hands them over.
type authPipe struct {
	h *harness
	q *tq
}

func authCmd(ft nvme.FabricsType, length uint32) nvme.Command {
	c := fabricsCmd(ft)
	c.CDW10 = uint32(auth.SECP)<<24 | uint32(auth.SPSP1)<<16 | uint32(auth.SPSP0)<<8
	c.CDW11 = length
	return c
}

func (p authPipe) AuthSend(b []byte) error {
	c := p.h.exec(p.q, authCmd(nvme.FabricsAuthSend, uint32(len(b))), b)
	if s := c.status(); s != nvme.StatusSuccess {
		return errors.New("AUTH_SEND: " + fmtStatus(s))
	}
	return nil
}

func (p authPipe) AuthReceive(al int) ([]byte, error) {
	c := p.h.exec(p.q, authCmd(nvme.FabricsAuthRecv, uint32(al)), make([]byte, al))
	if s := c.status(); s != nvme.StatusSuccess {
		return nil, errors.New("AUTH_RECEIVE: " + fmtStatus(s))
	}
	return c.data, nil
}

// authHarness is a target whose subsystem requires hostA to authenticate.
func authHarness(t *testing.T, ctrlKey bool) (*harness, target.HostKeys) {
	h := newHarness(t)
	s, _ := h.mustSubsystem(subA, 64)
	hk, _ := auth.GenerateKey(auth.SHA256, 32)
	keys := target.HostKeys{Host: hk}
	if ctrlKey {
		ck, _ := auth.GenerateKey(0, 64)
		keys.Ctrl = &ck
	}
	if err := s.SetHostKeys(hostA, &keys); err != nil {
		t.Fatal(err)
	}
	return h, keys
}

func (h *harness) connectATR(name string, qid uint16, cntlid uint16) *tq {
	h.tb.Helper()
	sq := uint16(31)
	if qid != 0 {
		sq = 127
	}
	q := h.queue(name, target.QueueParams{QID: qid, SQSize: sq})
	c := h.exec(q, connectCmd(qid, sq, 0), connectData(hostA, subA, cntlid, hostIDA))
	mustOK(h.tb, c, name+" connect")
	if c.dw0()&nvme.ConnectAuthReqATR == 0 {
		h.tb.Fatalf("%s: Connect DW0 %#x without ATR for a host with secrets", name, c.dw0())
	}
	return q
}

func TestAuthenticatedHost(t *testing.T) {
	for _, bidi := range []bool{false, true} {
		h, keys := authHarness(t, bidi)
		hc := auth.Config{HostNQN: hostA, SubNQN: subA, HostKey: keys.Host, CtrlKey: keys.Ctrl}
		admin := h.connectATR("admin", 0, 0xFFFF)
		cntlid := admin.q.CNTLID()
		// Nothing but authentication before it succeeds.
		if s := h.exec(admin, propSet(nvme.PropCC, ccEnable), nil).status(); s != nvme.StatusAuthenticationRequired.WithDNR() {
			t.Fatalf("enable before authentication: %s", fmtStatus(s))
		}
		if _, _, err := auth.Authenticate(hc, 1, authPipe{h, admin}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, h.exec(admin, propSet(nvme.PropCC, ccEnable), nil), "enable")
		mustOK(t, h.exec(admin, setFeatCmd(nvme.FeatureNumQueues, 3|3<<16), nil), "number of queues")
		io := h.connectATR("io1", 1, cntlid)
		if s := h.exec(io, ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096)).status(); s != nvme.StatusAuthenticationRequired.WithDNR() {
			t.Fatalf("read before the I/O queue authenticated: %s", fmtStatus(s))
		}
		if _, _, err := auth.Authenticate(hc, 2, authPipe{h, io}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, h.exec(io, ioCmd(nvme.IOWrite, 1, 0, 1, 0), make([]byte, 4096)), "write")
		// Re-authentication keeps the queue going.
		if _, _, err := auth.Authenticate(hc, 3, authPipe{h, admin}); err != nil {
			t.Fatal(err)
		}
		h.clock.Advance(time.Minute) // past AuthTimeout: nothing ends
		mustOK(t, h.exec(io, ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096)), "read")
		if st := h.tgt.Stats(); st.AuthSucceeded != 2 || st.AuthFailed != 0 || st.AuthRequired != 2 || admin.disconnected()+io.disconnected() != 0 {
			t.Fatalf("stats %+v, disconnects %d %d", st, admin.disconnected(), io.disconnected())
		}
		h.finish()
	}
}

func TestAuthRefusals(t *testing.T) {
	other, _ := auth.GenerateKey(auth.SHA256, 32)
	for _, tc := range []struct {
		name   string
		bidi   bool
		run    func(h *harness, keys target.HostKeys, q *tq) error
		want   error
		reason string
	}{
		{"wrong secret", false, func(h *harness, keys target.HostKeys, q *tq) error {
			_, _, err := auth.Authenticate(auth.Config{HostNQN: hostA, SubNQN: subA, HostKey: other}, 1, authPipe{h, q})
			return err
		}, auth.ErrRefused, "wrong response"},
		{"controller secret wanted, none held", false, func(h *harness, keys target.HostKeys, q *tq) error {
			_, _, err := auth.Authenticate(auth.Config{HostNQN: hostA, SubNQN: subA, HostKey: keys.Host, CtrlKey: &other}, 1, authPipe{h, q})
			return err
		}, auth.ErrRefused, "no controller secret"},
		{"host rejects the controller", true, func(h *harness, keys target.HostKeys, q *tq) error {
			_, _, err := auth.Authenticate(auth.Config{HostNQN: hostA, SubNQN: subA, HostKey: keys.Host, CtrlKey: &other}, 1, authPipe{h, q})
			return err
		}, auth.ErrCtrlNotAuthenticated, "failure2"},
		{"skipped", false, func(h *harness, keys target.HostKeys, q *tq) error {
			h.clock.Advance(target.DefaultAuthTimeout)
			return nil
		}, nil, "not authenticated within 30s"},
		{"reply before challenge", false, func(h *harness, keys target.HostKeys, q *tq) error {
			neg, _ := auth.Negotiate{TID: 1, Hashes: []auth.HashID{auth.SHA256}, DHGroups: []auth.DHGroup{auth.DHNull}}.Marshal()
			p := authPipe{h, q}
			if err := p.AuthSend(neg); err != nil {
				return err
			}
			rep, _ := auth.Reply{TID: 1, Response: make([]byte, 32)}.Marshal()
			return p.AuthSend(rep)
		}, nil, "out of order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, keys := authHarness(t, tc.bidi)
			q := h.connectATR("admin", 0, 0xFFFF)
			err := tc.run(h, keys, q)
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			// The queue refuses everything else meanwhile, then ends.
			if s := h.exec(q, propGet(nvme.PropCSTS, false), nil).status(); s != nvme.StatusAuthenticationRequired.WithDNR() {
				t.Fatalf("after the failure: %s", fmtStatus(s))
			}
			h.clock.Advance(2 * time.Second)
			if q.disconnected() != 1 {
				t.Fatalf("%d disconnects", q.disconnected())
			}
			st := h.tgt.Stats()
			if st.AuthFailed != 1 || st.AuthSucceeded != 0 || st.Controllers != 0 {
				t.Fatalf("stats: failed %d succeeded %d controllers %d", st.AuthFailed, st.AuthSucceeded, st.Controllers)
			}
			evs := strings.Join(h.takeEvents(), "\n")
			if !strings.Contains(evs, "disconnect admin: target: authentication failed: ") || !strings.Contains(evs, tc.reason) {
				t.Fatalf("events:\n%s", evs)
			}
			if strings.Contains(evs, keys.Host.Encode()[10:20]) {
				t.Fatal("the secret appears in the events")
			}
			h.finish()
		})
	}
}

// Command fields and hosts without secrets.
func TestAuthCommandChecks(t *testing.T) {
	h, _ := authHarness(t, false)
	q := h.connectATR("admin", 0, 0xFFFF)
	bad := authCmd(nvme.FabricsAuthSend, 72)
	bad.CDW10 &^= 0xff << 24 // SECP 0
	if s := h.exec(q, bad, make([]byte, 72)).status(); s != nvme.StatusInvalidField.WithDNR() {
		t.Errorf("SECP 0: %s", fmtStatus(s))
	}
	if s := h.exec(q, authCmd(nvme.FabricsAuthSend, 0), nil).status(); s != nvme.StatusInvalidField.WithDNR() {
		t.Errorf("TL 0: %s", fmtStatus(s))
	}
	if s := h.exec(q, authCmd(nvme.FabricsAuthSend, 100), make([]byte, 72)).status(); s != nvme.StatusSGLInvalidDataLength.WithDNR() {
		t.Errorf("TL beyond the data: %s", fmtStatus(s))
	}
	if s := h.exec(q, authCmd(nvme.FabricsAuthRecv, 8), make([]byte, 8)).status(); s != nvme.StatusCommandSequenceError.WithDNR() {
		t.Errorf("receive before negotiate: %s", fmtStatus(s))
	}
	h.clock.Advance(2 * time.Second)
	if q.disconnected() != 1 {
		t.Fatal("a queue out of sequence was not ended")
	}
	h.finish()

	// A host without secrets: no ATR, and AUTH_SEND is Invalid Opcode.
	h = newHarness(t)
	h.mustSubsystem(subA, 64)
	admin, _ := h.adminConnect("admin", hostA, subA, 0)
	if s := h.exec(admin, authCmd(nvme.FabricsAuthSend, 8), make([]byte, 8)).status(); s != nvme.StatusInvalidOpcode.WithDNR() {
		t.Errorf("AUTH_SEND without secrets: %s", fmtStatus(s))
	}
	h.finish()
}

// A host that cannot authenticate (Linux without CONFIG_NVME_AUTH) drops
// its queue at ATR: counted as a failure once, and its deadline goes.
func TestAuthHostLeaves(t *testing.T) {
	h, _ := authHarness(t, false)
	q := h.connectATR("admin", 0, 0xFFFF)
	q.q.Close()
	h.clock.Advance(time.Minute)
	st := h.tgt.Stats()
	if st.AuthFailed != 1 || st.AuthTimedOut != 0 || st.Controllers != 0 {
		t.Fatalf("failed %d timed out %d controllers %d", st.AuthFailed, st.AuthTimedOut, st.Controllers)
	}
	h.finish()
}

// Secrets set for a host that is connected without having authenticated
// end its controller: it must now prove itself, on a new Connect.
func TestAuthSecretsSetWhileConnected(t *testing.T) {
	h := newHarness(t)
	s, _ := h.mustSubsystem(subA, 64)
	admin, _ := h.adminConnect("admin", hostA, subA, 0)
	hk, _ := auth.GenerateKey(0, 32)
	if err := s.SetHostKeys(hostA, &target.HostKeys{Host: hk}); err != nil {
		t.Fatal(err)
	}
	if admin.disconnected() != 1 || h.tgt.Stats().Controllers != 0 {
		t.Fatalf("%d disconnects, %d controllers", admin.disconnected(), h.tgt.Stats().Controllers)
	}
	q := h.connectATR("admin2", 0, 0xFFFF)
	if _, _, err := auth.Authenticate(auth.Config{HostNQN: hostA, SubNQN: subA, HostKey: hk}, 1, authPipe{h, q}); err != nil {
		t.Fatal(err)
	}
	// Rotation: an authenticated controller keeps its session.
	hk2, _ := auth.GenerateKey(0, 32)
	if err := s.SetHostKeys(hostA, &target.HostKeys{Host: hk2}); err != nil {
		t.Fatal(err)
	}
	if q.disconnected() != 0 {
		t.Fatal("an authenticated controller was torn down by a rotation")
	}
	mustOK(t, h.exec(q, propSet(nvme.PropCC, ccEnable), nil), "enable")
	h.finish()
}

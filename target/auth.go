package target

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/auth"
)

// In-band authentication (DH-HMAC-CHAP, NVMe 2.0 §8.13), as nvmet serves
// it (drivers/nvme/target/fabrics-cmd-auth.c):
//
//   - A host with secrets on a subsystem (Subsystem.SetHostKeys) must
//     authenticate every queue it connects: the Connect succeeds with ATR
//     set in its response, and until the queue's exchange succeeds every
//     command on it but AUTH_SEND and AUTH_RECEIVE is refused with
//     Authentication Required (DNR). A subsystem that allows any host
//     still authenticates a host it holds secrets for.
//   - The exchange is nvme/auth's CtrlSession, one per queue; its
//     messages run on a goroutine of their own (at most authWorkers at
//     once, target-wide), since a DH exponentiation takes milliseconds and
//     the binding's goroutine must not wait for one.
//   - A queue that fails (wrong response, no common hash or group,
//     messages out of order, the host's Failure2) or is not authenticated
//     within Config.AuthTimeout ends: the whole controller for an admin
//     queue, the queue alone for an I/O queue, authFailGrace after the
//     failure so that the host reads its Failure1 first. Each failure is
//     counted (Stats.AuthFailed) and logged once, with its reason and
//     never a secret.

const (
	// authFailGrace: how long a failed queue stays, refusing commands,
	// so that the Failure1 completion reaches the host before the
	// connection is dropped. A Linux host disconnects on its own at once.
	authFailGrace = time.Second
	// authWorkers bounds the exchanges computing at once: a host cannot
	// make the target spend more than this many cores on DH.
	authWorkers = 4
)

// EventAuthFailed is the event logged when a queue's authentication fails.
const EventAuthFailed = "authentication failed"

// ErrAuthFailed is the reason a controller or queue ends when its
// authentication fails or times out.
var ErrAuthFailed = errors.New("target: authentication failed")

// HostKeys are a host's DH-HMAC-CHAP secrets for one subsystem.
type HostKeys struct {
	// Host is the host's secret: it must prove it holds it.
	Host auth.Key
	// Ctrl is the controller's secret, for a host that asks the
	// controller to prove itself (bidirectional); nil refuses such a host.
	Ctrl *auth.Key
}

// queueAuth is one queue's authentication state.
type queueAuth struct {
	mu      sync.Mutex // serializes the exchange's commands
	s       *auth.CtrlSession
	timer   Timer
	ending  bool // the queue is being ended
	succeed int  // exchanges that succeeded (the first ends the timer)
}

// authFor returns the queue's authentication state if the host holds
// secrets on s.
func (q *Queue) authFor(s *Subsystem, hostNQN string) *queueAuth {
	keys, ok := s.hostKeys(hostNQN)
	if !ok {
		return nil
	}
	t := q.t
	return &queueAuth{s: auth.NewCtrlSession(auth.Config{
		HostNQN: hostNQN, SubNQN: s.nqn, HostKey: keys.Host, CtrlKey: keys.Ctrl,
		Hashes: t.cfg.AuthHashes, DHGroups: t.cfg.AuthDHGroups,
	})}
}

// startAuth arms the authentication deadline of a queue that just
// connected with ATR set.
func (q *Queue) startAuth() {
	a := q.auth
	a.mu.Lock()
	defer a.mu.Unlock()
	a.timer = q.t.clock.AfterFunc(q.t.cfg.AuthTimeout, func() {
		a.mu.Lock()
		late := a.succeed == 0 && !a.ending
		a.mu.Unlock()
		if late {
			q.t.stats.authTimedOut.Add(1)
			q.authFailed(fmt.Sprintf("not authenticated within %v", q.t.cfg.AuthTimeout), true)
		}
	})
}

// authCommand reports whether cmd is AUTH_SEND or AUTH_RECEIVE: what an
// unauthenticated queue may run.
func authCommand(cmd *nvme.Command) bool {
	if !cmd.IsFabrics() {
		return false
	}
	ft := nvme.FabricsType(uint8(cmd.NSID))
	return ft == nvme.FabricsAuthSend || ft == nvme.FabricsAuthRecv
}

// execAuth serves AUTH_SEND and AUTH_RECEIVE.
func (q *Queue) execAuth(r *Request) {
	a := q.auth
	if a == nil {
		// The host holds no secrets here: nothing to authenticate, as
		// a target without authentication answers.
		q.complete(r, nvme.StatusInvalidOpcode.WithDNR())
		return
	}
	cdw10 := r.Cmd.CDW10
	secp, spsp0, spsp1 := uint8(cdw10>>24), uint8(cdw10>>8), uint8(cdw10>>16)
	length := r.Cmd.CDW11 // TL or AL
	send := nvme.FabricsType(uint8(r.Cmd.NSID)) == nvme.FabricsAuthSend
	switch {
	case secp != auth.SECP || spsp0 != auth.SPSP0 || spsp1 != auth.SPSP1 || length == 0:
		q.complete(r, nvme.StatusInvalidField.WithDNR())
		return
	case length != r.Len || r.data() == nil:
		q.complete(r, nvme.StatusSGLInvalidDataLength.WithDNR())
		return
	}
	go func() {
		q.t.authSem <- struct{}{}
		defer func() { <-q.t.authSem }()
		q.runAuth(a, r, send)
	}()
}

func (q *Queue) runAuth(a *queueAuth, r *Request, send bool) {
	a.mu.Lock()
	st := nvme.StatusSuccess
	if a.ending {
		st = nvme.StatusAuthenticationRequired.WithDNR()
	} else if send {
		if err := a.s.Send(r.data()); err != nil {
			st = nvme.StatusCommandSequenceError.WithDNR()
		}
	} else {
		b, err := a.s.Receive(int(r.Len))
		switch {
		case errors.Is(err, auth.ErrAllocLength):
			st = nvme.StatusInvalidField.WithDNR()
		case err != nil:
			st = nvme.StatusCommandSequenceError.WithDNR()
		default:
			d := r.data()
			clear(d[copy(d, b):])
		}
	}
	failed := a.s.Failed() && !a.ending
	first := false
	if !failed && a.s.Authenticated() && !q.authed.Load() {
		a.succeed++
		first = a.succeed == 1
		if a.timer != nil {
			a.timer.Stop()
		}
		q.authed.Store(true)
	}
	reason := a.s.Reason()
	hash, group := a.s.Chosen()
	bidi := a.s.Bidirectional()
	a.mu.Unlock()

	if first {
		q.t.stats.authSucceeded.Add(1)
		if c := q.ctrl.Load(); c != nil && q.qid == 0 {
			q.t.textf("target: host %s authenticated on %s (%v, %v, bidirectional %v)", c.hostNQN, c.s.nqn, hash, group, bidi)
		}
	}
	if failed {
		// Before the completion: the grace starts before the host
		// hears of the failure.
		q.authFailed(reason, true)
	}
	q.complete(r, st)
}

// authClosed is Close's part: a queue whose host left before
// authenticating (a host without DH-HMAC-CHAP gives up at ATR) is a
// failure too, and its deadline goes.
func (q *Queue) authClosed() {
	if q.auth != nil && !q.authed.Load() {
		q.authFailed("the host closed the queue without authenticating", false)
	}
}

// authFailed ends a queue whose authentication failed (after
// authFailGrace, when end), and logs and counts it, once per queue.
func (q *Queue) authFailed(reason string, end bool) {
	a := q.auth
	a.mu.Lock()
	if a.ending {
		a.mu.Unlock()
		return
	}
	a.ending = true
	if a.timer != nil {
		a.timer.Stop()
	}
	a.mu.Unlock()
	q.authed.Store(false)
	t := q.t
	t.stats.authFailed.Add(1)
	c := q.ctrl.Load()
	if c == nil {
		return
	}
	t.textf("target: authentication of host %s on %s (queue %d, %s) failed: %s", c.hostNQN, c.s.nqn, q.qid, q.params.RemoteAddr, reason)
	if t.logOn(slog.LevelWarn) {
		t.event(slog.LevelWarn, EventAuthFailed, slog.String("subsystem", c.s.nqn), slog.String("host_nqn", c.hostNQN),
			slog.Int("cntlid", int(c.cntlid)), slog.Int("qid", int(q.qid)), slog.String("remote_addr", q.params.RemoteAddr),
			slog.String("reason", reason))
	}
	if !end {
		return
	}
	err := fmt.Errorf("%w: %s", ErrAuthFailed, reason)
	t.clock.AfterFunc(authFailGrace, func() {
		if c.admin == q {
			c.teardown(err)
		} else {
			q.resp.Disconnect(err)
		}
	})
}

package target

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/blk-project/blk/nvme"
)

// Events the target logs through Config.Logger: one record per
// controller or refused Connect, never one per command. The messages are
// fixed, so that a log reader (or a rate-limiting handler) can tell the
// kinds apart; the details are attributes:
//
//	controller created     kind (nvm|discovery), cntlid, subsystem, host_nqn, host_id,
//	                       remote_addr, kato, sqsize (admin queue entries), max_io_queues;
//	                       for a host that comes back: reconnect=true, previous_cntlid,
//	                       previous_state (live|disconnect|keep-alive), and down_for
//	connect refused        qid, subsystem, host_nqn, host_id, cntlid (I/O queues),
//	                       remote_addr, status, reason
//	connect timed out      qid, remote_addr, timeout (no Connect succeeded
//	                       on a new queue in time: its connection is dropped)
//	keep-alive expired     kind, cntlid, subsystem, host_nqn, remote_addr, kato
//	discovery idle         cntlid, host_nqn, remote_addr, timeout: a discovery
//	                       controller sent nothing after its Connect within
//	                       DiscoveryIdleTimeout and is torn down (Warn: no
//	                       host does that; a peer probing or flooding does)
//	controller destroyed   kind, cntlid, subsystem, host_nqn, host_id, reason
//	                       (disconnect|keep-alive|host-denied|subsystem-removed|shutdown|evicted),
//	                       error, lifetime, io_queues
//	backend poller failed  error: a poll group could not make (or register) an
//	                       asynchronous backend's engine; that group's IOs take
//	                       the backend's blocking path (Warn, once per group)
//
// Levels: refused Connects, timed-out Connects and expired keep-alives of I/O controllers are
// Warn, the other events of I/O controllers Info; every event of a
// discovery controller (hosts make one per discovery) is Debug, but a
// refused Connect is Warn whatever it was for.
const (
	EventControllerCreated   = "controller created"
	EventConnectRefused      = "connect refused"
	EventConnectTimedOut     = "connect timed out"
	EventKeepAliveExpired    = "keep-alive expired"
	EventDiscoveryIdle       = "discovery idle"
	EventControllerDestroyed = "controller destroyed"
	EventPollerFailed        = "backend poller failed"
)

// reconnectWindow is how long after losing a controller (its admin queue
// closed, or keep-alive expired) a new controller of the same host, host
// ID and subsystem is logged as a reconnect; lostLimit bounds how many
// lost controllers are remembered for that.
const (
	reconnectWindow = 5 * time.Minute
	lostLimit       = 1024
)

// hostKey is a host's association with a subsystem.
type hostKey struct {
	sub, host string
	id        [16]byte
}

// lostCtrl is a controller that ended without the target ending it.
type lostCtrl struct {
	cntlid uint16
	at     time.Time
	reason string
}

// logOn reports whether events at level l are logged.
func (t *Target) logOn(l slog.Level) bool {
	return t.cfg.Logger != nil && t.cfg.Logger.Enabled(context.Background(), l)
}

func (t *Target) event(l slog.Level, msg string, attrs ...slog.Attr) {
	t.cfg.Logger.LogAttrs(context.Background(), l, msg, attrs...)
}

// textf writes a line to Config.Logf only: the events have their own
// records in Config.Logger.
func (t *Target) textf(format string, args ...any) {
	if t.cfg.Logf != nil {
		t.cfg.Logf(format, args...)
	}
}

// ctrlLevel is the level of a controller's lifecycle events.
func (c *ctrl) level(nvm slog.Level) slog.Level {
	if c.disc {
		return slog.LevelDebug
	}
	return nvm
}

func (c *ctrl) kind() string {
	if c.disc {
		return "discovery"
	}
	return "nvm"
}

// hostIDString formats a host identifier as a UUID.
func hostIDString(id [16]byte) string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// logCreated logs a new controller (c registered, its admin queue
// connected), noting a host that comes back to the subsystem: a live
// controller of the same host and host ID (the host reconnected before
// the old one was torn down), or one lost within reconnectWindow.
func (q *Queue) logCreated(c *ctrl) {
	t := q.t
	t.textf("target: %s controller %d for %s, host %s (%s), KATO %v", c.kind(), c.cntlid, c.s.nqn, c.hostNQN, q.params.RemoteAddr, c.kato)
	l := c.level(slog.LevelInfo)
	if !t.logOn(l) {
		return
	}
	attrs := []slog.Attr{
		slog.String("kind", c.kind()), slog.Int("cntlid", int(c.cntlid)), slog.String("subsystem", c.s.nqn),
		slog.String("host_nqn", c.hostNQN), slog.String("host_id", hostIDString(c.hostID)),
		slog.String("remote_addr", q.params.RemoteAddr), slog.Duration("kato", c.kato),
		slog.Int("sqsize", q.depth), slog.Int("max_io_queues", int(c.lim.MaxIOQueues)),
	}
	if !c.disc {
		if prev, state, downFor, ok := t.previousCtrl(c); ok {
			attrs = append(attrs, slog.Bool("reconnect", true), slog.Int("previous_cntlid", int(prev)),
				slog.String("previous_state", state))
			if downFor > 0 {
				attrs = append(attrs, slog.Duration("down_for", downFor))
			}
		}
	}
	t.event(l, EventControllerCreated, attrs...)
}

// previousCtrl finds the controller c's host had on c's subsystem before
// c: a live one, else one lost within reconnectWindow (forgotten once
// found).
func (t *Target) previousCtrl(c *ctrl) (cntlid uint16, state string, downFor time.Duration, ok bool) {
	for _, o := range c.s.controllers() {
		if o != c && o.hostNQN == c.hostNQN && o.hostID == c.hostID {
			return o.cntlid, "live", 0, true
		}
	}
	k := hostKey{c.s.nqn, c.hostNQN, c.hostID}
	now := t.clock.Now()
	t.evMu.Lock()
	defer t.evMu.Unlock()
	l, found := t.lost[k]
	if !found {
		return 0, "", 0, false
	}
	delete(t.lost, k)
	if d := now.Sub(l.at); d < reconnectWindow {
		return l.cntlid, l.reason, d, true
	}
	return 0, "", 0, false
}

// rememberLost records an I/O controller the host lost (not one the
// target removed), for previousCtrl.
func (t *Target) rememberLost(c *ctrl, reason string) {
	if c.disc || (reason != reasonDisconnect && reason != reasonKeepAlive) {
		return
	}
	now := t.clock.Now()
	t.evMu.Lock()
	defer t.evMu.Unlock()
	if t.lost == nil {
		t.lost = make(map[hostKey]lostCtrl)
	}
	if len(t.lost) >= lostLimit {
		for k, l := range t.lost {
			if now.Sub(l.at) >= reconnectWindow {
				delete(t.lost, k)
			}
		}
		if len(t.lost) >= lostLimit {
			return
		}
	}
	t.lost[hostKey{c.s.nqn, c.hostNQN, c.hostID}] = lostCtrl{cntlid: c.cntlid, at: now, reason: reason}
}

// Why a controller was destroyed (the "reason" attribute).
const (
	reasonDisconnect       = "disconnect"
	reasonKeepAlive        = "keep-alive"
	reasonDiscoveryIdle    = "discovery-idle"
	reasonHostDenied       = "host-denied"
	reasonSubsystemRemoved = "subsystem-removed"
	reasonShutdown         = "shutdown"
	reasonEvicted          = "evicted"
)

func destroyReason(err error) string {
	switch {
	case errors.Is(err, ErrAdminQueueClosed):
		return reasonDisconnect
	case errors.Is(err, ErrKeepAliveExpired):
		return reasonKeepAlive
	case errors.Is(err, ErrDiscoveryIdle):
		return reasonDiscoveryIdle
	case errors.Is(err, errHostRevoked):
		return reasonHostDenied
	case errors.Is(err, errSubsystemRemoved):
		return reasonSubsystemRemoved
	case errors.Is(err, errTargetClosed):
		return reasonShutdown
	case errors.Is(err, errEvicted):
		return reasonEvicted
	}
	return "removed"
}

// logDestroyed logs the end of c, which had nio I/O queues.
func (c *ctrl) logDestroyed(reason error, nio int) {
	t := c.t
	t.textf("target: controller %d (%s, host %s) torn down: %v", c.cntlid, c.s.nqn, c.hostNQN, reason)
	why := destroyReason(reason)
	if t.cfg.Logger == nil {
		return
	}
	t.rememberLost(c, why)
	l := c.level(slog.LevelInfo)
	if !t.logOn(l) {
		return
	}
	t.event(l, EventControllerDestroyed,
		slog.String("kind", c.kind()), slog.Int("cntlid", int(c.cntlid)), slog.String("subsystem", c.s.nqn),
		slog.String("host_nqn", c.hostNQN), slog.String("host_id", hostIDString(c.hostID)),
		slog.String("reason", why), slog.String("error", reason.Error()),
		slog.Duration("lifetime", t.clock.Now().Sub(c.created).Round(time.Millisecond)), slog.Int("io_queues", nio))
}

// logKeepAliveExpired logs c's keep-alive timeout (teardown follows).
func (c *ctrl) logKeepAliveExpired() {
	t := c.t
	t.textf("target: controller %d (%s, host %s): keep-alive timeout %v expired", c.cntlid, c.s.nqn, c.hostNQN, c.kato)
	l := slog.LevelWarn
	if c.disc {
		l = slog.LevelDebug
	}
	if !t.logOn(l) {
		return
	}
	t.event(l, EventKeepAliveExpired,
		slog.String("kind", c.kind()), slog.Int("cntlid", int(c.cntlid)), slog.String("subsystem", c.s.nqn),
		slog.String("host_nqn", c.hostNQN), slog.String("remote_addr", c.admin.params.RemoteAddr),
		slog.Duration("kato", c.kato))
}

// logDiscoveryIdle logs a discovery controller torn down for sending
// nothing after its Connect (teardown follows).
func (c *ctrl) logDiscoveryIdle() {
	t := c.t
	t.textf("target: discovery controller %d (host %s, %s): nothing after its Connect within %v", c.cntlid, c.hostNQN, c.admin.params.RemoteAddr, t.cfg.DiscoveryIdleTimeout)
	if !t.logOn(slog.LevelWarn) {
		return
	}
	t.event(slog.LevelWarn, EventDiscoveryIdle, slog.Int("cntlid", int(c.cntlid)),
		slog.String("host_nqn", c.hostNQN), slog.String("remote_addr", c.admin.params.RemoteAddr),
		slog.Duration("timeout", t.cfg.DiscoveryIdleTimeout))
}

// logRefused logs a refused Connect on q: status st with DW0 dw0 (IPO and
// IATTR for Connect Invalid Parameters and Invalid Host). reason, if not
// empty, says why where the status does not.
func (q *Queue) logRefused(r *Request, st nvme.Status, dw0 uint32, reason string) {
	t := q.t
	var d nvme.ConnectData
	haveData := false
	if data := r.data(); len(data) == nvme.ConnectDataSize {
		haveData = d.Unmarshal(data) == nil
	}
	if reason == "" {
		reason = refusalReason(st, dw0, q.params.QID)
	}
	if haveData {
		t.textf("target: connect by host %s to %s (queue %d, %s) refused: %s", d.HostNQN.String(), d.SubNQN.String(), q.params.QID, q.params.RemoteAddr, reason)
	}
	if !t.logOn(slog.LevelWarn) {
		return
	}
	attrs := []slog.Attr{slog.Int("qid", int(q.params.QID))}
	if haveData {
		attrs = append(attrs, slog.String("subsystem", d.SubNQN.String()), slog.String("host_nqn", d.HostNQN.String()),
			slog.String("host_id", hostIDString(d.HostID)))
		if q.params.QID != 0 {
			attrs = append(attrs, slog.Int("cntlid", int(d.CNTLID)))
		}
	}
	attrs = append(attrs, slog.String("remote_addr", q.params.RemoteAddr), slog.String("status", st.String()),
		slog.String("reason", reason))
	t.event(slog.LevelWarn, EventConnectRefused, attrs...)
}

func (q *Queue) logConnectTimedOut() {
	t := q.t
	t.textf("target: queue %d from %s: no Connect within %v; dropping its connection", q.params.QID, q.params.RemoteAddr, t.cfg.ConnectTimeout)
	if !t.logOn(slog.LevelWarn) {
		return
	}
	t.event(slog.LevelWarn, EventConnectTimedOut, slog.Int("qid", int(q.params.QID)),
		slog.String("remote_addr", q.params.RemoteAddr), slog.Duration("timeout", t.cfg.ConnectTimeout))
}

// refusalReason says in words why a Connect got st (and dw0).
func refusalReason(st nvme.Status, dw0 uint32, qid uint16) string {
	switch st.Code() {
	case nvme.StatusConnectInvalidHost:
		return "host not allowed on the subsystem"
	case nvme.StatusConnectControllerBusy:
		return "no controller ID free"
	case nvme.StatusConnectIncompatibleFormat:
		return "record format not 0"
	case nvme.StatusSGLInvalidDataLength:
		return "Connect data not 1024 bytes"
	case nvme.StatusAbortSQDeleted:
		return "queue or target closing"
	case nvme.StatusCommandSequenceError:
		return "I/O queue already connected"
	case nvme.StatusConnectInvalidParameters:
		ipo, inData := nvme.ConnectInvalidParam(dw0)
		switch {
		case !inData && ipo == ipoQID:
			return "QID not the transport's, or above the I/O queues granted"
		case !inData && ipo == ipoSQSize:
			return "SQSIZE 0, not the transport's, or above the limit"
		case inData && ipo == ipoSubNQN:
			return "unknown subsystem"
		case inData && ipo == ipoHost:
			return "malformed host NQN"
		case inData && ipo == ipoCNTLID && qid == 0:
			return "CNTLID not 0xFFFF (dynamic controller model)"
		case inData && ipo == ipoCNTLID:
			return "no such live controller of this host"
		case inData && ipo == ipoHostID:
			return "host ID differs from the controller's"
		}
	}
	return fmt.Sprintf("status %v", st)
}

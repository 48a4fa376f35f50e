//go:build linux

package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"
)

// Events a port logs through Config.Logger, one per connection (an NVMe
// queue), never one per command. The messages are fixed, and the same
// as target/rdma's where the event is the same, so that a log reader or
// a rate-limiting handler tells the kinds apart; the details are
// attributes:
//
//	connection accepted    port, remote_addr, qid, core: its first
//	                       command capsule made the queue      (Debug)
//	connection rejected    port, remote_addr, source, reason: closed as
//	                       it was accepted (MaxPending, or
//	                       MaxPendingPerSource of source)       (Warn)
//	connection evicted     port, remote_addr, source, for: a pending
//	                       connection closed so that one of a source
//	                       with fewer pending (for) gets its place
//	                       (MaxPending full; pending.go)         (Warn)
//	connection terminated  port, remote_addr, qid, fes, fei, reason: a
//	                       protocol error, answered by a C2HTermReq, or
//	                       a data digest error                  (Warn)
//	connection closed      port, remote_addr, qid, cntlid, by (host: the
//	                       host closed it, reset it or sent an
//	                       H2CTermReq; target: the target closed it),
//	                       reason                               (Info for the
//	                       admin queue of an I/O controller, else Debug)
//	port error             port, op, error: accepting or polling a
//	                       socket failed                        (Warn)
//
// The controller's own events (created, destroyed, keep-alive, connect
// refused or timed out) come from the target core.
const (
	EventConnectionAccepted   = "connection accepted"
	EventConnectionRejected   = "connection rejected"
	EventConnectionEvicted    = "connection evicted"
	EventConnectionTerminated = "connection terminated"
	EventConnectionClosed     = "connection closed"
	EventPortError            = "port error"
)

func (p *Port) logOn(l slog.Level) bool {
	return p.cfg.Logger != nil && p.cfg.Logger.Enabled(context.Background(), l)
}

// textf writes a line to Config.Logf only: the events have their own
// records in Config.Logger.
func (p *Port) textf(format string, args ...any) {
	if p.cfg.Logf != nil {
		p.cfg.Logf(format, args...)
	}
}

func (p *Port) portName() string { return p.ln.Addr().String() }

// logPortError reports a failure of the port itself (op: accept,
// register).
func (p *Port) logPortError(op, remote string, err error) {
	p.textf("tcp: port %s: %s %s: %v", p.portName(), op, remote, err)
	if !p.logOn(slog.LevelWarn) {
		return
	}
	p.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, EventPortError,
		slog.String("port", p.portName()), slog.String("op", op), slog.String("remote_addr", remote),
		slog.String("error", err.Error()))
}

func (p *Port) logRejected(remote, src, why string) {
	p.textf("tcp: port %s: reject %s: %s", p.portName(), remote, why)
	if !p.logOn(slog.LevelWarn) {
		return
	}
	p.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, EventConnectionRejected,
		slog.String("port", p.portName()), slog.String("remote_addr", remote), slog.String("source", src),
		slog.String("reason", why))
}

// logEvicted logs the eviction of pending connection c for a
// connection of source src (the caller disconnects c).
func (c *conn) logEvicted(src string) {
	p := c.p
	p.textf("tcp: port %s: evict pending %s for a connection of %s: MaxPending reached", p.portName(), c.remote, src)
	if !p.logOn(slog.LevelWarn) {
		return
	}
	p.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, EventConnectionEvicted,
		slog.String("port", p.portName()), slog.String("remote_addr", c.remote), slog.String("source", c.src),
		slog.String("for", src))
}

func (c *conn) logAccepted() {
	p := c.p
	p.textf("tcp: port %s: queue %d from %s on core %d", p.portName(), c.qid, c.remote, c.g.idx)
	if !p.logOn(slog.LevelDebug) {
		return
	}
	p.cfg.Logger.LogAttrs(context.Background(), slog.LevelDebug, EventConnectionAccepted,
		slog.String("port", p.portName()), slog.String("remote_addr", c.remote),
		slog.Int("qid", int(c.qid)), slog.Int("core", c.g.idx))
}

func (c *conn) logTerminated(fes uint16, fei uint32, why string) {
	p := c.p
	p.textf("tcp: queue %d from %s: terminating: %s (FES %#x FEI %d)", c.qid, c.remote, why, fes, fei)
	if !p.logOn(slog.LevelWarn) {
		return
	}
	p.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, EventConnectionTerminated,
		slog.String("port", p.portName()), slog.String("remote_addr", c.remote), slog.Int("qid", int(c.qid)),
		slog.String("fes", fmt.Sprintf("%#x", fes)), slog.Uint64("fei", uint64(fei)), slog.String("reason", why))
}

// closedBy says who ended a connection that closed for reason: the host
// (it closed or reset the socket, or sent an H2CTermReq) or the target.
func closedBy(reason error) string {
	var errno syscall.Errno
	if errors.Is(reason, io.EOF) || errors.Is(reason, errHostTerm) || errors.As(reason, &errno) {
		return "host"
	}
	return "target"
}

// logClosed logs the end of c's connection, once its socket is closed.
func (c *conn) logClosed() {
	p := c.p
	reason := "closed"
	if c.reason != nil {
		reason = c.reason.Error()
	}
	by := closedBy(c.reason)
	var cntlid uint16
	if c.q != nil {
		cntlid = c.q.CNTLID()
	}
	if c.reason != nil && !errors.Is(c.reason, errPortClosed) && !errors.Is(c.reason, io.EOF) {
		p.textf("tcp: queue %d from %s closed by the %s: %s", c.qid, c.remote, by, reason)
	}
	l := slog.LevelDebug
	if c.qid == 0 && cntlid != 0 && !c.q.Discovery() {
		l = slog.LevelInfo
	}
	if !p.logOn(l) {
		return
	}
	p.cfg.Logger.LogAttrs(context.Background(), l, EventConnectionClosed,
		slog.String("port", p.portName()), slog.String("remote_addr", c.remote),
		slog.Int("qid", int(c.qid)), slog.Int("cntlid", int(cntlid)), slog.String("by", by), slog.String("reason", reason))
}

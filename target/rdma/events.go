package rdma

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/transport"
)

// Events a port logs through Config.Logger, one per connection (an NVMe
// queue), never one per command. The messages are fixed; the details
// are attributes:
//
//	connection accepted   port, remote_addr, qid, core                 (Debug)
//	connection rejected   port, remote_addr, status (the NVMe/RDMA CM
//	                      reject status), reason                       (Warn)
//	connection closed     port, remote_addr, qid, cntlid, by (host: the
//	                      host closed it or it failed; target: the target
//	                      disconnected it), reason                     (Info for the
//	                      admin queue of an I/O controller, else Debug)
//
// The controller's own events (created, destroyed, keep-alive) come from
// the target core (target.EventControllerCreated and the others).
const (
	EventConnectionAccepted = "connection accepted"
	EventConnectionRejected = "connection rejected"
	EventConnectionClosed   = "connection closed"
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

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

func (p *Port) logRejected(req transport.ConnRequest, sts nvme.RDMACMRejectStatus, why string) {
	remote := addrString(req.RemoteAddr())
	p.textf("rdma: port %s: reject %s: %s (%v)", p.ln.Addr(), remote, why, sts)
	if !p.logOn(slog.LevelWarn) {
		return
	}
	p.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, EventConnectionRejected,
		slog.String("port", p.ln.Addr().String()), slog.String("remote_addr", remote),
		slog.String("status", fmt.Sprint(sts)), slog.String("reason", why))
}

func (p *Port) logAccepted(c *conn) {
	p.textf("rdma: port %s: queue %d from %s on core %d", p.ln.Addr(), c.qid, c.remote, c.core.index)
	if !p.logOn(slog.LevelDebug) {
		return
	}
	p.cfg.Logger.LogAttrs(context.Background(), slog.LevelDebug, EventConnectionAccepted,
		slog.String("port", p.ln.Addr().String()), slog.String("remote_addr", c.remote),
		slog.Int("qid", int(c.qid)), slog.Int("core", c.core.index))
}

// logClosed logs the end of c's connection, once its QP is done.
func (c *conn) logClosed() {
	p := c.port
	l := slog.LevelDebug
	if c.admin && c.q != nil && c.q.CNTLID() != 0 && !c.q.Discovery() {
		l = slog.LevelInfo
	}
	if !p.logOn(l) {
		return
	}
	by, reason := "host", "connection closed by the host or lost"
	if r := c.closedBy.Load(); r != nil {
		by, reason = "target", fmt.Sprint(*r)
	} else if err := c.qp.Err(); err != nil {
		reason = err.Error()
	}
	var cntlid int
	if c.q != nil {
		cntlid = int(c.q.CNTLID())
	}
	p.cfg.Logger.LogAttrs(context.Background(), l, EventConnectionClosed,
		slog.String("port", p.ln.Addr().String()), slog.String("remote_addr", c.remote),
		slog.Int("qid", int(c.qid)), slog.Int("cntlid", cntlid), slog.String("by", by), slog.String("reason", reason))
}

package target

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/nvme"
)

// Queue states. A queue is created unconnected, becomes connected by a
// Connect, and closed by Close; a failed Connect returns it to new.
const (
	queueNew        uint32 = iota // accepts only Connect
	queueConnecting               // a Connect is being executed
	queueConnected                // bound to a controller
	queueClosed                   // the connection is gone
)

// Queue is one submission/completion queue pair of a connection, as the
// binding sees it: it hands commands to Execute and receives them back
// through its Responder.
type Queue struct {
	t      *Target
	resp   Responder
	params QueueParams
	// lim are the limits of the port the queue came through
	// (QueueParams.Limits or Config.Limits), validated by NewQueue and
	// never changed.
	lim Limits
	// source is the host's address the controller budget counts the
	// queue's controller against (sourceOf(params.RemoteAddr)).
	source string

	state atomic.Uint32
	ctrl  atomic.Pointer[ctrl] // set before state becomes connected

	// Set by a successful Connect, before state becomes connected, and
	// not changed afterwards.
	qid       uint16
	depth     int
	sqFlowOff bool
	// refusal says why the Connect being executed was refused, where its
	// status alone does not (for logRefused); written and read by that
	// Connect only.
	refusal string
	// auth is set when the host must authenticate the queue; authed
	// says it has (see auth.go).
	auth   *queueAuth
	authed atomic.Bool

	// connTimer ends the queue if no Connect succeeds in time (set by
	// NewQueue, stopped by a successful Connect or Close).
	connTimer Timer

	// inflight counts requests between Execute and Complete; drained is
	// closed once the queue is closed and it is zero.
	inflight  atomic.Int64
	drained   chan struct{}
	drainOnce sync.Once
	// tracked is the subsystem whose EvictAndDrain waits for this I/O
	// queue (fence.go), told when it drains.
	tracked atomic.Pointer[Subsystem]

	// resv is the queue's reservation cache and drain counters (resv.go).
	resv queueResv
	// fused pairs fused commands (fused.go); sized at an I/O Connect.
	fused fusedTable
}

func newQueue(t *Target, r Responder, p QueueParams, lim Limits) *Queue {
	return &Queue{t: t, resp: r, params: p, lim: lim, source: sourceOf(p.RemoteAddr), qid: p.QID, drained: make(chan struct{})}
}

// armConnectTimer starts the queue's Connect deadline.
func (q *Queue) armConnectTimer() {
	q.connTimer = q.t.clock.AfterFunc(q.t.cfg.ConnectTimeout, q.connectTimedOut)
}

// connectTimedOut drops a queue that is still not connected: a
// connection that sends nothing, or only Connects that are refused,
// holds the binding's resources no longer than Config.ConnectTimeout.
func (q *Queue) connectTimedOut() {
	if st := q.state.Load(); st == queueConnected || st == queueClosed {
		return
	}
	q.t.stats.connectTimedOut.Add(1)
	q.logConnectTimedOut()
	q.resp.Disconnect(fmt.Errorf("%w: not connected within %v", ErrConnectTimeout, q.t.cfg.ConnectTimeout))
}

// QID returns the queue's ID (the one QueueParams announced until a
// Connect succeeds, then the Connect's).
func (q *Queue) QID() uint16 { return q.qid }

// Connected reports whether a Connect succeeded on the queue and it is not
// closed.
func (q *Queue) Connected() bool { return q.state.Load() == queueConnected }

// Depth returns the number of submission queue entries, SQSIZE+1, once
// connected (0 before): the binding's flow-control limit.
func (q *Queue) Depth() int {
	if q.state.Load() < queueConnected {
		return 0
	}
	return q.depth
}

// CNTLID returns the ID of the controller the queue belongs to, or 0.
func (q *Queue) CNTLID() uint16 {
	if c := q.ctrl.Load(); c != nil {
		return c.cntlid
	}
	return 0
}

// Discovery reports whether the queue belongs to a discovery controller.
func (q *Queue) Discovery() bool {
	c := q.ctrl.Load()
	return c != nil && c.disc
}

// SQFlowControlDisabled reports whether the host disabled SQ flow control
// at Connect (CATTR bit 2): the binding then sends SQHD 0xFFFF.
func (q *Queue) SQFlowControlDisabled() bool {
	return q.state.Load() >= queueConnected && q.sqFlowOff
}

// Params returns what the binding said about the queue.
func (q *Queue) Params() QueueParams { return q.params }

// Drained is closed once the queue is closed and every request executed
// on it has been completed: the binding may then free the queue's
// buffers.
func (q *Queue) Drained() <-chan struct{} { return q.drained }

// Close tells the core the connection is gone. Closing an admin queue
// tears its controller down (every I/O queue of the controller gets
// Responder.Disconnect); closing an I/O queue only removes it from its
// controller. Held Asynchronous Event Requests are completed with Abort
// SQ Deleted; requests still running complete (see Drained), with Abort
// SQ Deleted in place of success.
// Close may be called more than once.
func (q *Queue) Close() {
	prev := q.state.Swap(queueClosed)
	if prev == queueClosed {
		return
	}
	if q.connTimer != nil {
		q.connTimer.Stop()
	}
	if prev == queueConnected {
		q.authClosed()
	}
	q.closeFused()
	if c := q.ctrl.Load(); c != nil {
		if c.admin == q {
			c.teardown(ErrAdminQueueClosed)
		} else {
			c.removeQueue(q)
		}
	}
	if q.inflight.Load() == 0 {
		q.markDrained()
	}
}

// markDrained closes Drained, once: the queue is closed and idle.
func (q *Queue) markDrained() {
	q.drainOnce.Do(func() {
		close(q.drained)
		if s := q.tracked.Load(); s != nil {
			s.untrackIO(q)
		}
	})
}

// Execute runs a command (see request.go). Complete is called exactly
// once for it, before Execute returns or later from another goroutine.
// Execute never blocks on storage sync: commands that may wait for one go
// to the target's sync workers.
func (q *Queue) Execute(r *Request) {
	r.q = q
	r.ns = nil
	q.t.enter(r, reqExecuting)
	r.Rsp.DW0, r.Rsp.DW1, r.Rsp.Status = 0, 0, 0
	q.inflight.Add(1)
	switch q.state.Load() {
	case queueConnected:
		if q.auth != nil && !q.authed.Load() && !authCommand(&r.Cmd) {
			q.t.stats.authRequired.Add(1)
			q.complete(r, nvme.StatusAuthenticationRequired.WithDNR())
			return
		}
		if q.qid != 0 {
			q.execIO(r)
		} else {
			q.execAdmin(r)
		}
	case queueClosed:
		q.complete(r, nvme.StatusAbortSQDeleted)
	default:
		q.execUnconnected(r)
	}
}

// complete finishes a request: status, counters, error log, then
// Responder.Complete. The request is the binding's again once Complete
// is called; nothing here touches it afterwards.
func (q *Queue) complete(r *Request, s nvme.Status) {
	if s.Code() == nvme.StatusSuccess && (q.state.Load() == queueClosed || q.ctrlDead()) {
		// The connection is gone, or going (a teardown, an eviction,
		// whose disconnect a binding may carry out after this, as RDMA
		// does): whatever of the completion still reaches the host must
		// not acknowledge a command that finished after its controller
		// was torn down (it may or may not have taken effect: Abort SQ
		// Deleted, which a host retries elsewhere).
		s = nvme.StatusAbortSQDeleted
	}
	drain := q.drainTake(r)
	r.Rsp.Status = s
	q.t.countStatus(s)
	if s.Code() != nvme.StatusSuccess {
		if c := q.ctrl.Load(); c != nil {
			c.recordError(q, r, s)
		}
	}
	q.t.enter(r, reqDone)
	q.resp.Complete(r)
	q.drainExit(drain) // after the answer: DrainHosts waits for it (resv.go)
	if q.inflight.Add(-1) == 0 && q.state.Load() == queueClosed {
		q.markDrained()
	}
}

// ctrlDead reports whether the queue's controller was torn down.
func (q *Queue) ctrlDead() bool {
	c := q.ctrl.Load()
	return c != nil && c.dead.Load()
}

// execUnconnected serves a queue that has no controller: only Connect.
func (q *Queue) execUnconnected(r *Request) {
	cmd := &r.Cmd
	switch {
	case cmd.Fuse() != 0:
		q.complete(r, nvme.StatusInvalidField.WithDNR())
	case !cmd.IsFabrics() || uint8(cmd.NSID) != uint8(nvme.FabricsConnect):
		q.complete(r, nvme.StatusInvalidOpcode.WithDNR())
	default:
		q.connect(r)
	}
}

// psdtOK reports whether a non-fabrics command says its data pointer is
// an SGL: PSDT 01 (MPTR a buffer; what Linux hosts send) or 10 (MPTR a
// segment; there is no metadata, so it does not matter). PRP (00) means
// nothing on fabrics and 11 is reserved. nvmet accepts only 01.
func psdtOK(c *nvme.Command) bool {
	p := c.PSDT()
	return p == nvme.PSDTSGLMetaBuf || p == nvme.PSDTSGLMetaSeg
}

// data returns the request's data buffer, or nil if the binding gave a
// buffer shorter than Len.
func (r *Request) data() []byte {
	if uint64(len(r.Data)) < uint64(r.Len) {
		return nil
	}
	return r.Data[:r.Len]
}

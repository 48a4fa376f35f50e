package soft

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft/wire"
)

// Config selects the soft provider's options. The zero value is the
// default.
type Config struct {
	// CRC asks for MPA CRC32C on every connection (the MPA C flag). CRC is
	// used when either side asks for it.
	CRC bool
	// FPDUSize caps the size of an FPDU on the wire, header to CRC. 0 sizes
	// FPDUs to the connection's TCP maximum segment size (at most 65541
	// bytes, a full 16-bit ULPDU).
	FPDUSize int
	// FirstFPDUDelay is the pause, on the active side, between receiving
	// the MPA reply and sending the first FPDU. Linux siw, as responder,
	// does not process an FPDU that arrives right after its reply until
	// more data comes (shared/docs/vm-notes.md). 0 means the default,
	// DefaultFirstFPDUDelay; a negative value means no pause.
	FirstFPDUDelay time.Duration
	// ConnectTimeout bounds the MPA exchange when the caller's context has
	// no deadline. 0 means transport.DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// ObserveReadRequest, if set, sees every RDMA READ request a peer
	// sends to this adapter's QPs, on the receiving goroutine, before it
	// is served: the peer's sink STag and offset are on the wire, and a
	// test of what a peer can do with them (keep the key, write to it)
	// needs them, as a packet capture would show them.
	ObserveReadRequest func(sinkSTag uint32, sinkTO uint64, size uint32)
	// StrictReadSink makes an RDMA read's sink need remote write, as the
	// tagged model of RFC 5040 and iWARP hardware have it: the adapter
	// then clears transport.FlagReadSinkLocal. By default, as Linux siw,
	// a read response may land only in the sink of the read it answers
	// (the oldest outstanding one: its STag, within its range), which
	// needs only local write, so a read's sink lends the peer nothing.
	StrictReadSink bool
	// PollGroup runs each CQ as a poll group: the CQ's goroutine, locked
	// to its OS thread (pinned when the CQ has an affinity), does the
	// socket I/O of the QPs whose receive CQ it is, so a completion is
	// received, notified, handled and answered on one thread (see
	// poll_linux.go). The default, false, runs a sender and a receiver
	// goroutine per QP and a notification goroutine per CQ. Linux only:
	// elsewhere New refuses it with ErrNotSupported.
	PollGroup bool
	// PollSpin is the longest a poll group keeps polling (epoll_wait
	// without blocking) after it found work, before it sleeps (hybrid
	// polling); the window adapts between 2 µs and PollSpin to the gaps
	// between messages. 0 (the default) never spins: measured on the
	// 2-core development VM with both ends in one process, a 50 µs window
	// made a 64 B ping-pong slower (14 against 8 µs), the spinning taking
	// the CPU the peer needed. SuggestedPollSpin is a starting point
	// where the peer is elsewhere and cores are spare.
	PollSpin time.Duration
}

// SuggestedPollSpin is a Config.PollSpin to try where cores are spare: a
// few loopback round trips, so that queue-depth-1 traffic finds the group
// awake, while an idle group spins at most once after its last message.
const SuggestedPollSpin = 50 * time.Microsecond

// PollGroupsSupported says whether Config.PollGroup works on this
// system (Linux: epoll).
func PollGroupsSupported() bool { return pollSupported }

// DefaultFirstFPDUDelay is the default Config.FirstFPDUDelay.
const DefaultFirstFPDUDelay = 5 * time.Millisecond

// Limits of the soft provider, each with its reason.
const (
	// maxSge: NVMe/RDMA needs 1–2 SGEs per request; 8 covers a capsule plus
	// a data buffer split across pages, and keeps a request slot (which
	// embeds its SGE array) small: 8×16 B.
	maxSge = 8
	// maxInline: an NVMe command capsule is 64 B, a response 16 B; 256 B
	// leaves room for in-capsule data headers. Copied into the request
	// slot at post time.
	maxInline = 256
	// maxQueueDepth: NVMe allows 65535 entries per queue; 16384 initiator
	// or receive requests per QP is beyond any sane queue and bounds the
	// preallocated slot memory (16384 × ~400 B ≈ 6.5 MiB).
	maxQueueDepth = 16384
	// maxSrqDepth: one SRQ per core serves every QP of that core.
	maxSrqDepth = 1 << 16
	// maxCqDepth: a CQ preallocates its ring (about 80 B a completion):
	// 1<<18 entries is 20 MiB, enough for an SRQ plus 16 deep QPs.
	maxCqDepth = 1 << 18
	// maxTransfer: the largest message; NVMe MDTS is derived from it.
	maxTransfer = 16 << 20
	// maxReadLimit: IRD/ORD per connection (the Linux NVMe host offers
	// IRD 128).
	maxReadLimit = 128
	// maxPrivateData: MPA allows 512 bytes of private data, but Linux's
	// iWARP connection manager (and so siw) refuses more than 256, and
	// revision 2 takes 4 of them for IRD/ORD. 252 keeps every peer
	// reachable; NVMe/RDMA needs 32.
	maxPrivateData = wire.LinuxMaxPrivateData - wire.EnhancedLen
)

// Adapter is a soft RDMA adapter. It implements transport.Adapter.
type Adapter struct {
	cfg  Config
	info transport.AdapterInfo

	mu        sync.Mutex
	closed    bool
	listeners map[*listener]struct{}
	qps       map[*qp]struct{}
	cqs       map[*cq]struct{}
}

var _ transport.Adapter = (*Adapter)(nil)

// New opens a soft adapter.
func New(cfg Config) (*Adapter, error) {
	if cfg.FPDUSize != 0 && (cfg.FPDUSize < 64 || cfg.FPDUSize > wire.FPDULen(wire.MaxULPDU)) {
		return nil, fmt.Errorf("soft: FPDUSize %d outside [64, %d]: %w", cfg.FPDUSize, wire.FPDULen(wire.MaxULPDU), transport.ErrInvalidParameter)
	}
	if cfg.PollGroup && !pollSupported {
		return nil, fmt.Errorf("soft: poll groups need Linux (epoll): %w", transport.ErrNotSupported)
	}
	if cfg.PollSpin < 0 {
		cfg.PollSpin = 0
	}
	if cfg.FirstFPDUDelay == 0 {
		cfg.FirstFPDUDelay = DefaultFirstFPDUDelay
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = transport.DefaultConnectTimeout
	}
	a := &Adapter{
		cfg:       cfg,
		listeners: make(map[*listener]struct{}),
		qps:       make(map[*qp]struct{}),
		cqs:       make(map[*cq]struct{}),
	}
	// FlagSRQReceiverWait: a receiver goroutine sleeps until the SRQ's
	// next post; a poll group leaves the message unread in its buffer and
	// stops reading that socket until then (it must not sleep: the buffers
	// may be given back on its own thread).
	flags := transport.FlagCQInterruptModerationSupported | transport.FlagLoopbackConnectionsSupported | transport.FlagSRQReceiverWait |
		transport.FlagSolicitedNotifySupported | transport.FlagRemoteErrorsReported | transport.FlagRemoteReadEnforced
	if runtime.NumCPU() > 1 {
		flags |= transport.FlagMultiEngineSupported
	}
	if !cfg.StrictReadSink {
		flags |= transport.FlagReadSinkLocal
	}
	a.info = transport.AdapterInfo{
		VendorID:               0x626c6b, // "blk"
		DeviceID:               1,
		MaxRegistrationSize:    1 << 40,
		MaxInitiatorRequestSge: maxSge,
		MaxReceiveRequestSge:   maxSge,
		MaxReadRequestSge:      1,
		MaxTransferLength:      maxTransfer,
		MaxInlineDataSize:      maxInline,
		MaxInboundReadLimit:    maxReadLimit,
		MaxOutboundReadLimit:   maxReadLimit,
		MaxReceiveQueueDepth:   maxQueueDepth,
		MaxInitiatorQueueDepth: maxQueueDepth,
		MaxSrqDepth:            maxSrqDepth,
		MaxCqDepth:             maxCqDepth,
		LargeRequestThreshold:  4096,
		MaxCallerData:          maxPrivateData,
		MaxCalleeData:          maxPrivateData,
		FRMRPageCount:          maxTransfer / 4096,
		Cores:                  runtime.NumCPU(),
		Flags:                  flags,
	}
	return a, nil
}

// Info reports the adapter's limits.
func (a *Adapter) Info() transport.AdapterInfo { return a.info }

// CreatePD creates a protection domain.
func (a *Adapter) CreatePD() (transport.PD, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return newPD(a), nil
}

func (a *Adapter) check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return transport.ErrClosed
	}
	return nil
}

// Close closes every listener and QP of the adapter and stops its CQs.
func (a *Adapter) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	ls := make([]*listener, 0, len(a.listeners))
	for l := range a.listeners {
		ls = append(ls, l)
	}
	qs := make([]*qp, 0, len(a.qps))
	for q := range a.qps {
		qs = append(qs, q)
	}
	cs := make([]*cq, 0, len(a.cqs))
	for c := range a.cqs {
		cs = append(cs, c)
	}
	a.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, q := range qs {
		q.Close()
	}
	for _, c := range cs {
		c.Close()
	}
	return nil
}

func (a *Adapter) track(m any, add bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch v := m.(type) {
	case *listener:
		if add {
			a.listeners[v] = struct{}{}
		} else {
			delete(a.listeners, v)
		}
	case *qp:
		if add {
			a.qps[v] = struct{}{}
		} else {
			delete(a.qps, v)
		}
	case *cq:
		if add {
			a.cqs[v] = struct{}{}
		} else {
			delete(a.cqs, v)
		}
	}
}

func (a *Adapter) connectContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, a.cfg.ConnectTimeout)
}

// asNet is a helper for the address methods of closed objects.
func asNet(c net.Conn, remote bool) net.Addr {
	if c == nil {
		return nil
	}
	if remote {
		return c.RemoteAddr()
	}
	return c.LocalAddr()
}

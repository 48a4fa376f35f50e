package transport

import (
	"context"
	"net"
	"time"
)

// AdapterFlags are NDK_ADAPTER_FLAG_* capability bits.
type AdapterFlags uint32

const (
	// FlagCQInterruptModerationSupported is
	// NDK_ADAPTER_FLAG_CQ_INTERRUPT_MODERATION_SUPPORTED (M9).
	FlagCQInterruptModerationSupported AdapterFlags = 1 << iota
	// FlagMemoryWindowsSupported says memory windows work: the PD is a
	// MemoryWindowPD and the QPs are BindQPs that succeed. A provider
	// without those interfaces never sets it; one with them that runs on
	// an adapter without windows leaves it clear and refuses with
	// ErrNotSupported.
	FlagMemoryWindowsSupported
	// FlagLoopbackConnectionsSupported says a QP may connect to a listener
	// of the same adapter.
	FlagLoopbackConnectionsSupported
	// FlagMultiEngineSupported says CQs are served by more than one engine
	// (core), so per-core CQs really run in parallel.
	FlagMultiEngineSupported
	// FlagSolicitedNotifySupported says Arm(NotifySolicited) works: only a
	// receive the peer sent with FlagSolicitedEvent (or an error)
	// satisfies it. Following M9's pattern, an adapter without it still
	// takes the call and answers ErrNotSupported, leaving the CQ unarmed.
	// (No NDK_ADAPTER_FLAG names this; NDK assumes every adapter can. siw
	// cannot: it never marks a receive completion solicited.)
	FlagSolicitedNotifySupported
	// FlagRemoteErrorsReported says the initiator of an RDMA read or
	// write that the peer refused (wrong key, out of bounds, missing
	// right) is told why: the request, or the QP's Err if the write
	// completed first, is ErrAccessViolation. Without it the peer still
	// refuses and fails with ErrAccessViolation, but the initiator only
	// sees its connection end (ErrDisconnected; its outstanding requests
	// ErrCancelled, a write possibly completed).
	FlagRemoteErrorsReported
	// FlagRemoteReadEnforced says a region registered without
	// AccessRemoteRead refuses a peer's RDMA read. Without it (siw: it
	// checks only keys and bounds for a read response) a peer holding
	// the region's key can read it: a consumer must not count on the
	// missing right to keep data from the peer.
	FlagRemoteReadEnforced
	// FlagReadSinkLocal is NDK_ADAPTER_FLAG_RDMA_READ_SINK_NOT_REQUIRED:
	// the sink of an RDMA read needs only AccessLocalWrite (InfiniBand,
	// RoCE: the response is matched to the request, not addressed). Clear
	// on iWARP, where a read response is a tagged write into the sink's
	// STag: the sink must be remotely writable, and the peer learns its
	// key from the read request. A consumer that lends a peer no other
	// right then registers each read's sink for that read alone
	// (fast-register, then invalidate), as Linux nvmet does on iWARP.
	FlagReadSinkLocal
	// FlagSRQReceiverWait says a send that arrives at a QP whose SRQ has
	// no receive queued waits until one is posted, instead of ending the
	// connection: InfiniBand and RoCE retry "receiver not ready" (with an
	// unbounded RNR retry count), the soft provider stops reading that
	// connection, so TCP holds the peer back. Its QP's later traffic
	// waits behind it; other QPs of the SRQ are not held up. A consumer
	// may then give an SRQ fewer receives than its QPs' peers may send at
	// once (a core's buffers sized for its throughput, not for every
	// queue full). Without it (iWARP hardware, siw) an empty SRQ ends the
	// connection that finds it so, as an empty receive queue always does
	// (SendWithoutReceive).
	FlagSRQReceiverWait
)

// MaxUint32 is NDK's MAXULONG, the "no limit" value of interrupt moderation
// (M3, M7, M8).
const MaxUint32 = ^uint32(0)

// AdapterInfo is NDK_ADAPTER_INFO: the limits every creation and post call
// is checked against. A provider reports them truthfully.
type AdapterInfo struct {
	VendorID, DeviceID uint32

	// MaxRegistrationSize is the largest memory region, in bytes.
	MaxRegistrationSize uint64
	// MaxInitiatorRequestSge is the most SGEs of a send, write or read.
	MaxInitiatorRequestSge uint32
	// MaxReceiveRequestSge is the most SGEs of a receive (QP or SRQ).
	MaxReceiveRequestSge uint32
	// MaxReadRequestSge is the most SGEs of an RDMA read's local sink
	// (iWARP: 1, the read response lands in one tagged buffer).
	MaxReadRequestSge uint32
	// MaxTransferLength is the largest message (send or RDMA), in bytes.
	MaxTransferLength uint32
	// MaxInlineDataSize is the most bytes a send or write may carry inline.
	MaxInlineDataSize uint32
	// MaxInboundReadLimit and MaxOutboundReadLimit bound a connection's IRD
	// and ORD (RDMA reads in flight as responder and as requester).
	MaxInboundReadLimit, MaxOutboundReadLimit uint32
	// Queue limits (Q2, S2, C2).
	MaxReceiveQueueDepth   uint32
	MaxInitiatorQueueDepth uint32
	MaxSrqDepth            uint32
	MaxCqDepth             uint32
	// LargeRequestThreshold is the size above which RDMA beats a copy.
	LargeRequestThreshold uint32
	// MaxCallerData and MaxCalleeData are the most bytes of private data in
	// a connect request and in an accept or reject.
	MaxCallerData, MaxCalleeData uint32
	// FRMRPageCount is the most pages a fast-registered region may span;
	// 0 means no fast registration (always 0 from a provider whose PD is
	// not a FastRegisterPD or whose QPs are not FastRegisterQPs).
	FRMRPageCount uint32
	// Cores is the number of processors notifications can be pinned to.
	Cores int
	Flags AdapterFlags
}

// Access is a memory region's access rights (NDK_MR_FLAG_*).
type Access uint32

const (
	AccessLocalWrite Access = 1 << iota
	AccessRemoteRead
	AccessRemoteWrite
	AccessMWBind
)

// SGE is one scatter/gather entry: Length bytes at virtual address Addr of
// the memory region whose local key is LKey. Addresses are the virtual
// addresses of the registered memory (MemoryRegion.Addr() plus an offset).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// OpType says which request a completion belongs to.
type OpType uint8

const (
	OpReceive OpType = iota + 1
	OpSend
	OpWrite
	OpRead
	OpFastRegister
	OpInvalidate
	OpBind
)

var opNames = [...]string{"", "receive", "send", "write", "read", "fast-register", "invalidate", "bind"}

func (o OpType) String() string {
	if int(o) < len(opNames) && o != 0 {
		return opNames[o]
	}
	return "unknown-op"
}

// PostFlags are NDK_OP_FLAG_* options of a post.
type PostFlags uint32

const (
	// FlagSilentSuccess: no completion on success (an error still completes).
	FlagSilentSuccess PostFlags = 1 << iota
	// FlagInline: the payload is copied at post time (at most the QP's
	// InlineDataSize bytes), so the memory may be reused as soon as the
	// post returns. Unlike verbs, the SGEs must still name registered
	// memory: a Go provider cannot safely read an arbitrary address, and
	// the key check keeps a stale SGE from leaking another buffer.
	FlagInline
	// FlagDefer: queue the request but do not start it until a later post
	// without FlagDefer on the same queue (one doorbell for a batch).
	FlagDefer
	// FlagReadFence: start only after every earlier RDMA read completed.
	FlagReadFence
	// FlagSolicitedEvent: the peer's receive completion is solicited.
	FlagSolicitedEvent
	// FlagAllowRemoteRead / FlagAllowRemoteWrite: access of a fast-register.
	FlagAllowRemoteRead
	FlagAllowRemoteWrite
)

// Completion is NDK_RESULT_EX: one finished request.
type Completion struct {
	// Status is nil on success, else one of the sentinel errors.
	Status error
	// QPContext is the QPConfig.Context of the QP the request was posted
	// on (Q3). For a receive taken from an SRQ it is the QP that received.
	QPContext any
	// RequestContext is the context given at post time.
	RequestContext any
	// Bytes is the number of bytes transferred (receives: the message
	// length).
	Bytes uint32
	Type  OpType
	// InvalidatedKey is the key a send-with-invalidate invalidated on this
	// side (receives only; valid when Invalidated).
	InvalidatedKey uint32
	Invalidated    bool
}

// ArmType chooses which completions satisfy an arm (NDK_CQ_NOTIFY_*).
type ArmType uint8

const (
	NotifyAny ArmType = iota
	NotifyErrors
	NotifySolicited
)

// NotifyFunc is a CQ or SRQ notification callback. It runs on the object's
// own goroutine and must not block. status is nil for a normal
// notification, ErrCQOverflow when a CQ overran, ErrClosed when the object
// is being closed.
type NotifyFunc func(context any, status error)

// CQConfig are the arguments of CreateCQ (C1).
type CQConfig struct {
	Depth   uint32
	Notify  NotifyFunc
	Context any
	// Affinity is the processor the CQ's notifications should run on, or
	// -1 for no preference (C6).
	Affinity int
}

// SRQConfig are the arguments of CreateSRQ (S1).
type SRQConfig struct {
	Depth  uint32
	MaxSge uint32
	// NotifyThreshold arms the notification: Notify is called once when
	// the number of queued receives falls below it (S4). 0 leaves it
	// unarmed. Re-arm with Modify.
	NotifyThreshold uint32
	Notify          NotifyFunc
	Context         any
	Affinity        int
}

// QPConfig are the arguments of CreateQP (Q1).
type QPConfig struct {
	ReceiveCQ   CQ
	InitiatorCQ CQ
	// SRQ, when set, supplies the QP's receives; ReceiveQueueDepth and
	// MaxReceiveRequestSge are then ignored.
	SRQ     SRQ
	Context any

	ReceiveQueueDepth      uint32
	InitiatorQueueDepth    uint32
	MaxReceiveRequestSge   uint32
	MaxInitiatorRequestSge uint32
	InlineDataSize         uint32
}

// ConnParams are what a side offers when connecting or accepting.
type ConnParams struct {
	// InboundReadLimit (IRD) is how many RDMA reads this side will serve at
	// once; OutboundReadLimit (ORD) how many it will issue at once. 0 means
	// the adapter's maximum.
	InboundReadLimit, OutboundReadLimit uint32
	// PrivateData travels with the connect request or the accept/reject
	// (at most AdapterInfo.MaxCallerData / MaxCalleeData bytes).
	PrivateData []byte
}

// Adapter is an opened RDMA device (NDK_ADAPTER).
type Adapter interface {
	Info() AdapterInfo
	CreatePD() (PD, error)
	// CreateCQ creates a completion queue (C1–C7).
	CreateCQ(cfg CQConfig) (CQ, error)
	// Listen starts accepting connections at addr (host:port).
	Listen(addr string) (Listener, error)
	// Connect connects qp to the listener at addr. It returns the peer's
	// accept private data, or an error: a *RejectError (matching
	// ErrConnectionRefused) when rejected, ErrIOTimeout when ctx ended.
	Connect(ctx context.Context, qp QP, addr string, p ConnParams) (peerPrivateData []byte, err error)
	Close() error
}

// PD is a protection domain (NDK_PD). Memory, QPs and SRQs belong to one.
// It holds what every consumer needs; fast registration and memory windows
// are the optional FastRegisterPD and MemoryWindowPD.
type PD interface {
	// AllocateMemory allocates length bytes of zeroed, provider-owned
	// memory and registers it (NDK_MR) with the given access; local write
	// is implied for remote write. It is how a consumer gets memory it
	// allocates only to register: the provider picks memory its device
	// may access for as long as the region lives (outside the Go heap,
	// which a collector may move or free and which must not be handed to
	// C to keep: the soft provider maps anonymous memory, a verbs
	// provider memory it can pin), so the safe thing is the easy one.
	//
	// Bytes() is that memory. It belongs to the region: Close gives it
	// back (the soft provider unmaps it), and neither Bytes() nor any
	// slice of it may be used after Close (a fault, not a stale read).
	// Close a region only after the requests that name it completed or
	// their QP is closed. A length of 0 or above MaxRegistrationSize is
	// ErrInvalidParameter; running out is ErrInsufficientResources.
	AllocateMemory(length int, access Access) (MemoryRegion, error)
	// RegisterMemory registers buf, memory the caller owns (NDK_MR), with
	// the given access; local write is implied for remote write. The
	// region's keys are valid until it is closed, and the caller keeps
	// buf alive and in place until then. It is for providers that can
	// register Go memory (the soft provider); a provider whose device
	// reads and writes memory by DMA may pin buf or refuse
	// (ErrNotSupported), so consumers that allocate a buffer only to
	// register it use AllocateMemory instead.
	RegisterMemory(buf []byte, access Access) (MemoryRegion, error)
	CreateQP(cfg QPConfig) (QP, error)
	CreateSRQ(cfg SRQConfig) (SRQ, error)
	Close() error
}

// MemoryRegion is registered memory (NDK_MR).
type MemoryRegion interface {
	// LKey is the token local SGEs name; RKey the token a peer names.
	LKey() uint32
	RKey() uint32
	// Addr is the virtual address of Bytes()[0] (0 while unbound).
	Addr() uint64
	// Bytes is the registered memory (nil while unbound). For a region
	// from PD.AllocateMemory it is provider-owned and must not be used
	// after Close.
	Bytes() []byte
	// SGE returns the entry for Bytes()[off:off+n].
	SGE(off, n uint32) SGE
	Close() error
}

// MemoryWindow is NDK_MW.
type MemoryWindow interface {
	RKey() uint32
	Close() error
}

// CQ is a completion queue (NDK_CQ).
type CQ interface {
	// Poll moves up to len(out) completions into out and returns how many.
	Poll(out []Completion) int
	// Arm requests one notification (C4): the callback runs once, when a
	// completion of the given type is (or already is) on the CQ, deferred
	// within the moderation settings (M1–M7).
	Arm(t ArmType) error
	// ControlInterruptModeration sets moderation (M1–M13); interval in µs.
	ControlInterruptModeration(interval, count uint32) error
	Depth() uint32
	Close() error
}

// SRQ is a shared receive queue (NDK_SRQ).
type SRQ interface {
	PostReceive(requestContext any, sges []SGE) error
	// Modify changes the depth (0 keeps it) and re-arms the threshold
	// notification; it fires at once if already below (S4).
	Modify(depth, notifyThreshold uint32) error
	// Queued is the number of receives currently queued.
	Queued() int
	Close() error
}

// QP is a queue pair (NDK_QP). Post calls never block: past the queue's
// depth they fail with ErrInsufficientResources (Q4). It holds what every
// consumer needs; fast registration, memory window binds and flush are the
// optional FastRegisterQP, BindQP and FlushQP.
type QP interface {
	Context() any
	PostReceive(requestContext any, sges []SGE) error
	Send(requestContext any, sges []SGE, flags PostFlags) error
	// SendInvalidate sends and invalidates the peer's remoteKey on arrival.
	SendInvalidate(requestContext any, sges []SGE, remoteKey uint32, flags PostFlags) error
	Write(requestContext any, sges []SGE, remoteAddr uint64, remoteKey uint32, flags PostFlags) error
	// Read fetches len(sink) bytes from the peer into sink; the sink's
	// region needs AccessRemoteWrite on iWARP (the response is a tagged
	// write into it).
	Read(requestContext any, sink []SGE, remoteAddr uint64, remoteKey uint32, flags PostFlags) error
	// Disconnect ends the connection; outstanding requests complete with
	// ErrCancelled.
	Disconnect() error
	// Done is closed when the connection ends; Err says why.
	Done() <-chan struct{}
	Err() error
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	Close() error
}

// Listener is NDK_LISTENER.
type Listener interface {
	// GetConnectionRequest blocks for the next incoming connection.
	GetConnectionRequest(ctx context.Context) (ConnRequest, error)
	Addr() net.Addr
	Close() error
}

// ConnRequest is an incoming connection (NDK_CONNECTOR on the passive
// side), to be accepted onto a QP or rejected.
type ConnRequest interface {
	PrivateData() []byte
	// ReadLimits are the peer's offered IRD and ORD.
	ReadLimits() (ird, ord uint32)
	RemoteAddr() net.Addr
	LocalAddr() net.Addr
	Accept(ctx context.Context, qp QP, p ConnParams) error
	Reject(privateData []byte) error
}

// DefaultConnectTimeout bounds connection setup when ctx has no deadline.
const DefaultConnectTimeout = 10 * time.Second

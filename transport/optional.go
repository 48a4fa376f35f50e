package transport

// Optional provider interfaces.
//
// The mandatory interfaces (Adapter, PD, MemoryRegion, CQ, SRQ, QP,
// Listener, ConnRequest) hold what the consumers in this repository call:
// the engine, target/rdma and the initiator. What no consumer needs lives
// here, one interface per feature, found by type assertion on the PD or QP
// a provider returned, as hashicorp/raft finds its transport extras
// (WithClose, WithPeers, WithPreVote):
//
//	if fq, ok := qp.(transport.FlushQP); ok {
//		err = fq.Flush()
//	}
//
// A provider implements an interface only when it can do the feature on
// some adapter; whether the adapter it opened can is then said by
// AdapterInfo (FRMRPageCount, FlagMemoryWindowsSupported), and a call on
// an adapter that cannot returns ErrNotSupported. A provider that does not
// implement an interface must report the matching AdapterInfo field as
// "none", so that a consumer reading only AdapterInfo never picks a
// feature that a type assertion would then refuse. The conformance suite
// (transporttest) checks both halves and skips the feature's tests, naming
// the missing interface, when a provider lacks it.

// FastRegisterPD makes regions for fast registration (NDK's
// NdkCreateMr with NDK_MR_FLAG_ALLOW_FAST_REGISTER and no memory yet).
// Together with FastRegisterQP it is the fast-register feature; a provider
// has both or neither.
//
// Without it (or with AdapterInfo.FRMRPageCount = 0), a consumer registers
// every buffer a peer may access up front with PD.RegisterMemory (or
// allocates it with PD.AllocateMemory) and hands out that region's RKey:
// what target/rdma and the initiator do.
type FastRegisterPD interface {
	// AllocateMR makes a region of at most maxLen bytes with no memory
	// yet, to be bound per I/O with FastRegisterQP.FastRegister. Its
	// Addr and Bytes are zero until a fast-register has run.
	AllocateMR(maxLen uint32) (MemoryRegion, error)
}

// FastRegisterQP posts fast-register and local-invalidate requests on the
// initiator queue (NdkFastRegister, NdkInvalidate). They take an
// initiator slot like any initiator request (Q4) and complete on the
// initiator CQ with OpFastRegister and OpInvalidate (Q5), in send-queue
// order with the requests around them.
//
// Without it, a peer's send-with-invalidate still works on the receive
// side of a QP (QP.SendInvalidate is mandatory: the target answers the
// initiator's keys with it), but this side cannot fast-register a key to
// be invalidated.
type FastRegisterQP interface {
	// FastRegister binds buf to mr (made by FastRegisterPD.AllocateMR
	// on the same PD) and returns the new key the peer must use once the
	// request has run.
	FastRegister(requestContext any, mr MemoryRegion, buf []byte, access Access, flags PostFlags) (key uint32, err error)
	// Invalidate invalidates a fast-registered key (local invalidate).
	Invalidate(requestContext any, mr MemoryRegion, flags PostFlags) error
}

// MemoryWindowPD creates memory windows (NdkCreateMw). Together with BindQP
// it is the memory-window feature; a provider has both or neither.
//
// Without it, FlagMemoryWindowsSupported is clear, and a region registered
// with AccessMWBind may be refused (ErrNotSupported): remote access is
// granted per region, by its RKey, as the consumers here do.
type MemoryWindowPD interface {
	// CreateMemoryWindow makes a window for BindQP.Bind
	// (ErrNotSupported when the adapter lacks FlagMemoryWindowsSupported).
	CreateMemoryWindow() (MemoryWindow, error)
}

// BindQP posts memory-window binds on the initiator queue (NdkBind): an
// initiator request (Q4) that completes on the initiator CQ with OpBind
// (Q5). After it has run, the peer reaches buf (a part of mr, which was
// registered with AccessMWBind) through the window's RKey.
type BindQP interface {
	Bind(requestContext any, mr MemoryRegion, mw MemoryWindow, buf []byte, access Access, flags PostFlags) error
}

// FlushQP cancels a QP's outstanding requests at once (NdkFlush; no
// numbered rule: the requests it cancels are the ones Q4 counts, and each
// completes on its own CQ, Q5, with ErrCancelled). The QP is in error
// afterwards, as after a verbs flush: its connection ends.
//
// Without it, QP.Disconnect (or Close) is how a consumer ends its
// outstanding requests: they complete with ErrCancelled too, which is all
// the consumers here need when they give up on a queue.
type FlushQP interface {
	// Flush cancels every outstanding request (ErrCancelled).
	Flush() error
}

// CQCounter is a CQ that counts its provider's own work, for metrics
// (metrics.EngineCollector exports it per core with the provider's name).
// The engine's Stats count what the consumer saw; these count what the
// provider did underneath, so the two side by side show, for example,
// device events that produced no notification.
type CQCounter interface {
	CQCounters() CQCounters
}

// CQCounters are a CQ's provider-level counts.
type CQCounters struct {
	// Provider names the provider ("soft", "verbs").
	Provider string
	// Completions is how many completions went through the CQ.
	Completions uint64
	// Notifications is how many notification callbacks ran (ErrClosed's
	// included).
	Notifications uint64
	// DeviceEvents is how many times the device woke the notification
	// goroutine (verbs: completion-channel events; soft: 0, it has none).
	DeviceEvents uint64
	// Pinned says the notification goroutine runs on a thread pinned to
	// the CQ's affinity.
	Pinned bool
	// HardwareModeration says interrupt moderation is the device's
	// (ibv_modify_cq) rather than the provider's, in software.
	HardwareModeration bool
}

// AdapterCounter is an adapter that counts the asynchronous events its
// device reported (verbs: ibv_get_async_event), for metrics.
type AdapterCounter interface {
	AdapterCounters() AdapterCounters
}

// AdapterCounters are an adapter's asynchronous event counts.
type AdapterCounters struct {
	Provider string
	// QPFatal counts fatal QP errors (IBV_EVENT_QP_FATAL, QP_REQ_ERR),
	// QPAccess access errors (IBV_EVENT_QP_ACCESS_ERR), SRQLimit SRQ
	// limit events (S4), CQError CQ overruns (IBV_EVENT_CQ_ERR),
	// DeviceFatal device failures, Other every other event.
	QPFatal, QPAccess, SRQLimit, CQError, DeviceFatal, Other uint64
}

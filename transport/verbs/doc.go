// Package verbs is blk's rdma-core provider: the transport API of package
// transport on any RDMA device the kernel's verbs stack drives — Soft-RoCE
// (rxe), Soft-iWARP (siw), RoCE and InfiniBand NICs, iWARP NICs — through
// libibverbs (devices, PDs, MRs, CQs with completion channels, RC QPs,
// SRQs, asynchronous events) and librdmacm (addresses, listen, connect,
// accept and reject with private data). It needs cgo and rdma-core's
// headers, so it is built only with the verbs tag:
//
//	go build -tags verbs ./...   (apt-get install libibverbs-dev librdmacm-dev)
//
// Without the tag the package holds only this documentation, so the
// default build and go test ./... stay pure Go.
//
// Structure, per object (details in each file):
//
//   - Adapter: one ibv_context opened by device name (or the device that
//     owns an IP address, asked of rdma_cm), its attributes turned into
//     transport.AdapterInfo, one goroutine reading the context's
//     asynchronous events (QP errors, SRQ limit, CQ overrun) and one
//     reading the adapter's rdma_cm event channel.
//   - CQ: an ibv_cq with its own completion channel and one notification
//     goroutine that waits on the channel's fd (and an eventfd for the
//     provider's own wake-ups) with ppoll(2), pinned to the CQ's affinity;
//     arming follows NDK (one-shot, completions already there satisfy it).
//     Moderation is ibv_modify_cq where the device has it and software on
//     the notification path where not (rxe, siw).
//   - QP: an RC ibv_qp created in the caller's PD and moved to RTS by the
//     provider with the attributes rdma_cm computes; request contexts live
//     in per-queue slot tables indexed by the 64-bit wr_id, work requests
//     in C memory preallocated per slot, so a post allocates nothing.
//   - SRQ: an ibv_srq; its threshold notification (S4) is the device's
//     limit event (IBV_EVENT_SRQ_LIMIT_REACHED).
//   - MemoryRegion: from PD.AllocateMemory, anonymous memory the provider
//     maps (outside the Go heap); from PD.RegisterMemory, the caller's
//     []byte pinned with runtime.Pinner for the region's lifetime (so C
//     and the device may keep its address) and registered in place.
//
// What the devices cannot do, and what the provider answers (the
// conformance suite passes on rxe and siw, taking these answers):
//
//   - Fast registration: userspace verbs has no fast-register work
//     request, so the provider does not implement transport.FastRegisterPD
//     and FastRegisterQP and reports FRMRPageCount 0.
//   - Memory windows: siw has none; the provider implements no
//     MemoryWindowPD/BindQP on any device and leaves
//     FlagMemoryWindowsSupported clear.
//   - Interrupt moderation: rxe and siw report caps 0/0 (ibv_modify_cq is
//     EOPNOTSUPP); the provider moderates in software, sets
//     FlagCQInterruptModerationSupported and never answers ErrNotSupported
//     (M9). Adapter.HardwareModeration tells the two apart.
//   - Solicited-only arms on siw: siw (6.1) never marks a receive
//     completion solicited, so the adapter leaves
//     FlagSolicitedNotifySupported clear and Arm(NotifySolicited)
//     answers ErrNotSupported there (M9's pattern; no consumer in blk
//     arms for solicited completions).
//   - A peer's Terminate on siw: the initiator of a request the peer
//     refused (an RDMA read or write through a wrong key, out of bounds or
//     without the right) is not told why: siw flushes the request
//     (ErrCancelled; a write may already have completed) and the
//     connection ends as a disconnect (ErrDisconnected); the refusing
//     peer ends with whichever of the device's access-error event
//     (ErrAccessViolation), fatal-error event (ErrConnectionReset) or
//     disconnect comes first. Neither side's memory is touched.
//     The adapter leaves FlagRemoteErrorsReported clear. On rxe the
//     initiator gets ErrAccessViolation as the flag promises.
//   - Remote read rights on siw: siw serves a peer's RDMA read of a
//     region registered without AccessRemoteRead (it checks the key, PD
//     and bounds only), so FlagRemoteReadEnforced is clear there. It
//     matters to blkd: on iWARP the sink of an RDMA READ must be remotely
//     writable, so the target's buffer pool is registered
//     AccessRemoteWrite and its key travels in every read request the
//     target sends. On siw a host that keeps that key can read the pool,
//     which holds other hosts' data in flight, through its own QP in the
//     same PD. blkd on siw is for tests and single-tenant use; the
//     provider cannot close this (the device answers the read without
//     software), a fixed siw or an iWARP NIC does.
//
// deviceSemantics (adapter.go) is where those three flags are decided.
//   - Private data on InfiniBand/RoCE travels in fixed-size CM fields: the
//     provider keeps the length in a two-byte trailer (cm.go), which leaves
//     54 bytes for a connect and 146 for an accept or reject; siw takes
//     248 on either.
//
// What this package must never do: hand the device Go memory that is not
// pinned, allocate per post or per completion, block in a post call, or
// know about NVMe.
package verbs

// Package initiator is blk's NVMe over Fabrics host, for the RDMA and
// the TCP bindings: the library a compute host uses to discover
// subsystems, connect to a controller, and read and write its
// namespaces. It speaks the wire protocol the Linux host speaks
// (shared/docs/nvmeof-wire.md §2, §3, §5, §6, §8), so that its peer may
// be blk's target or the Linux kernel target (nvmet-rdma, nvmet-tcp).
// Config.Transport chooses the binding: "rdma" (the default) over any
// transport.Adapter (the soft iWARP provider, or a NIC), or "tcp", one
// TCP connection per queue with optional header and data digests
// (Config.HeaderDigest, DataDigest) and no adapter. The public API —
// Connect, Discover, Controller, Namespace — is the same for both; the
// supervisor, keep-alive, timeouts and reconnects do not know which
// binding carries the queues.
//
// Layout, one concern per file:
//
//   - config.go: Config, its documented defaults and Validate.
//   - sizing.go: every queue and engine size, computed in one commented
//     function (engineSizing) and the queue-depth clamp (ioQueueDepth).
//   - commands.go: builders of every SQE the host sends.
//   - identify.go: the few Identify fields the host reads, at their offsets.
//   - queue.go: one NVMe queue — request slots indexed by command
//     identifier (tag + generation, like Linux), each with its capsule
//     and data buffer, submission and the completion path. A slot
//     completes when both its events are in: the wire is done with its
//     capsule and data (sent) and its response arrived.
//   - wire.go: the seam between a queue and its binding (place the data,
//     send a capsule, close, release memory).
//   - rdma.go: the NVMe/RDMA wire — one QP of the controller's transport
//     engine, registered slot memory, RDMA CM, the engine's handler.
//   - tcp.go: the NVMe/TCP wire — ICReq/ICResp, a receiver goroutine and
//     a sender goroutine per connection, R2T/H2CData, C2HData, digests.
//   - controller.go: Controller, its states, Connect, Close, failure of an
//     association and the supervisor that reconnects with backoff.
//   - association.go: building one association in the Linux host's order
//     (admin queue, enable, Identify, I/O queues, namespace scan) and its
//     shutdown.
//   - monitor.go: keep-alive, command timeouts, asynchronous events.
//   - resv.go: Reservation Register, Acquire, Release and Report
//     (blocking, on an I/O queue), the notification log page and Set
//     Features Reservation Persistence; for tests and tools.
//   - namespace.go: Namespace, the asynchronous I/O API and the blocking
//     io.ReaderAt / io.WriterAt on top of it.
//   - discover.go: Discover, the discovery controller's log page (TSAS
//     kept raw in each entry); WatchDiscovery, a persistent discovery
//     controller and its discovery log change notices.
//
// Data path, RDMA. Each request slot owns a region of a per-queue
// registered buffer, MaxTransfer bytes long, registered once with remote
// read and remote write access; the keyed SGL (0x40) names it with the
// region's static rkey, so no memory registration happens per I/O. A
// write is copied once from the caller's buffer into its slot (then sent
// in the command capsule when it fits the controller's in-capsule size,
// else RDMA-READ by the target); a read is RDMA-WRITTEN by the target into
// the slot and copied once into the caller's buffer before the callback
// runs. One copy per I/O on this side in both directions. Because keys
// are static, the target must answer with a plain Send: a Send with
// Invalidate is a protocol error that fails the association (the Linux
// target answers 0x40 descriptors with a plain Send).
//
// Data path, TCP. The same slots over plain memory. A write of at most
// the in-capsule size (IOCCSZ×16−64 on I/O queues, 8192 bytes on the
// admin queue and for every fabrics command) follows the SQE in the
// CapsuleCmd (SGL 0x01); a larger one is announced with SGL 0x5A and its
// data sent in H2CData PDUs of at most MAXH2CDATA bytes as R2Ts ask. A
// read is SGL 0x5A; its C2HData payloads are read straight from the
// socket into the slot. Submitting pushes the slot on a lock-free stack
// that the queue's sender goroutine drains, writing a whole batch with
// one writev; a receiver goroutine reads every PDU with fixed buffers.
// Copies: one per I/O each way in user space, as on RDMA (caller ↔
// slot); the kernel's socket copy is the transfer itself.
//
// Failure and recovery. A dead QP or a closed TCP connection, a
// keep-alive without an answer within KATO, an admin command or I/O past
// its timeout, or a protocol violation (unknown command identifier, stale
// generation, remote invalidation; on TCP a header the codec refuses, a
// header digest error, a bad R2T, C2HData out of order, a C2HTermReq)
// fails the association: every command in flight completes with an error
// matching ErrConnectionLost, and the controller reconnects — the whole
// association again, new CNTLID — with exponential backoff until
// CtrlLossTimeout, after which it is lost for good (ErrControllerLost).
// A TCP data digest error fails only its command, with the NVMe status
// Data Transfer Error (as Linux), and is counted (Stats.DataDigestErrors).
//
// What this package must never do: depend on blk's target being the peer
// (only the wire protocol is shared), allocate or take a lock per I/O in
// the steady state of the asynchronous path, block a transport callback,
// retry forever, or import target/.
package initiator

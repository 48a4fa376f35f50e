// Package initiator is blk's NVMe over Fabrics host for the RDMA binding:
// the library a compute host uses to discover subsystems, connect to a
// controller, and read and write its namespaces. It speaks the wire
// protocol the Linux host speaks (shared/docs/nvmeof-wire.md §2, §3, §6,
// §8), so that its peer may be blk's target or the Linux kernel target
// (nvmet-rdma), over any transport.Adapter (the soft iWARP provider, or a
// NIC).
//
// Layout, one concern per file:
//
//   - config.go: Config, its documented defaults and Validate.
//   - sizing.go: every queue and engine size, computed in one commented
//     function (engineSizing) and the queue-depth clamp (ioQueueDepth).
//   - commands.go: builders of every SQE the host sends.
//   - identify.go: the few Identify fields the host reads, at their offsets.
//   - queue.go: one NVMe queue on one QP — request slots indexed by command
//     identifier (tag + generation, like Linux), registered capsule and
//     data buffers per slot, submission and the completion path.
//   - controller.go: Controller, its states, Connect, Close, failure of an
//     association and the supervisor that reconnects with backoff.
//   - association.go: building one association in the Linux host's order
//     (admin queue, enable, Identify, I/O queues, namespace scan) and its
//     shutdown.
//   - monitor.go: keep-alive, command timeouts, asynchronous events.
//   - namespace.go: Namespace, the asynchronous I/O API and the blocking
//     io.ReaderAt / io.WriterAt on top of it.
//   - discover.go: Discover, the discovery controller's log page.
//
// Data path. Each request slot owns a region of a per-queue registered
// buffer, MaxTransfer bytes long, registered once with remote read and
// remote write access; the keyed SGL (0x40) names it with the region's
// static rkey, so no memory registration happens per I/O. A write is copied
// once from the caller's buffer into its slot (then sent in the command
// capsule when it fits the controller's in-capsule size, else RDMA-READ by
// the target); a read is RDMA-WRITTEN by the target into the slot and copied
// once into the caller's buffer before the callback runs. One copy per I/O
// on this side in both directions. Because keys are static, the target must
// answer with a plain Send: a Send with Invalidate is a protocol error that
// fails the association (the Linux target answers 0x40 descriptors with a
// plain Send).
//
// Failure and recovery. A dead QP, a keep-alive without an answer within
// KATO, an admin command or I/O past its timeout, or a protocol violation
// (unknown command identifier, stale generation, remote invalidation) fails
// the association: every command in flight completes with an error
// matching ErrConnectionLost, and the controller reconnects — the whole
// association again, new CNTLID — with exponential backoff until
// CtrlLossTimeout, after which it is lost for good (ErrControllerLost).
//
// What this package must never do: depend on blk's target being the peer
// (only the wire protocol is shared), allocate or take a lock per I/O in
// the steady state of the asynchronous path, block a transport callback,
// retry forever, or import target/.
package initiator

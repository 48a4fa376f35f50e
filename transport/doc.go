// Package transport is blk's RDMA transport API: adapters, protection
// domains, memory regions, completion queues, queue pairs, shared receive
// queues and interrupt moderation, with the semantics of the Windows NDK
// provider interface (ndkpi.h) restated in shared/docs/ndk-semantics.md.
// Every numbered rule there (C1–C7, Q1–Q7, S1–S5, M1–M13) is honoured by
// every provider, and checked by the conformance suite in
// transport/transporttest.
//
// NDK is a kernel C interface; this package keeps its semantics but not its
// C-isms. A call that NDK may finish later (STATUS_PENDING plus a completion
// callback) is one Go call that returns the object or an error. NTSTATUS
// codes are sentinel errors matched with errors.Is. A "notification callback
// at DISPATCH_LEVEL" is a callback that runs on the CQ's (or SRQ's) own
// goroutine, pinned to its affinity where the provider can, and must not
// block.
//
// The seam is split in two. The mandatory interfaces (Adapter, PD,
// MemoryRegion, CQ, SRQ, QP, Listener, ConnRequest; transport.go) hold
// what the consumers call — the Engine, target/rdma and the initiator —
// so that a provider implements what it must and no more. Features no
// consumer needs are optional interfaces found by type assertion on the
// PD or QP (optional.go): FastRegisterPD and FastRegisterQP (fast
// registration and local invalidate), MemoryWindowPD and BindQP (memory
// windows), FlushQP (flush). A provider without one advertises none of it
// in AdapterInfo (FRMRPageCount 0, FlagMemoryWindowsSupported clear).
//
// Registered memory comes two ways: PD.AllocateMemory returns memory the
// provider owns (outside the Go heap where the device needs it; gone at the
// region's Close), which every consumer here uses for buffers it allocates
// only to register; PD.RegisterMemory registers memory the caller owns,
// for providers that can register Go memory.
//
// On top of the provider API sits the Engine (engine.go): one CQ per core,
// one SRQ per core shared by the QPs placed there, a registered receive
// buffer pool replenished from the SRQ threshold notification, QP placement
// in one function, and adaptive interrupt moderation; for a handler with
// work of its own beside the CQ (a PollHandler: a disk engine's eventfd,
// completions handed over by other goroutines), a poll set per core whose
// events are handled serialized with the CQ's (core_poll.go).
//
// What this package must never do: know about NVMe, block I/O or any upper
// protocol; allocate or lock per I/O in the engine's steady state; block in
// a post call.
package transport

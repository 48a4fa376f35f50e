// Package soft is blk's software RDMA provider: the transport API of package
// transport implemented in pure Go over TCP, speaking iWARP on the wire —
// MPA revision 2 connection setup (RFC 5044, RFC 6581), MPA FPDUs with
// optional CRC32C, DDP (RFC 5041) and RDMAP (RFC 5040) — so that its peers
// can be the Linux kernel's Soft-iWARP driver (siw) and iWARP NICs, and the
// product runs where there is no RDMA hardware.
//
// Structure, per object:
//
//   - CQ: a ring of completions under a mutex (many QPs produce, the
//     consumer polls) and one notification goroutine, locked to an OS thread
//     pinned to the CQ's affinity, that applies interrupt moderation
//     (M1–M13) and runs the notification callback.
//   - SRQ: a ring of posted receives shared by the QPs created against it,
//     with its own notification goroutine for the threshold callback (S4).
//   - QP: one TCP connection, a send-queue ring that post calls fill without
//     blocking (Q4), a sender goroutine that drains it and writes FPDUs with
//     writev straight from registered memory, and a receiver goroutine that
//     reads FPDUs and places payload directly into registered memory (RDMA
//     write and read response) or into the consumed receive (send).
//   - PD: the STag table; a region's STag is its table index (24 bits) and
//     an 8-bit key that fast-register changes and invalidation retires.
//     AllocateMemory maps anonymous memory (golang.org/x/sys/unix, outside
//     the Go heap) and Close unmaps it; the sender and receiver pin a
//     provider-owned region while they move data through it, so a Close
//     that races with a transfer refuses the key at once and unmaps when
//     the transfer lets go (never under it).
//
// What this package must never do: panic or hang on bad input from the wire
// (every violation becomes a Terminate and error completions), block a post
// call, drop a completion silently, or know about NVMe.
package soft

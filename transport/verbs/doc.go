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
//     provider's own wake-ups) with poll(2), pinned to the CQ's affinity;
//     arming follows NDK (one-shot, completions already there satisfy it).
//   - QP: an RC ibv_qp created in the caller's PD and moved to RTS by the
//     provider with the attributes rdma_cm computes; request contexts live
//     in per-queue slot tables indexed by the 64-bit wr_id, work requests
//     in C memory preallocated per slot, so a post allocates nothing.
//   - SRQ: an ibv_srq; its threshold notification (S4) is the hardware
//     limit event (IBV_EVENT_SRQ_LIMIT_REACHED) plus an exact check when a
//     receive it supplied is polled.
//   - MemoryRegion: the caller's []byte, pinned with runtime.Pinner for the
//     region's lifetime (so C and the device may keep its address) and
//     registered in place: Bytes() is the caller's slice.
//
// What this package must never do: hand the device Go memory that is not
// pinned, allocate per post or per completion, block in a post call, or
// know about NVMe.
package verbs

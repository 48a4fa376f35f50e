// Package nbd exposes a block device through the Linux NBD (Network Block
// Device) protocol, so that a volume reached by the initiator can become
// a local /dev/nbdN on a compute host (blkctl attach).
//
// It has two halves:
//
//   - Server (server.go, handshake.go, conn.go): the NBD protocol over any
//     net.Conn — the fixed newstyle handshake (NBD_OPT_GO/INFO with
//     NBD_INFO_EXPORT and NBD_INFO_BLOCK_SIZE, EXPORT_NAME, LIST, ABORT;
//     every other option NBD_REP_ERR_UNSUP) and the transmission phase
//     with simple replies (READ, WRITE with FUA, DISC, FLUSH, TRIM,
//     WRITE_ZEROES with NO_HOLE). Requests run concurrently on a fixed
//     set of workers per connection with preallocated buffers; replies go
//     out in completion order, tagged with the request's handle.
//   - Attach (attach_linux.go): the kernel side through the classic ioctl
//     interface — a socketpair, NBD_SET_* for what a handshake would have
//     negotiated, NBD_DO_IT on its own goroutine — and Detach.
//
// What it exports is a Device (device.go); NamespaceDevice adapts an
// initiator Namespace. Device errors become NBD error values in one
// function (errnoOf in errors.go).
//
// It must never know the target, a transport, or NVMe: it sees a Device
// and a net.Conn. It does not negotiate structured replies, block status,
// TLS or extended headers: the Linux nbd driver uses none of them.
package nbd

package target

import "github.com/blk-project/blk/nvme"

// This file is the contract between the transport-agnostic core (this
// package) and a transport binding (target/rdma). The core never imports
// a transport; a binding never interprets an NVMe command beyond its data
// descriptor.
//
// The life of a command, as nvmet draws it (nvmet_req_init, the
// transport's data mapping, req->execute, queue_response):
//
//  1. The binding receives a command capsule, decodes the SQE into
//     Request.Cmd, checks SGL1 against what the transport can move
//     (descriptor type, length ≤ its port's Limits.MaxTransfer, in-capsule
//     length ≤ the queue's in-capsule size) and, if that fails, completes
//     the request itself with the status from the nvme package (never
//     calling the core).
//  2. For host-to-controller data the binding first brings the data into
//     Request.Data: in place from the capsule (zero copy) or by an RDMA
//     READ into a registered buffer. For controller-to-host data it sets
//     Request.Data to a registered buffer of the SGL's length, which the
//     core fills completely (the core zero-fills whatever it does not
//     produce; buffers are reused).
//  3. The binding calls Queue.Execute(req). The core validates the command
//     against the queue's state and the namespace, runs it, and — on the
//     caller's goroutine before Execute returns, or later on another
//     goroutine — fills req.Rsp and calls Responder.Complete(req) exactly
//     once.
//  4. Complete sends controller-to-host data (RDMA WRITE of
//     req.Data[:req.Len]) when req.Rsp.Status is success and the command
//     reads, then the response capsule, and reclaims the request.
//
// Complete may come after Queue.Close for a request that was in flight
// when the connection went (a sync command on a worker, an Asynchronous
// Event Request completed with Abort SQ Deleted): the binding then only
// reclaims it. Queue.Drained tells the binding when the last one has
// come, so it can free the queue's buffers.
//
// Requests are preallocated by the binding (one per receive buffer) and
// reused; nothing in this path allocates.

// Request is one command in flight.
type Request struct {
	// Cmd is the decoded submission queue entry (binding fills).
	Cmd nvme.Command
	// Rsp is the completion; the core fills DW0/DW1/Status. The binding
	// fills SQID, CID and SQHead when it sends.
	Rsp nvme.Completion
	// Dir is the data direction of SGL1 (binding fills from the opcode).
	Dir nvme.Direction
	// Len is the data length SGL1 describes, in bytes (0: no data).
	Len uint32
	// Data is the command's data buffer, len(Data) == Len (see above).
	Data []byte

	// Group, when set, lets the core gather a plain write into the group
	// instead of committing it alone; it is then completed from
	// Group.Commit. A binding sets it only for requests it executes on the
	// goroutine that will call Commit (a core's notification goroutine,
	// committing at the end of each notification).
	Group *Group

	// Binding is the binding's per-request state (its index, keys,
	// buffers); the core never touches it.
	Binding any

	// Seq and PrevFuse pair fused commands (fused.go). The binding stamps
	// both when the capsule arrives, before any of its data moves, on the
	// goroutine that receives the queue's capsules: Seq counts the
	// queue's capsules (wrapping), PrevFuse is the FUSE field of the
	// capsule that arrived just before this one on the queue (0 for the
	// first). A binding that refuses a capsule itself, without Execute,
	// calls Queue.Refused for it.
	Seq      uint32
	PrevFuse uint8

	// core-private state
	q     *Queue
	state uint8      // reqIdle, reqExecuting, ... (stats.go)
	ns    *namespace // the namespace a sync worker or the backend runs it on
	io    IO         // the backend operation (async.go)
	// fused pairs: pair is the other half once paired (the Write half
	// drives the pair); fstep is where the pair is (fused.go).
	pair  *Request
	fstep uint8
	// hold is the namespace range lock the request holds or waits for,
	// lockNext links it on a stripe's parked list (rangelock.go).
	hold     lockHold
	lockNext *Request
	// vc compares through a Viewer (io_cmd.go's view), made once.
	vc *viewCompare
}

// Queue returns the queue the request arrived on.
func (r *Request) Queue() *Queue { return r.q }

// Responder is the binding's side of a queue.
type Responder interface {
	// Complete sends the request's data (if any) and its response. It is
	// called exactly once per Execute, from any goroutine, and must not
	// block. The core does not touch the request afterwards.
	Complete(r *Request)
	// Disconnect asks the binding to drop the queue's connection (the
	// controller was torn down: keep-alive expiry, shutdown, fatal error).
	// The binding then calls Queue.Close when the connection is gone.
	// It must not block and may be called more than once.
	Disconnect(reason error)
}

// QueueParams are what the binding knows about a queue before its
// Connect command arrives (for RDMA: from the CM private data).
type QueueParams struct {
	// QID is the queue identifier the host asked for (0 = admin).
	QID uint16
	// SQSize is the 0's based submission queue size the host announced
	// (HSQSIZE); Connect's SQSIZE must equal it.
	SQSize uint16
	// Transport is the TRTYPE reported in discovery (nvme.TrTypeRDMA...).
	Transport uint8
	// LocalAddr and LocalPort identify the port the queue arrived on
	// (discovery lists subsystems with this address).
	LocalAddr, LocalPort string
	// RemoteAddr is the host's address (host:port, or an address),
	// for logs and for the controller budget: its host part is the
	// source address whose discovery controllers are counted against
	// Config.MaxDiscoveryPerSource (budget.go). A binding must fill it
	// from the connection's peer, never from anything the host sends.
	RemoteAddr string
	// Limits are the limits of the transport port the queue arrived on;
	// nil means Config.Limits. NewQueue copies and validates them, so the
	// binding may reuse the pointer. A controller takes its limits from
	// its admin queue at Connect and keeps them; an I/O queue whose
	// limits differ from its controller's came through another port and
	// is refused at Connect.
	Limits *Limits
	// Coalescing, when not nil, applies Set Features Interrupt
	// Coalescing to the transport (aggregation threshold in completions,
	// time in 100 µs units, both as the feature encodes them).
	Coalescing func(threshold, time100us uint8) error
}

// Limits are what one transport port can do. A binding sizes them for
// each port (target/rdma's Size) and hands them over with every queue
// (QueueParams.Limits), as nvmet asks its transport per controller
// (get_mdts, get_max_queue_size): an RDMA port and a TCP port of one
// target may differ. Each controller reports its admin queue's limits to
// the host (CAP.MQES, Identify MDTS, IOCCSZ, SGLS, MAXCMD, Number of
// Queues) and enforces them on all its queues. The zero Limits means
// none (Config.Limits unset).
type Limits struct {
	// MaxTransfer is the largest data transfer of one command, in bytes
	// (a power of two times 4096; MDTS = log2(MaxTransfer/4096)).
	MaxTransfer uint32
	// InCapsule is the largest in-capsule data on I/O queues, in bytes
	// (IOCCSZ = (64 + InCapsule) / 16). 0: no in-capsule data.
	InCapsule uint32
	// MaxQueueEntries is the largest I/O queue (MQES + 1).
	MaxQueueEntries uint32
	// AdminQueueEntries is the largest admin queue (32 for Linux hosts).
	AdminQueueEntries uint32
	// MaxIOQueues is the most I/O queues one controller may have.
	MaxIOQueues uint16
	// KeyedSGL says keyed SGL data blocks are supported (RDMA).
	KeyedSGL bool
}

// Package tcp is blk's NVMe/TCP transport binding, target side: it
// accepts TCP connections (one per NVMe queue, the admin queue included),
// speaks the PDUs of shared/docs/nvmeof-wire.md §5 (codecs in nvme/tcp.go)
// and turns command capsules into target.Requests for the transport-
// agnostic core (target/request.go is the contract). It is target/rdma's
// sibling: same Config shape, Limits, Listen, Port.Close, Port.Stats, and
// the port is registered for discovery (TRTYPE TCP).
//
// # Layout
//
//	config.go  Config, defaults with their reasons, Validate, Limits
//	port.go    Port: listen, accept, placement on the least-loaded poll
//	           group, the one place QueueParams is filled, Close, Stats
//	group.go   the poll group: one per core, a goroutine (locked to its
//	           thread with LockThreads or PinCores) owning an epoll set (edge-triggered sockets) and
//	           the eventfd that wakes it (an internal/epoll.Loop), the
//	           hand-over stacks (new connections, completions,
//	           disconnects), buffer pools, the buffer FIFOs, the
//	           target.Group committed every pass
//	conn.go    a connection: the receive state machine (staging buffer,
//	           headers, data straight into data buffers), ICReq, capsules,
//	           SGL checks, R2T and H2CData, responses, the transmit ring and
//	           writev, termination and close
//	req.go     the request slots and their state enum (one transition
//	           function, every move counted)
//	pool.go    data buffer pools and the wait FIFO
//	events.go  the connection events logged through Config.Logger
//
// # The data path
//
// Each poll group's goroutine does all socket I/O of its connections:
// non-blocking readv of whole PDUs (headers into a 16 KiB staging buffer,
// data into the command's buffer: the part that arrived with its header
// is copied, the rest is read straight in), Queue.Execute on the group's
// goroutine (Request.Group is set: plain writes of one pass commit
// together), and one writev per connection per pass of every queued PDU
// (a C2HData goes out of the buffer the core filled: no copy). A socket
// that takes less waits for EPOLLOUT. Completions from other goroutines
// (sync workers) come back through a lock-free stack and one coalesced
// eventfd write. Requests are preallocated per queue at its first capsule
// (SQSIZE+1 of them; the R2T's TTAG is the slot index), data buffers per
// group; a command that finds no buffer waits in a FIFO. Steady-state
// reads and writes allocate nothing and take no lock (a test guards it).
//
// Copies in user space per I/O: reads 0; writes 1 at most (in-capsule
// data arrives with its header and is copied out of the staging buffer;
// H2CData only for the part that arrived in the same read as its header).
//
// # Protocol choices
//
// Where the specification leaves room this binding follows nvmet: a data
// digest error closes the connection (no TermReq: no FES names it); a
// host that sends more commands than SQSIZE+1 is terminated (FES 0x02,
// PDU sequence error: nvmet just drops it); an H2CTermReq is logged and
// the connection closed. ICReq: PFV ≠ 0 is FES 0x01 at PFV (as SPDK),
// HPDA ≠ 0 and refused digests FES 0x06 at the field. A fatal error sends
// a C2HTermReq after the queued PDUs, then a FIN, and the connection is
// closed when the host closes or after 2 s. A Disconnect from the core
// writes the queued responses, then closes.
//
// # Connection setup
//
// A connection has ConnectTimeout (10 s) from its accept to send its
// ICReq and its first command capsule, which makes the core's queue; the
// core's own target.Config.ConnectTimeout then bounds its Connect (a
// queue whose Connect was refused is dropped too). At most
// MaxPendingPerSource (256) connections of one source address and
// MaxPending (1024) of the port may be in that state: more are closed as
// they are accepted, with a warning naming the source, but when the port
// is full a source with fewer pending connections evicts the oldest of
// the source with the most (pending.go). A port scanner, a stalled host
// or a flood of idle connections from one address so holds at most
// MaxPendingPerSource receive buffers for at most ConnectTimeout, and
// leaves the rest of the port to others. Accept errors (out of descriptors) back off 5 ms to
// 1 s instead of spinning.
//
// # Events
//
// Config.Logger gets one record per connection event, with fixed
// messages (events.go): connection accepted, rejected, terminated,
// closed (by host or target, and why), and port error.
//
// # What this package must never do
//
//   - Interpret an NVMe command beyond its data descriptor, or answer one
//     the core should (only SGL1 errors are answered here).
//   - Run a goroutine per connection, or block a poll group on anything
//     but its epoll set; allocate or lock per command in steady state.
//   - Answer a command twice, touch a request the core holds, or free a
//     connection's requests before the core gave every one back.
//   - Trust a host: every header goes through nvme.TCPHeader.Check, every
//     length and tag is checked before it indexes anything, and no input
//     may panic or hang a poll group (a seeded random test drives it).
//   - Keep a Prometheus registry: Stats returns plain counters.
package tcp

package initiator

import "github.com/blk-project/blk/nvme"

// wire carries one queue's capsules and data: the NVMe/RDMA binding
// (rdmaWire: a QP of the controller's transport engine, rdma.go) or the
// NVMe/TCP binding (tcpWire: one TCP connection with a receiver and a
// sender goroutine, tcp.go). The queue owns the slots, their states and
// the callbacks; a wire tells it the two events every command waits for,
// in either order and from any goroutine: that it is done with the
// slot's capsule and data (queue.sent) and that the response arrived
// (queue.response). Whatever it finds wrong on the wire fails the
// association.
type wire interface {
	// place sets s.cmd.DPTR for n bytes of data in direction dir (n is
	// 0 for DirNone) and returns how many of them travel inside the
	// command capsule.
	place(s *slot, dir nvme.Direction, n int) (inline int)
	// send posts the capsule of slot s, in flight, its SQE encoded in
	// s.sqe and s.inline bytes of s.data in the capsule. It never
	// blocks. An error means the wire cannot send: the caller fails the
	// association.
	send(s *slot) error
	// sendPair posts the capsules of two slots back to back, with no
	// other capsule of the queue between them (a fused pair: its
	// halves must be adjacent in the submission queue).
	sendPair(s1, s2 *slot) error
	// close ends the connection (idempotent); the wire's goroutines and
	// handler calls end soon after.
	close()
	// release gives the slots' memory back, once the wire is closed and
	// no slot is held.
	release()
}

// Transport names (Config.Transport).
const (
	TransportRDMA = "rdma"
	TransportTCP  = "tcp"
)

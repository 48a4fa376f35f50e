package initiator

import (
	"fmt"
	"runtime"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/transport"
)

// Fixed sizes of the admin queue and of responses.
const (
	// adminDepth is the admin queue's entries: 32, Linux's NVME_AQ_DEPTH
	// (CM private data HRQSIZE 32, HSQSIZE 31; Connect SQSIZE 31). The
	// Linux target refuses more.
	adminDepth = 32
	// adminBufSize is each admin slot's data buffer: 4096 bytes, the
	// largest admin transfer the host makes (Identify, a 4 KiB window of a
	// log page; Connect data is 1024).
	adminBufSize = 4096
	// responseSize is the receive length: exactly one 16-byte completion
	// queue entry, as the Linux host posts. A longer message fails the
	// receive and with it the association.
	responseSize = nvme.CQESize
	// maxTag is the number of command identifiers a queue can name: the
	// low 12 bits of the CID are the slot (the high 4 a generation).
	maxTag = 1 << cidTagBits
)

// sizing is every size of the host's transport resources for one
// controller, computed by engineSizing.
type sizing struct {
	// Engine configures the controller's transport engine.
	Engine transport.EngineConfig
	// IOInitiator is an I/O QP's initiator (send) queue depth.
	IOInitiator uint32
	// AdminInitiator and AdminRecv are the admin QP's send queue and its
	// private receive queue.
	AdminInitiator, AdminRecv uint32
}

// engineSizing sizes the transport engine of a controller with up to
// queues I/O queues of up to ioDepth entries (the requested values; the
// controller may grant fewer and shallower, never more, so the sizes are
// upper bounds that stay valid across reconnects). queues is 0 for a
// discovery controller. This is the one place the sizes are related:
//
//   - Cores: one engine core (CQ + SRQ + receive pool, pinned) per I/O
//     queue up to the adapter's processors; more cores than queues would
//     only idle.
//   - QPsPerCore = ⌈(queues + 1) / Cores⌉: the I/O QPs plus the admin QP.
//     The engine places each QP on its least loaded core, so no core ever
//     holds more, and placement never fails.
//   - Receives. I/O QPs take their receives from their core's SRQ. An
//     iWARP SRQ that runs empty kills the connection that finds it so (no
//     receiver-not-ready retry), so each core must always have as many
//     receives posted as responses can arrive. The controller sends one
//     response per command, and a queue has at most its depth of commands
//     in flight (one per slot), so responses in flight towards a core are
//     at most QPsPerCore × ioDepth = Buffers = SRQDepth: every QP gets
//     its promised HRQSIZE = SQSIZE+1 receives. The handler reposts a
//     buffer as soon as it has decoded the response, before the slot it
//     answered is freed — so a buffer is never missing while a command
//     that could consume it is in flight. RefillThreshold is only the
//     engine's backstop. (The admin QP is counted in QPsPerCore
//     although it does not use the SRQ: at most ioDepth spare 16-byte
//     buffers.)
//   - The admin QP has a private receive queue of adminDepth receives
//     (CreateQPWithReceiveQueue), so it stays reachable — keep-alive,
//     AER — whatever the I/O queues do, with its own 16-byte buffers.
//   - BufferSize = 16: responses are one CQE (responseSize).
//   - Initiator depth. The host posts one SEND per command (capsule plus
//     in-capsule data); the controller initiates every RDMA READ and
//     WRITE. An I/O QP thus needs ioDepth send slots, the admin QP
//     adminDepth. The engine reserves InitiatorDepth CQ entries per QP
//     and counts the admin QP's private receives in them, so
//     InitiatorDepth = max(ioDepth, adminDepth + adminDepth).
//   - InitiatorSGE = 2: the capsule's SQE and its in-capsule data, which
//     live in two parts of the queue's registered region.
//
// The engine then sizes each CQ as Buffers + QPsPerCore × InitiatorDepth
// (EngineConfig.CQDepth), so it can never overrun.
func engineSizing(info transport.AdapterInfo, queues, ioDepth int) (sizing, error) {
	cpus := info.Cores
	if cpus <= 0 {
		cpus = runtime.NumCPU()
	}
	cores := max(min(queues, cpus), 1)
	qpsPerCore := (queues + 1 + cores - 1) / cores
	depth := max(ioDepth, MinQueueDepth)
	buffers := max(qpsPerCore*depth, 2)
	s := sizing{
		IOInitiator:    uint32(depth),
		AdminInitiator: adminDepth,
		AdminRecv:      adminDepth,
	}
	s.Engine = transport.EngineConfig{
		Cores:           cores,
		QPsPerCore:      uint32(qpsPerCore),
		InitiatorDepth:  uint32(max(depth, 2*adminDepth)),
		InitiatorSGE:    2,
		SRQDepth:        uint32(buffers),
		Buffers:         uint32(buffers),
		BufferSize:      responseSize,
		RefillThreshold: uint32(max(buffers/4, 1)),
		// Unpinned unless asked (Config.PinCores): see
		// transport.EngineConfig.NoPin for the measurement.
		NoPin: true,
	}
	switch {
	case info.MaxSrqDepth != 0 && uint64(buffers) > uint64(info.MaxSrqDepth):
		return s, fmt.Errorf("%w: %d responses in flight per core exceed the adapter's SRQ depth %d; lower Queues or QueueDepth",
			ErrInvalidConfig, buffers, info.MaxSrqDepth)
	case info.MaxInitiatorRequestSge != 0 && info.MaxInitiatorRequestSge < 2:
		return s, fmt.Errorf("%w: the adapter allows %d SGEs per send; a capsule with in-capsule data needs 2",
			ErrInvalidConfig, info.MaxInitiatorRequestSge)
	}
	return s, nil
}

// ioQueueDepth is the depth of the I/O queues: the requested depth,
// clamped like Linux (nvme_rdma_setup_ctrl) to CAP.MQES+1 (MQES is 0's
// based) and to MAXCMD (the host's SQSIZE at most MAXCMD−1; 0 means not
// reported). Fewer than two entries cannot be expressed (SQSIZE 0).
func ioQueueDepth(requested int, cap nvme.CAP, maxcmd uint16) (int, error) {
	d := min(requested, int(cap.MQES())+1, MaxQueueDepth)
	if maxcmd != 0 {
		d = min(d, int(maxcmd))
	}
	if d < MinQueueDepth {
		return 0, fmt.Errorf("%w: controller allows %d queue entries (MQES %d, MAXCMD %d)", ErrProtocol, d, cap.MQES(), maxcmd)
	}
	return d, nil
}

// maxTransfer is the largest transfer of one I/O command and the size of
// each I/O slot's buffer: the configured MaxTransfer, lowered to the
// controller's MDTS, to the adapter's largest message and registration,
// and to what a keyed SGL's 24-bit length holds, in whole 4 KiB pages.
func maxTransfer(configured int, id *ctrlIdentity, info transport.AdapterInfo) (int, error) {
	m := configured
	if mdts := id.mdtsBytes(); mdts != 0 {
		m = min(m, mdts)
	}
	if info.MaxTransferLength != 0 {
		m = min(m, int(info.MaxTransferLength))
	}
	m = min(m, nvme.MaxKeyedSGLLength)
	m &^= 4095
	if m < 4096 {
		return 0, fmt.Errorf("%w: largest transfer %d bytes below one 4 KiB page (MDTS %d, adapter %d)",
			ErrProtocol, m, id.MDTS, info.MaxTransferLength)
	}
	return m, nil
}

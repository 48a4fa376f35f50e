package rdma

import (
	"fmt"
	"math/bits"

	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/transport"
)

// Defaults of Config, each with its reason.
const (
	// DefaultAddr is the NVMe-oF port (4420, IANA-assigned) on loopback.
	DefaultAddr = "127.0.0.1:4420"
	// DefaultQueueEntries is the largest I/O queue a host may create
	// (CAP.MQES + 1): 128, the Linux host's default queue_size and the
	// Linux target's MQES 127. It multiplies into every per-core size.
	DefaultQueueEntries = 128
	// DefaultInCapsule is the in-capsule data on I/O queues: 4096 bytes,
	// one page (IOCCSZ 260), the Linux target's default inline size, so a
	// 4 KiB write arrives in the command's SEND with no RDMA READ.
	DefaultInCapsule = 4096
	// DefaultMaxTransfer is the largest data transfer of one command
	// (MDTS 5): 128 KiB, the size past which the soft provider's
	// bandwidth stops growing (docs/transport.md) and the SPDK default.
	DefaultMaxTransfer = 128 << 10
	// DefaultQPsPerCore is the most queues (QPs) one core serves: 16, the
	// engine's default; with 2 cores that is 32 queues, e.g. 2 hosts of 15
	// I/O queues plus their admin queues.
	DefaultQPsPerCore = 16
	// DefaultLargeBuffers is the data buffers of MaxTransfer bytes per
	// core: 64 (8 MiB per core at 128 KiB), enough for two queues of
	// depth 32 moving large blocks at once; more wait in order.
	DefaultLargeBuffers = 64
	// DefaultSmallBuffers is the 4 KiB data buffers per core: 1024 (4 MiB),
	// so 4 KiB reads at queue depth 32 on 16 queues (512) never wait.
	DefaultSmallBuffers = 1024
	// smallBufferSize is the small data buffer: one 4 KiB block, the
	// common I/O and every admin data page (Identify, logs).
	smallBufferSize = 4096
	// AdminQueueEntries is the admin queue size: 32, what the Linux host
	// asks for (NVMF_AQ_DEPTH) and what the Linux target accepts at most.
	AdminQueueEntries = 32
	// capsuleSize is the command part of a capsule (the SQE).
	capsuleSize = 64
	// sendSlotsPerEntry is the send queue entries one queue entry may
	// hold at once: 4. A command posts at most two requests (one RDMA READ
	// or WRITE of its data, one response SEND), and a signalled request
	// keeps its slot until its completion is polled (Q4). The response is
	// the last thing the target does for a command, but the host sees it,
	// reuses the queue entry and sends the next command before the
	// target's CQ goroutine has necessarily polled that SEND's completion:
	// per queue entry, one command responded-but-unpolled and one in
	// progress can hold slots together, 2 × 2. (Found by the benchmarks
	// with the target in its own process: at 2 per entry a queue kept at
	// full depth ran out of send slots within a few hundred I/Os.)
	sendSlotsPerEntry = 4
)

// Sizing is every size of a port, derived from the adapter's limits and
// the Config by one function (Size).
type Sizing struct {
	// Limits is what the core reports to hosts (MDTS, IOCCSZ, MQES, SGLS).
	Limits target.Limits
	// Engine sizes the per-core CQs, SRQs and receive buffers.
	Engine transport.EngineConfig
	// LargeBuffers and SmallBuffers are the data buffers per core, of
	// Limits.MaxTransfer and 4096 bytes; registered for local and remote
	// write (an iWARP RDMA READ's sink is written by the peer).
	LargeBuffers, SmallBuffers uint32
	// AdminBufferSize is the size of an admin queue's private receive
	// buffers (AdminQueueEntries of them per admin connection).
	AdminBufferSize uint32
	// IRD and ORD are offered at connect: the target serves no RDMA
	// reads (IRD 1, the least MPA allows) and issues as many as the
	// adapter allows (ORD, clamped by the host's IRD at accept).
	IRD, ORD uint32
}

// Size computes a port's sizes. Every term says why; the relationships
// are asserted, and a configuration the adapter cannot hold is refused,
// never clamped silently.
//
//   - MaxTransfer: a power of two ≥ 4096 (MDTS is log2(MaxTransfer/4096))
//     and at most the adapter's MaxTransferLength, because one RDMA READ or
//     WRITE moves a command's data into or out of one registered buffer
//     (iWARP reads take one sink SGE, MaxReadRequestSge = 1).
//   - Receive buffer (engine BufferSize) = 64-byte SQE + InCapsule: the
//     largest capsule a host may SEND on an I/O queue (IOCCSZ × 16).
//   - Engine InitiatorDepth = 4 × QueueEntries (sendSlotsPerEntry): per
//     queue entry one command in progress (a data transfer and a response
//     SEND) and one whose response the host has already seen but whose
//     SEND completion is not yet polled, so the QP's send queue can never
//     overflow. An admin QP takes AdminQueueEntries × 4 of it plus its
//     AdminQueueEntries private receives.
//   - Engine Buffers (SRQ receives per core) = QPsPerCore × QueueEntries:
//     a host may have SQSIZE+1 ≤ QueueEntries commands in flight per
//     queue, each holding one receive buffer until its response is posted
//     (the buffer is reposted when the response SEND is posted: it is sent
//     inline, so the buffer is free at once). So the SRQ of a core with at
//     most QPsPerCore queues can never run dry, which on iWARP would kill
//     the connection that found it empty. Admin queues use private
//     receive queues and never draw from it (a connecting admin queue
//     always has a buffer, however busy the data queues are).
//   - CQ depth: the engine's CQDepth, Buffers + QPsPerCore × InitiatorDepth.
func Size(info transport.AdapterInfo, cfg Config) (Sizing, error) {
	cfg = cfg.withDefaults()
	var s Sizing
	bad := func(format string, a ...any) (Sizing, error) {
		return Sizing{}, fmt.Errorf("rdma: sizing: "+format, a...)
	}
	mt := cfg.MaxTransfer
	if mt < 4096 || mt&(mt-1) != 0 {
		return bad("MaxTransfer %d is not a power of two ≥ 4096", mt)
	}
	if info.MaxTransferLength != 0 && mt > info.MaxTransferLength {
		return bad("MaxTransfer %d exceeds the adapter's MaxTransferLength %d", mt, info.MaxTransferLength)
	}
	if cfg.InCapsule%16 != 0 {
		return bad("InCapsule %d is not a multiple of 16 (IOCCSZ counts 16-byte units)", cfg.InCapsule)
	}
	if cfg.InCapsule > mt {
		return bad("InCapsule %d exceeds MaxTransfer %d", cfg.InCapsule, mt)
	}
	if cfg.QueueEntries < 2 || cfg.QueueEntries > 65536 {
		return bad("QueueEntries %d outside [2, 65536]", cfg.QueueEntries)
	}
	if cfg.QPsPerCore < 1 {
		return bad("QPsPerCore %d < 1", cfg.QPsPerCore)
	}
	if bits.Len32(mt/4096)-1 > 255 {
		return bad("MaxTransfer %d too large for MDTS", mt)
	}
	recvSize := capsuleSize + cfg.InCapsule
	initiatorDepth := sendSlotsPerEntry * max(cfg.QueueEntries, AdminQueueEntries+AdminQueueEntries/sendSlotsPerEntry)
	buffers := cfg.QPsPerCore * cfg.QueueEntries
	s.Engine = transport.EngineConfig{
		Cores:          cfg.Cores,
		QPsPerCore:     cfg.QPsPerCore,
		InitiatorDepth: initiatorDepth,
		InitiatorSGE:   1,
		SRQDepth:       buffers,
		Buffers:        buffers,
		BufferSize:     recvSize,
		// Every buffer is reposted when its command's response is
		// posted, so the threshold refill is only a safety net.
		RefillThreshold: max(buffers/4, 1),
		Moderation:      cfg.Moderation,
		NoPin:           !cfg.PinCores,
	}
	s.Engine = s.Engine.WithDefaults(info)
	if err := s.Engine.ValidateFor(info); err != nil {
		return Sizing{}, fmt.Errorf("rdma: sizing: %w", err)
	}
	// The admin QP's requests plus its private receives share one QP's
	// CQ reservation (CreateQPWithReceiveQueue).
	if AdminQueueEntries*sendSlotsPerEntry+AdminQueueEntries > s.Engine.InitiatorDepth {
		return bad("InitiatorDepth %d cannot hold an admin queue", s.Engine.InitiatorDepth)
	}
	s.LargeBuffers = cfg.LargeBuffers
	s.SmallBuffers = cfg.SmallBuffers
	s.AdminBufferSize = recvSize
	s.IRD = 1
	s.ORD = info.MaxOutboundReadLimit
	if s.ORD == 0 {
		s.ORD = 16
	}
	s.Limits = target.Limits{
		MaxTransfer:       mt,
		InCapsule:         cfg.InCapsule,
		MaxQueueEntries:   cfg.QueueEntries,
		AdminQueueEntries: AdminQueueEntries,
		// One controller may give every QP slot of the engine but
		// the admin queue's to I/O queues.
		MaxIOQueues: uint16(min(uint32(s.Engine.Cores)*cfg.QPsPerCore-1, 0xFFFF)),
		KeyedSGL:    true,
	}
	return s, nil
}

package rdma

import (
	"fmt"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/transport"
)

// Defaults of Config, each with its reason. Size states what they cost
// per core.
const (
	// DefaultAddr is the NVMe-oF port (4420, IANA-assigned) on loopback.
	DefaultAddr = "127.0.0.1:4420"
	// DefaultQueueEntries is the largest I/O queue a host may create
	// (CAP.MQES + 1, and MAXCMD): 256. It is the deepest queue a Linux
	// RDMA host creates (nvme-rdma clamps its sqsize to
	// NVME_RDMA_MAX_QUEUE_SIZE, 256 since Linux 6.10 and 128 before) and
	// what Linux's own RDMA target has advertised since then
	// (nvmet-rdma's get_max_queue_size); blk's initiator stops at 256 too
	// (initiator.MaxQueueDepth). The host's default queue_size, 128, fits
	// with room. 1024, nvmet's NVMET_QUEUE_SIZE and the fabrics option's
	// upper bound, applies to TCP and loop: over RDMA a host would clamp
	// it to 256 itself, and it would make every core's receive buffers
	// four times larger (65 MiB at 16 queues per core) for depth no RDMA
	// host uses. It multiplies into every per-core size (Size).
	DefaultQueueEntries = 256
	// DefaultInCapsule is the in-capsule data on I/O queues: 4096 bytes,
	// one page (IOCCSZ 260), the Linux target's default inline size, so a
	// 4 KiB write arrives in the command's SEND with no RDMA READ.
	DefaultInCapsule = 4096
	// DefaultMaxTransfer is the largest data transfer of one command:
	// 1 MiB (MDTS 8), nvmet-rdma's NVMET_RDMA_MAX_MDTS, so a Linux host
	// gets 1 MiB max_hw_sectors and merges sequential I/O into 1 MiB
	// commands, as with its own target. Size refuses it on an adapter
	// whose MaxTransferLength is smaller (the soft provider's is 16 MiB,
	// hardware's 1 GiB and more). Only commands larger than 128 KiB take
	// a buffer this big (DefaultLargeBuffers).
	DefaultMaxTransfer = 1 << 20
	// DefaultQPsPerCore is the most queues (QPs) one core serves: 16, the
	// engine's default; with 2 cores that is 32 queues, e.g. 2 hosts of 15
	// I/O queues plus their admin queues.
	DefaultQPsPerCore = 16
	// DefaultQPsPerCoreShared is DefaultQPsPerCore where a core's receive
	// buffers need not cover every queue full (FlagSRQReceiverWait): 64,
	// 128 queues on 2 cores, e.g. 14 hosts of 8 I/O queues. What a queue
	// costs then is its CQ reservation (4 × QueueEntries completions,
	// ~80 KiB in the soft provider) and its send queue, not receive
	// buffers; the CQ of 1024 + 64 × 1024 entries is 5.3 MiB per core.
	DefaultQPsPerCoreShared = 64
	// DefaultSharedReceives is a core's receive buffers where they are
	// shared without covering every queue full: 1024, the SRQ size of
	// Linux's nvmet-rdma per completion vector (srq_size). Each in-flight
	// command holds one until its response is posted, so it is the
	// commands a core has in progress at once: at the target's ~5-10 µs
	// of CPU per 4 KiB command, 5-10 ms of work queued, far more than
	// keeps a core busy. A host that sends past it is held back by the
	// transport (RNR retry, TCP flow control), not disconnected. 4.06 MiB
	// of 4160-byte buffers per core.
	DefaultSharedReceives = 1024
	// DefaultLargeBuffers is the data buffers of MaxTransfer bytes per
	// core, for commands larger than midBufferSize: 16 (16 MiB per core
	// at 1 MiB), 16 MiB in flight per core, which keeps a link of tens of
	// Gb/s busy; more wait in order.
	DefaultLargeBuffers = 16
	// DefaultMidBuffers is the data buffers of midBufferSize (128 KiB)
	// per core, for commands of 4 KiB to 128 KiB: 64 (8 MiB), enough for
	// two queues of depth 32 moving such blocks at once; the pool and the
	// count the large buffers had when MaxTransfer was 128 KiB, so raising
	// MaxTransfer took nothing from mid-sized I/O.
	DefaultMidBuffers = 64
	// DefaultSmallBuffers is the 4 KiB data buffers per core: 1024 (4 MiB),
	// so 4 KiB reads at queue depth 32 on 16 queues (512) never wait.
	DefaultSmallBuffers = 1024
	// DefaultFusedReserve is Config.FusedReserve: 8 buffers of each class
	// per core, eight pairs' seconds at once before they wait for the
	// reserve itself (which each gives back without waiting on anything
	// but the backend).
	DefaultFusedReserve = 8
	// smallBufferSize is the small data buffer: one 4 KiB block, the
	// common I/O and every admin data page (Identify, logs).
	smallBufferSize = 4096
	// midBufferSize is the mid-sized data buffer: 128 KiB, the largest
	// block most random I/O uses (and Linux's default read-ahead). Without
	// this class every command above 4 KiB would take a MaxTransfer
	// buffer, eight times what a 128 KiB command needs at 1 MiB.
	midBufferSize = 128 << 10
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
	// perReadSlots are the two more a command takes when its READ's sink
	// is registered for that READ alone (ReadSinkPerRead): the
	// fast-register before the READ and the invalidate after it.
	perReadSlots = 2
)

// ReadSink is how the sink of an RDMA READ (a host's write data) is lent
// to the host.
type ReadSink uint8

const (
	// ReadSinkLocal: the adapter needs no remote right on a read's sink
	// (InfiniBand, RoCE: transport.FlagReadSinkLocal). The data buffers
	// are registered for local write only: no host can touch them.
	ReadSinkLocal ReadSink = iota
	// ReadSinkPerRead: iWARP, where a read response is a tagged write
	// into the sink and the READ request shows the host the sink's key.
	// Each READ's sink is fast-registered for that READ alone and
	// invalidated when it completes, as Linux nvmet does on iWARP; the
	// buffers themselves are local-write only. A host that keeps the key
	// cannot write into a buffer once its command's data is in, nor into
	// another host's.
	ReadSinkPerRead
	// ReadSinkShared: iWARP without fast registration (userspace verbs on
	// siw): the data buffers are registered remotely writable and their
	// key travels in every READ request, so a host that keeps it can write
	// into any buffer of the pool, other hosts' data in flight included.
	// The port logs it when it starts.
	ReadSinkShared
)

func (r ReadSink) String() string {
	switch r {
	case ReadSinkLocal:
		return "local"
	case ReadSinkPerRead:
		return "per-read"
	}
	return "shared"
}

// Sizing is every size of a port, derived from the adapter's limits and
// the Config by one function (Size).
type Sizing struct {
	// Limits is what the core reports to hosts (MDTS, IOCCSZ, MQES, SGLS).
	Limits target.Limits
	// Engine sizes the per-core CQs, SRQs and receive buffers.
	Engine transport.EngineConfig
	// SmallBuffers, MidBuffers and LargeBuffers are the data buffers per
	// core, of 4096 bytes, MidBufferSize and Limits.MaxTransfer; each
	// class one registered region, for local and remote write (an iWARP
	// RDMA READ's sink is written by the peer). A command takes a buffer
	// of the smallest class that holds it and has one free, else of a
	// larger class, else waits. MidBuffers is 0 when MaxTransfer is not
	// larger than midBufferSize: that class would be the large one, and
	// its buffers are counted there.
	SmallBuffers, MidBuffers, LargeBuffers uint32
	// MidBufferSize is the size of the mid-sized buffers (128 KiB).
	MidBufferSize uint32
	// AdminBufferSize is the size of an admin queue's private receive
	// buffers (AdminQueueEntries of them per admin connection).
	AdminBufferSize uint32
	// ReadSink is how a READ's sink is lent to the host; SendSlots the
	// send queue entries per queue entry it implies (sendSlotsPerEntry,
	// plus perReadSlots with ReadSinkPerRead).
	ReadSink  ReadSink
	SendSlots uint32
	// IRD and ORD are offered at connect: the target serves no RDMA
	// reads (IRD 1, the least MPA allows) and issues as many as the
	// adapter allows (ORD, clamped by the host's IRD at accept).
	IRD, ORD uint32
}

// Size computes a port's sizes. Every term says why; the relationships
// are asserted, and a configuration the adapter cannot hold is refused,
// never clamped silently.
//
//   - MaxTransfer: a power of two ≥ 4096 (MDTS is log2(MaxTransfer/4096)),
//     at most the adapter's MaxTransferLength, because one RDMA READ or
//     WRITE moves a command's data into or out of one registered buffer
//     (iWARP reads take one sink SGE, MaxReadRequestSge = 1), and at most
//     8 MiB, the largest power of two a keyed SGL's 24-bit length holds.
//   - Receive buffer (engine BufferSize) = 64-byte SQE + InCapsule: the
//     largest capsule a host may SEND on an I/O queue (IOCCSZ × 16).
//     Received in two pieces (engine HeaderSize = 64) when InCapsule is a
//     whole number of pages and the adapter takes two SGEs per receive:
//     the SQE, then the in-capsule data on a page of its own, so that a
//     write's data goes to O_DIRECT I/O where it landed (no copy).
//   - Engine InitiatorDepth = 4 × QueueEntries (sendSlotsPerEntry; 6 when
//     each READ's sink is fast-registered and invalidated, ReadSinkPerRead): per
//     queue entry one command in progress (a data transfer and a response
//     SEND) and one whose response the host has already seen but whose
//     SEND completion is not yet polled, so the QP's send queue can never
//     overflow. An admin QP takes AdminQueueEntries × 4 of it plus its
//     AdminQueueEntries private receives, which the adapter's receive
//     queue depth must hold.
//   - Engine Buffers (SRQ receives per core) = QPsPerCore × QueueEntries:
//     a host may have SQSIZE+1 ≤ QueueEntries commands in flight per
//     queue, each holding one receive buffer until its response is posted
//     (the buffer is reposted when the response SEND is posted: it is sent
//     inline, so the buffer is free at once). So the SRQ of a core with at
//     most QPsPerCore queues can never run dry, which on iWARP would kill
//     the connection that found it empty. On an adapter with
//     transport.FlagSRQReceiverWait an empty SRQ only holds senders back,
//     so Buffers = min(that, SharedReceives): memory for the commands a
//     core works on at once, not for every queue full (1,000 queues of
//     256 entries would need 1 GiB of receive buffers; shared, 4 MiB per
//     core). Admin queues use private
//     receive queues and never draw from it (a connecting admin queue
//     always has a buffer, however busy the data queues are).
//   - CQ depth: the engine's CQDepth, Buffers + QPsPerCore × InitiatorDepth.
//   - Data buffers: SmallBuffers × 4 KiB + MidBuffers × 128 KiB +
//     LargeBuffers × MaxTransfer, each class one registration the adapter
//     must allow (MaxRegistrationSize).
//
// The budget of one core with the defaults (QPsPerCore 16, QueueEntries
// 256, InCapsule 4096, MaxTransfer 1 MiB), all of it allocated when the
// port starts (BufferBytesPerCore counts the registered part):
//
//	receive buffers  16 × 256 = 4096 × (64 + 4096) B     16.25 MiB
//	data buffers     1024 × 4 KiB + 64 × 128 KiB
//	                 + 16 × 1 MiB = 4 + 8 + 16 MiB        28    MiB
//	                                        registered   44.25 MiB
//	requests         4096, one per receive buffer; a wait ring of
//	                 4096 + 16 × 32 entries
//	CQ               4096 + 16 × (4 × 256) = 20480 entries (the soft
//	                 provider keeps about 80 B each: 1.6 MiB)
//	send queue       4 × 256 = 1024 entries per QP
//
// plus, per admin connection, 32 private receive buffers (130 KiB). A
// 2-core port (the tests; blkd on a small VM) registers 88.5 MiB. Every
// depth is far inside the soft provider's limits (SRQ 65536, CQ 2^18, QP
// 16384) and those of RDMA hardware; a larger QueueEntries (1024 at 16
// QPs per core needs an SRQ of 16384 and a CQ of 81920) costs 65 MiB of
// receive buffers per core.
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
	shared := info.Flags&transport.FlagSRQReceiverWait != 0
	if cfg.SharedReceives < 1 {
		return bad("SharedReceives %d < 1", cfg.SharedReceives)
	}
	if mt > nvme.MaxKeyedSGLLength {
		return bad("MaxTransfer %d exceeds what a keyed SGL's 24-bit length describes (%d)", mt, nvme.MaxKeyedSGLLength)
	}
	if info.MaxReceiveQueueDepth != 0 && AdminQueueEntries > info.MaxReceiveQueueDepth {
		return bad("an admin queue's %d private receives exceed the adapter's MaxReceiveQueueDepth %d",
			AdminQueueEntries, info.MaxReceiveQueueDepth)
	}
	recvSize := capsuleSize + cfg.InCapsule
	switch {
	case info.Flags&transport.FlagReadSinkLocal != 0:
		s.ReadSink = ReadSinkLocal
	case uint64(info.FRMRPageCount)*4096 >= uint64(mt):
		s.ReadSink = ReadSinkPerRead
	default:
		s.ReadSink = ReadSinkShared
	}
	s.SendSlots = sendSlotsPerEntry
	if s.ReadSink == ReadSinkPerRead {
		s.SendSlots += perReadSlots
	}
	slots := s.SendSlots
	initiatorDepth := slots * max(cfg.QueueEntries, AdminQueueEntries+AdminQueueEntries/slots)
	if cfg.QPsPerCore == 0 {
		cfg.QPsPerCore = DefaultQPsPerCore
		if shared {
			// As many as the adapter's CQ holds, up to the default
			// (deep queues on a small CQ: fewer queues, not a refusal
			// of a value nobody chose).
			cfg.QPsPerCore = DefaultQPsPerCoreShared
			if m := uint64(info.MaxCqDepth); m > uint64(cfg.SharedReceives) {
				cfg.QPsPerCore = uint32(min(uint64(cfg.QPsPerCore), max((m-uint64(cfg.SharedReceives))/uint64(initiatorDepth), 1)))
			}
		}
	}
	buffers := cfg.QPsPerCore * cfg.QueueEntries
	if shared {
		buffers = min(buffers, cfg.SharedReceives)
	}
	s.Engine = transport.EngineConfig{
		Cores:          cfg.Cores,
		QPsPerCore:     cfg.QPsPerCore,
		InitiatorDepth: initiatorDepth,
		InitiatorSGE:   1,
		SRQDepth:       buffers,
		Buffers:        buffers,
		BufferSize:     recvSize,
		HeaderSize:     splitHeader(cfg.InCapsule, info),
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
	if AdminQueueEntries*slots+AdminQueueEntries > s.Engine.InitiatorDepth {
		return bad("InitiatorDepth %d cannot hold an admin queue", s.Engine.InitiatorDepth)
	}
	s.SmallBuffers = cfg.SmallBuffers
	s.MidBuffers = cfg.MidBuffers
	if s.MidBuffers == 0 {
		s.MidBuffers = DefaultMidBuffers
	}
	s.MidBufferSize = midBufferSize
	s.LargeBuffers = cfg.LargeBuffers
	if mt <= midBufferSize {
		// The mid class would be the large one.
		s.LargeBuffers += s.MidBuffers
		s.MidBuffers, s.MidBufferSize = 0, 0
	}
	for _, c := range []struct {
		what   string
		n, len uint32
	}{{"small", s.SmallBuffers, smallBufferSize}, {"mid", s.MidBuffers, s.MidBufferSize}, {"large", s.LargeBuffers, mt}} {
		if info.MaxRegistrationSize != 0 && uint64(c.n)*uint64(c.len) > info.MaxRegistrationSize {
			return bad("%d %s data buffers of %d bytes exceed the adapter's MaxRegistrationSize %d",
				c.n, c.what, c.len, info.MaxRegistrationSize)
		}
	}
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

// BufferBytesPerCore is the registered memory of one engine core: its
// receive buffers (Engine.Buffers × Engine.BufferSize, and a page to
// align them when split: Engine.ReceiveBytes) and its data buffers. The
// port allocates it all at start, per core.
func (s Sizing) BufferBytesPerCore() uint64 {
	return s.Engine.ReceiveBytes() +
		uint64(s.SmallBuffers)*smallBufferSize +
		uint64(s.MidBuffers)*uint64(s.MidBufferSize) +
		uint64(s.LargeBuffers)*uint64(s.Limits.MaxTransfer)
}

// splitHeader is the engine's HeaderSize for in-capsule data of
// inCapsule bytes on an adapter reporting info: the SQE's 64 bytes when
// the data can start on a page of its own (a whole number of pages, two
// SGEs per receive), else 0 (one contiguous buffer, the data 64 bytes
// into it: copied into a data buffer before a disk engine takes it,
// alignData).
func splitHeader(inCapsule uint32, info transport.AdapterInfo) uint32 {
	if inCapsule == 0 || inCapsule%pageSize != 0 || info.MaxReceiveRequestSge < 2 {
		return 0
	}
	return capsuleSize
}

// pageSize is the alignment O_DIRECT I/O wants of a buffer.
const pageSize = 4096

package transport

import (
	"fmt"
	"runtime"
)

// Engine configuration defaults. Each says why it has its value; the
// relationships between them are checked by EngineConfig.Validate and the
// CQ depth they imply is computed in one place, EngineConfig.CQDepth.
const (
	// DefaultSRQDepth is the receive requests queued per core: 1024, the
	// SRQ size Linux's nvmet-rdma uses per completion vector (its
	// srq_size default). It bounds the messages that a core's peers can
	// have in flight towards it at once.
	DefaultSRQDepth = 1024
	// DefaultBufferSize is the bytes of one receive buffer: 4160 = a
	// 64-byte command plus one 4 KiB page of in-capsule data, the largest
	// small message the upper layers send by default (and nvmet-rdma's
	// default inline data size). It is a multiple of 64, so every buffer
	// starts on a cache line.
	DefaultBufferSize = 4096 + 64
	// DefaultInitiatorDepth is each QP's initiator queue: 256 = 128
	// messages in flight per QP (the upper layer's default queue size)
	// times the two initiator requests each may need (one RDMA data
	// transfer and one send).
	DefaultInitiatorDepth = 256
	// DefaultInitiatorSGE is the SGEs of an initiator request: 16 pages
	// of 4 KiB, a 64 KiB transfer without a fast-register.
	DefaultInitiatorSGE = 16
	// DefaultQPsPerCore bounds the QPs placed on one core: 16, so that
	// the per-core CQ of the defaults is 1024 + 16 × 256 = 5120
	// completions (160 KiB of NDK_RESULT_EX on a real adapter), well
	// under common adapters' MaxCqDepth.
	DefaultQPsPerCore = 16
	// DefaultPollBatch is the completions taken per CQ.Poll: 32, the
	// largest default moderation count, so one Poll drains one moderated
	// batch; the array of 32 Completions (~2 KiB) stays in L1.
	DefaultPollBatch = 32
	// refillDivisor sets the default SRQ refill threshold to a quarter of
	// the buffers (see EngineConfig.RefillThreshold).
	refillDivisor = 4
)

// EngineConfig sizes an Engine. Zero fields take defaults (WithDefaults);
// sizes are per core unless said otherwise.
type EngineConfig struct {
	// Cores is the number of per-core groups (CQ + SRQ + buffer pool).
	// Core i's notifications are pinned to processor i mod the adapter's
	// Cores (so more engine cores than processors share processors).
	// Default: AdapterInfo.Cores, or runtime.NumCPU() if that is 0.
	Cores int
	// QPsPerCore is the most QPs placed on one core; PlaceQP fails past
	// it. It multiplies into the CQ depth. Default DefaultQPsPerCore,
	// lowered to fit the adapter's MaxCqDepth.
	QPsPerCore uint32
	// InitiatorDepth is the largest initiator queue depth of an engine QP
	// (requests). CreateQP refuses more: the CQ is sized for it. Default
	// DefaultInitiatorDepth, capped at MaxInitiatorQueueDepth.
	InitiatorDepth uint32
	// InitiatorSGE is the SGEs per initiator request of engine QPs.
	// Default DefaultInitiatorSGE, capped at MaxInitiatorRequestSge.
	InitiatorSGE uint32
	// SRQDepth is the depth of each core's SRQ (receive requests).
	// Default DefaultSRQDepth, capped at MaxSrqDepth.
	SRQDepth uint32
	// Buffers is the number of receive buffers per core, all posted to
	// the SRQ at start. At most SRQDepth (S3: the SRQ cannot queue more).
	// Because an iWARP SRQ that runs empty kills the connection that
	// finds it so (no receiver-not-ready retry), the upper layer must
	// keep the messages its peers may send to one core's QPs at once
	// (their credits) at or below Buffers. Default SRQDepth.
	Buffers uint32
	// BufferSize is the bytes of one receive buffer (the largest message
	// a peer may send). Default DefaultBufferSize, capped at
	// MaxTransferLength.
	BufferSize uint32
	// HeaderSize, when not 0, splits every receive buffer in two: the
	// first HeaderSize bytes of a message land in a small header and the
	// rest in a payload of BufferSize − HeaderSize bytes that starts on
	// a page (receivePage), each receive posted as those two SGEs. It is
	// for a protocol whose messages are a fixed header and then data
	// that goes to O_DIRECT I/O: NVMe/RDMA's 64-byte command and its
	// in-capsule data, as Linux's nvmet-rdma posts its receives. The
	// adapter must take two SGEs per receive (MaxReceiveRequestSge), and
	// BufferSize − HeaderSize must be a whole number of pages, so every
	// payload starts on one. RecvBuf.Bytes is then the header, and
	// RecvBuf.Payload the rest. 0 (the default): one contiguous buffer.
	HeaderSize uint32
	// RefillThreshold is the SRQ NotifyThreshold: when fewer receives
	// than this are queued, the SRQ notification posts every free buffer
	// back. It is the margin that must absorb the messages arriving
	// between the threshold crossing and the refill. 1 ≤ it < Buffers.
	// Default Buffers/4.
	RefillThreshold uint32
	// PollBatch is the completions taken per CQ.Poll, the length of the
	// preallocated completion array. Default DefaultPollBatch.
	PollBatch uint32
	// Moderation configures adaptive interrupt moderation.
	Moderation ModerationConfig
	// NoPin leaves every core's notifications unpinned (Affinity -1):
	// each core keeps its own CQ, SRQ and buffers, owned by that CQ's
	// notification goroutine, but the Go scheduler decides where it runs.
	// With a Go provider, pinning locks the notification goroutine to an
	// OS thread, and every wake-up then hands the scheduler's processor to
	// that thread: measured on the 2-core VM, an NVMe 4 KiB read at queue
	// depth 1 took 127 µs with both sides pinned and 32 µs unpinned. A
	// provider whose completions come from hardware interrupts gains from
	// pinning; the soft provider does not (docs/transport.md).
	NoPin bool
}

// WithDefaults returns c with every zero field set to its default for an
// adapter reporting info. Defaults are lowered to the adapter's limits;
// explicit values are kept as given (Validate and ValidateFor judge them).
func (c EngineConfig) WithDefaults(info AdapterInfo) EngineConfig {
	capAt := func(v, limit uint32) uint32 {
		if limit != 0 && v > limit {
			return limit
		}
		return v
	}
	if c.Cores == 0 {
		c.Cores = info.Cores
		if c.Cores <= 0 {
			c.Cores = runtime.NumCPU()
		}
	}
	if c.InitiatorDepth == 0 {
		c.InitiatorDepth = capAt(DefaultInitiatorDepth, info.MaxInitiatorQueueDepth)
	}
	if c.InitiatorSGE == 0 {
		c.InitiatorSGE = capAt(DefaultInitiatorSGE, info.MaxInitiatorRequestSge)
	}
	if c.SRQDepth == 0 {
		c.SRQDepth = capAt(DefaultSRQDepth, info.MaxSrqDepth)
	}
	if c.Buffers == 0 {
		c.Buffers = c.SRQDepth
	}
	if c.BufferSize == 0 {
		c.BufferSize = capAt(DefaultBufferSize, info.MaxTransferLength)
	}
	if c.RefillThreshold == 0 {
		c.RefillThreshold = max(c.Buffers/refillDivisor, 1)
	}
	if c.PollBatch == 0 {
		c.PollBatch = DefaultPollBatch
	}
	if c.QPsPerCore == 0 {
		c.QPsPerCore = DefaultQPsPerCore
		// Fit the default into the adapter's CQ: see CQDepth.
		if info.MaxCqDepth != 0 && c.InitiatorDepth != 0 && uint64(info.MaxCqDepth) > uint64(c.Buffers) {
			fit := (uint64(info.MaxCqDepth) - uint64(c.Buffers)) / uint64(c.InitiatorDepth)
			c.QPsPerCore = uint32(min(uint64(c.QPsPerCore), max(fit, 1)))
		}
	}
	if len(c.Moderation.Profile) == 0 {
		// Keep only the default levels the CQ can take (M8).
		depth := c.CQDepth()
		var p []ModerationLevel
		for _, l := range DefaultModerationProfile() {
			if l.Off() || uint64(l.Count) <= depth {
				p = append(p, l)
			}
		}
		c.Moderation.Profile = p
	}
	c.Moderation = c.Moderation.WithDefaults()
	return c
}

// CQDepth is the depth of each core's CQ: every completion that can be on
// it at once, so that it can never overrun (C3; an overrun puts the CQ in
// error and fails every QP of the core). It is the one place the engine's
// queue sizes are related. The CQ is both the receive and the initiator CQ
// of the core's QPs, so it holds:
//
//   - receive completions: one per receive buffer posted to the SRQ. A
//     buffer is posted at most once until its completion is handled and
//     it is given back, so at most Buffers (≤ SRQDepth) receive
//     completions exist at once — the SRQ, not the QP count, bounds them
//     (per-QP receive queues are unused with an SRQ, Q1);
//   - initiator completions: each QP has at most its initiator depth of
//     requests outstanding (Q4), each completing once (successfully, with
//     an error, or flushed with ErrCancelled), and CreateQP caps that
//     depth at InitiatorDepth, so at most QPsPerCore × InitiatorDepth.
//     This reads Q4 as verbs does: a request is outstanding until its
//     completion has been polled. A provider that frees the slot when it
//     queues the completion lets a fast poster overrun any CQ whose
//     consumer is slower.
//
// Silent-success requests only lower the real count. The result is
// computed in 64 bits; Validate refuses it above MaxUint32 and ValidateFor
// above the adapter's MaxCqDepth — it is never clamped, because a CQ
// smaller than this could overrun.
func (c EngineConfig) CQDepth() uint64 {
	receives := uint64(c.Buffers)
	initiator := uint64(c.QPsPerCore) * uint64(c.InitiatorDepth)
	return receives + initiator
}

// Validate checks the relationships between the fields of a completed
// configuration (after WithDefaults). Errors wrap ErrInvalidParameter.
func (c EngineConfig) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: engine config: "+format, append([]any{ErrInvalidParameter}, a...)...)
	}
	switch {
	case c.Cores < 1:
		return bad("Cores %d < 1", c.Cores)
	case c.QPsPerCore < 1:
		return bad("QPsPerCore %d < 1", c.QPsPerCore)
	case c.InitiatorDepth < 1:
		return bad("InitiatorDepth %d < 1", c.InitiatorDepth)
	case c.InitiatorSGE < 1:
		return bad("InitiatorSGE %d < 1", c.InitiatorSGE)
	case c.SRQDepth < 1:
		return bad("SRQDepth %d < 1", c.SRQDepth)
	case c.Buffers < 2:
		// Two at least, so that 1 ≤ RefillThreshold < Buffers can hold.
		return bad("Buffers %d < 2", c.Buffers)
	case c.Buffers > c.SRQDepth:
		// S3: the SRQ queues at most SRQDepth receives; a buffer that
		// cannot be posted is memory that never receives.
		return bad("Buffers %d > SRQDepth %d", c.Buffers, c.SRQDepth)
	case c.BufferSize < 1:
		return bad("BufferSize %d < 1", c.BufferSize)
	case c.HeaderSize != 0 && (c.HeaderSize >= c.BufferSize || (c.BufferSize-c.HeaderSize)%receivePage != 0):
		return bad("HeaderSize %d leaves a payload of BufferSize %d − HeaderSize that is not a positive whole number of %d-byte pages", c.HeaderSize, c.BufferSize, receivePage)
	case c.RefillThreshold < 1 || c.RefillThreshold >= c.Buffers:
		// 0 would never refill; ≥ Buffers would fire on the first
		// receive and keep firing while any buffer is in use.
		return bad("RefillThreshold %d not in [1, Buffers %d)", c.RefillThreshold, c.Buffers)
	case c.PollBatch < 1:
		return bad("PollBatch %d < 1", c.PollBatch)
	}
	if c.ReceiveBytes() > uint64(maxInt) {
		return bad("Buffers × BufferSize = %d bytes does not fit in memory", c.ReceiveBytes())
	}
	depth := c.CQDepth()
	if depth > uint64(MaxUint32) {
		return bad("CQ depth %d (Buffers + QPsPerCore × InitiatorDepth) exceeds %d", depth, MaxUint32)
	}
	if err := c.Moderation.Validate(uint32(depth)); err != nil {
		return fmt.Errorf("engine config: %w", err)
	}
	return nil
}

const maxInt = int(^uint(0) >> 1)

// ReceiveBytes is the size of a core's receive buffer region: Buffers ×
// BufferSize, and, split (HeaderSize), one page more, so that the
// payloads can start on a page wherever the region starts.
func (c EngineConfig) ReceiveBytes() uint64 {
	n := uint64(c.Buffers) * uint64(c.BufferSize)
	if c.HeaderSize != 0 {
		n += receivePage
	}
	return n
}

// ValidateFor checks a completed configuration against an adapter's
// limits (after Validate). Errors wrap ErrInvalidParameter.
func (c EngineConfig) ValidateFor(info AdapterInfo) error {
	if err := c.Validate(); err != nil {
		return err
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: engine config: "+format, append([]any{ErrInvalidParameter}, a...)...)
	}
	switch {
	case c.SRQDepth > info.MaxSrqDepth:
		return bad("SRQDepth %d > adapter MaxSrqDepth %d (S2)", c.SRQDepth, info.MaxSrqDepth)
	case info.MaxReceiveRequestSge < 1:
		return bad("adapter MaxReceiveRequestSge is 0; receive buffers need one SGE")
	case c.HeaderSize != 0 && info.MaxReceiveRequestSge < 2:
		return bad("HeaderSize %d: a split receive needs two SGEs, adapter MaxReceiveRequestSge is %d", c.HeaderSize, info.MaxReceiveRequestSge)
	case c.InitiatorDepth > info.MaxInitiatorQueueDepth:
		return bad("InitiatorDepth %d > adapter MaxInitiatorQueueDepth %d (Q2)", c.InitiatorDepth, info.MaxInitiatorQueueDepth)
	case c.InitiatorSGE > info.MaxInitiatorRequestSge:
		return bad("InitiatorSGE %d > adapter MaxInitiatorRequestSge %d (Q2)", c.InitiatorSGE, info.MaxInitiatorRequestSge)
	case c.CQDepth() > uint64(info.MaxCqDepth):
		return bad("CQ depth %d = Buffers %d + QPsPerCore %d × InitiatorDepth %d > adapter MaxCqDepth %d (C2); lower QPsPerCore or InitiatorDepth",
			c.CQDepth(), c.Buffers, c.QPsPerCore, c.InitiatorDepth, info.MaxCqDepth)
	case info.MaxRegistrationSize != 0 && c.ReceiveBytes() > info.MaxRegistrationSize:
		return bad("receive pool %d bytes > adapter MaxRegistrationSize %d", c.ReceiveBytes(), info.MaxRegistrationSize)
	}
	return nil
}

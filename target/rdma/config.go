package rdma

import (
	"log/slog"
	"time"

	"github.com/blk-project/blk/transport"
)

// Config configures a port: one listening address of the target on one
// adapter. Zero fields take the defaults documented on the constants.
type Config struct {
	// Addr is the listen address, host:port (DefaultAddr). Port 0 picks
	// a free port (tests); Port.Addr tells which.
	Addr string
	// AdvertiseAddr is the address hosts connect to when it is not Addr:
	// a target behind NAT, or one listening on a wildcard address. It is
	// an IP address, with an optional port ("203.0.113.7",
	// "203.0.113.7:4420", "[fd00::7]:4420"); without a port the listen
	// port is advertised. The discovery log reports it as TRADDR and
	// TRSVCID. Empty: the listen address is reported, and for a wildcard
	// listen address (0.0.0.0, ::) the local address each discovery
	// connection arrived on.
	AdvertiseAddr string
	// PortID is the port's identifier in discovery log entries (1).
	PortID uint16
	// Cores is the engine's per-core groups (default: the adapter's cores).
	Cores int
	// QPsPerCore bounds the queues one core serves (DefaultQPsPerCore, or
	// DefaultQPsPerCoreShared on an adapter with FlagSRQReceiverWait).
	QPsPerCore uint32
	// SharedReceives bounds a core's receive buffers (its SRQ) on an
	// adapter with FlagSRQReceiverWait (DefaultSharedReceives); elsewhere
	// the SRQ holds every queue of the core full.
	SharedReceives uint32
	// QueueEntries is the largest I/O queue, MQES + 1 (DefaultQueueEntries).
	QueueEntries uint32
	// InCapsule is the in-capsule data size of I/O queues
	// (DefaultInCapsule; a multiple of 16). Use NoInCapsule for none.
	InCapsule uint32
	// MaxTransfer is the largest data transfer of one command
	// (DefaultMaxTransfer; a power of two ≥ 4096).
	MaxTransfer uint32
	// LargeBuffers and SmallBuffers are the data buffers per core
	// (DefaultLargeBuffers of MaxTransfer bytes, DefaultSmallBuffers of 4 KiB).
	LargeBuffers, SmallBuffers uint32
	// MidBuffers are the data buffers of 128 KiB per core, for commands
	// of 4 KiB to 128 KiB (DefaultMidBuffers; with a MaxTransfer of
	// 128 KiB or less they join the large ones).
	MidBuffers uint32
	// FusedReserve is the data buffers per core and class kept, on top
	// of the above, for the second half of a fused Compare and Write
	// whose first half waits for it (fused.go; docs/reservations.md
	// §2.2). DefaultFusedReserve.
	FusedReserve uint32
	// Moderation configures the engine's adaptive interrupt moderation.
	Moderation transport.ModerationConfig
	// PinCores pins each engine core's notifications to a processor.
	// Off by default: with the soft provider pinning made a 4 KiB read at
	// queue depth 1 four times slower (transport.EngineConfig.NoPin).
	PinCores bool
	// Logf receives connection events as text lines; nil is silent.
	Logf func(format string, args ...any)
	// Logger receives the port's events as structured records (see
	// EventConnectionAccepted and the others), one per connection, never
	// one per command; and, when Logf is nil, its other log lines as
	// warnings. Nil: no events. Give it a rate-limiting handler: a host
	// can provoke rejected connections at will.
	Logger *slog.Logger

	// syncDisk: the cores take no disk engines (no poller hook), so
	// asynchronous backends serve their I/Os inline as before: the
	// benchmarks' baseline (export_test.go).
	syncDisk bool
	// diskSpin replaces the cores' disk spin (diskSpin) when not 0;
	// negative: none (export_test.go, for the benchmarks).
	diskSpin time.Duration
}

// NoInCapsule as Config.InCapsule turns in-capsule data off (every write
// is fetched by RDMA READ).
const NoInCapsule = ^uint32(0)

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.PortID == 0 {
		c.PortID = 1
	}
	if c.SharedReceives == 0 {
		c.SharedReceives = DefaultSharedReceives
	}
	if c.QueueEntries == 0 {
		c.QueueEntries = DefaultQueueEntries
	}
	switch c.InCapsule {
	case 0:
		c.InCapsule = DefaultInCapsule
	case NoInCapsule:
		c.InCapsule = 0
	}
	if c.MaxTransfer == 0 {
		c.MaxTransfer = DefaultMaxTransfer
	}
	if c.LargeBuffers == 0 {
		c.LargeBuffers = DefaultLargeBuffers
	}
	if c.SmallBuffers == 0 {
		c.SmallBuffers = DefaultSmallBuffers
	}
	if c.FusedReserve == 0 {
		c.FusedReserve = DefaultFusedReserve
	}
	return c
}

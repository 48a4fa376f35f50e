package tcp

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// Config configures a port: one listening TCP address of the target. Zero
// fields take the defaults documented on the constants (withDefaults);
// Validate checks the relationships.
type Config struct {
	// Addr is the listen address, host:port (DefaultAddr). Port 0 picks
	// a free port (tests); Port.Addr tells which.
	Addr string
	// AdvertiseAddr is the address hosts connect to when it is not Addr:
	// a target behind NAT, or one listening on a wildcard address. An IP
	// address with an optional port ("203.0.113.7", "[fd00::7]:4420");
	// without a port the listen port is advertised. The discovery log
	// reports it as TRADDR and TRSVCID.
	AdvertiseAddr string
	// PortID is the port's identifier in discovery log entries (1).
	PortID uint16
	// Cores is the number of poll groups, each a goroutine that owns its
	// connections' sockets (default GOMAXPROCS).
	Cores int
	// PinCores pins poll group i's thread to processor i mod NumCPU
	// (which locks each group's goroutine to its OS thread, as
	// LockThreads). Off by default, as target/rdma: on a small machine
	// shared with the host a pinned group waits for its one processor
	// while another is idle.
	PinCores bool
	// LockThreads locks each poll group's goroutine to an OS thread of
	// its own (runtime.LockOSThread) without pinning it: the thread's
	// CPU time is then the group's (benchmarks read it). Off by default:
	// a locked goroutine woken from its sleep in the netpoller cannot run
	// on the thread that found it ready, which hands its processor over
	// to the group's thread (a futex wake, a futex sleep and a context
	// switch more per wake-up). A 4 KiB write at QD 1 through a
	// replicated volume wakes two groups per node it crosses; locked,
	// it took twice the CPU (repl's BenchmarkRealWrite).
	LockThreads bool
	// MaxQueueEntries is the largest I/O queue, MQES + 1
	// (DefaultMaxQueueEntries).
	MaxQueueEntries uint32
	// MaxIOQueues bounds the I/O queues of one controller
	// (DefaultMaxIOQueues).
	MaxIOQueues uint16
	// MaxTransfer is the largest data transfer of one command, MDTS
	// (DefaultMaxTransfer; a power of two times 4096).
	MaxTransfer uint32
	// InCapsule is the in-capsule data of I/O queues, IOCCSZ×16 − 64
	// (DefaultInCapsule; a multiple of 16, at most MaxTransfer). Use
	// NoInCapsule for none. The admin queue and every fabrics command
	// take nvme.TCPAdminInCapsule whatever this says.
	InCapsule uint32
	// MaxH2CData is the MAXH2CDATA of ICResp: the largest data of one
	// H2CData PDU (default MaxTransfer; at least 4096, a multiple of 4).
	MaxH2CData uint32
	// NoHeaderDigest and NoDataDigest refuse connections that ask for
	// that digest (ICReq DGST): by default both are allowed, and the
	// ICResp echoes what the host asked for.
	NoHeaderDigest, NoDataDigest bool
	// SmallBuffers and LargeBuffers are the data buffers per poll group
	// (DefaultSmallBuffers of 4 KiB, DefaultLargeBuffers of MaxTransfer).
	SmallBuffers, LargeBuffers uint32
	// CapsuleBuffers are the buffers per poll group for in-capsule data
	// (DefaultCapsuleBuffers of nvme.TCPAdminInCapsule or InCapsule bytes,
	// whichever is larger), a pool of their own (group.attachCapsule says
	// why).
	CapsuleBuffers uint32
	// FusedReserve is the buffers per poll group and pool (capsule,
	// small, large) kept, on top of the above, for the second half of a
	// fused Compare and Write whose first half waits for it (and for a
	// command that ends a first that has no second): a first holds its
	// buffer while it waits, so were every buffer held by firsts, their
	// seconds would wait for ever (docs/reservations.md §2.2).
	// DefaultFusedReserve.
	FusedReserve uint32
	// DiscoveryOnly makes the port serve the discovery subsystem only
	// (target.Port.DiscoveryOnly): the well-known discovery port, 8009,
	// where nvme discover looks when given no port. Connects to NVM
	// subsystems through it are refused and the discovery log sends
	// hosts to the target's other ports.
	DiscoveryOnly bool
	// ConnectTimeout bounds how long an accepted connection may take to
	// send its ICReq and its first command capsule
	// (DefaultConnectTimeout); from there the target core's
	// target.Config.ConnectTimeout bounds its Connect. A connection
	// that sends nothing is closed then.
	ConnectTimeout time.Duration
	// PollSpin is how long a poll group keeps looking (epoll without
	// sleeping, and the disk engines' completion rings) after its last
	// work before it sleeps (DefaultPollSpin; negative: sleep at once),
	// and up to 1 ms (diskSpin) while a backend has I/Os at the disk.
	// A sleeping group is woken through Go's netpoller and a hand-off to
	// its locked thread, tens of µs on a small VM: at queue depth 1 that
	// is most of a command's latency. Spinning spends at most PollSpin of
	// CPU per idle gap, and none while the group is busy.
	PollSpin time.Duration
	// MaxPending bounds the connections accepted and not yet connected
	// (no successful Fabrics Connect on their queue): more are closed as
	// they are accepted, unless their source holds fewer than another,
	// whose oldest is then closed instead (pending.go;
	// DefaultMaxPending).
	MaxPending int
	// MaxPendingPerSource bounds the pending connections of one source
	// address (the peer's IP), so that one peer reopening idle
	// connections cannot take all of MaxPending from the others
	// (DefaultMaxPendingPerSource; at most MaxPending).
	MaxPendingPerSource int
	// Logf receives connection events as text lines; nil is silent.
	Logf func(format string, args ...any)
	// Logger receives the connection events as records (events.go):
	// fixed messages, details as attributes. Give it a rate-limiting
	// handler: a host can provoke terminations at will.
	Logger *slog.Logger
}

// NoInCapsule as Config.InCapsule turns in-capsule data of I/O queues off
// (every write waits for an R2T).
const NoInCapsule = ^uint32(0)

// Defaults of Config, each with its reason.
const (
	// DefaultAddr listens on every address at the NVMe/TCP port 4420
	// (IANA-assigned; nvme-cli's default for connect).
	DefaultAddr = ":" + nvme.TCPPort
	// DefaultMaxQueueEntries is the largest I/O queue: 128, the Linux
	// host's default queue_size (nvme connect -Q), so a default host gets
	// the depth it asks for. Deeper queues cost only request slots
	// (~300 bytes each) and buffer waits, not memory per queue.
	DefaultMaxQueueEntries = 128
	// DefaultMaxIOQueues is the I/O queues one controller may have: 128,
	// nvmet's NVMET_NR_QUEUES. A Linux host asks for one per CPU.
	DefaultMaxIOQueues = 128
	// DefaultMaxTransfer is the largest transfer of one command: 128 KiB
	// (MDTS 5), SPDK's max_io_size and Linux's read-ahead: one large
	// buffer per command in flight.
	DefaultMaxTransfer = 128 << 10
	// DefaultInCapsule is the in-capsule data of I/O queues: 8192 bytes
	// (IOCCSZ 516), the profile of shared/docs/nvmeof-wire.md §9: a 4 KiB
	// and an 8 KiB write go with their command, no R2T round trip.
	DefaultInCapsule = 8192
	// DefaultSmallBuffers is the 4 KiB data buffers per poll group: 1024
	// (4 MiB), so 4 KiB I/O at queue depth 32 on 32 queues never waits.
	DefaultSmallBuffers = 1024
	// DefaultLargeBuffers is the MaxTransfer data buffers per poll group,
	// for commands above 4 KiB: 64 (8 MiB at 128 KiB), two queues of
	// depth 32 moving such blocks at once; more wait in order.
	DefaultLargeBuffers = 64
	// DefaultCapsuleBuffers is the in-capsule data buffers per poll
	// group: 256 (2 MiB of 8 KiB), 8 queues of depth 32 writing in the
	// capsule at once; a buffer is held only while its write executes.
	DefaultCapsuleBuffers = 256
	// DefaultFusedReserve is FusedReserve: 8 buffers of each pool per
	// poll group, eight pairs' seconds at once before they wait for the
	// reserve itself (which each gives back without waiting on anything
	// but the backend).
	DefaultFusedReserve = 8
	// DefaultConnectTimeout is ConnectTimeout: 10 s, as the core's
	// (target.DefaultConnectTimeout). A Linux host sends its ICReq and
	// Connect right after the TCP handshake; a port scanner or a stalled
	// host holds a slot no longer than this.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultPollSpin is PollSpin: 50 µs, a little more than a 4 KiB
	// O_DIRECT read on this class of disk (28 µs) plus the host's turn
	// around at queue depth 1, so a group with I/O at the disk or a host
	// that answers at once does not sleep between commands; an idle group
	// sleeps 50 µs after its last command. MaxPollSpin bounds it.
	DefaultPollSpin = 50 * time.Microsecond
	MaxPollSpin     = 10 * time.Millisecond
	// DefaultMaxPending is MaxPending: 1024 connections of the port that
	// have not connected yet. Each costs about 20 KiB (its receive
	// buffer) until its Connect, so a flood of idle connections is
	// bounded at ~20 MiB and ConnectTimeout; it is 4 × the per-source
	// share: four addresses fill it before eviction evens them out.
	DefaultMaxPending = 1024
	// DefaultMaxPendingPerSource is MaxPendingPerSource: 256. A Linux
	// host opens every I/O queue connection of a controller, ICReq
	// included, before it sends their Connects (nvme_tcp_alloc_io_queues,
	// then nvme_tcp_start_io_queues), so a controller of MaxIOQueues
	// (128) queues is 128 pending connections of one address at once;
	// 256 lets two such controllers of one host (re)connect together.
	// Past it a host's connection is reset and its reconnect retried
	// (reconnect_delay), never given up.
	DefaultMaxPendingPerSource = 256
	// AdminQueueEntries is the admin queue size: 32, what the Linux host
	// asks for (NVMF_AQ_DEPTH) and nvmet accepts at most.
	AdminQueueEntries = 32
	// smallBufferSize is the small data buffer: one 4 KiB block, the
	// common I/O and every admin data page (Identify, logs).
	smallBufferSize = 4096
)

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.PortID == 0 {
		c.PortID = 1
	}
	if c.Cores == 0 {
		c.Cores = runtime.GOMAXPROCS(0)
	}
	if c.MaxQueueEntries == 0 {
		c.MaxQueueEntries = DefaultMaxQueueEntries
	}
	if c.MaxIOQueues == 0 {
		c.MaxIOQueues = DefaultMaxIOQueues
	}
	if c.MaxTransfer == 0 {
		c.MaxTransfer = DefaultMaxTransfer
	}
	switch c.InCapsule {
	case 0:
		c.InCapsule = DefaultInCapsule
	case NoInCapsule:
		c.InCapsule = 0
	}
	if c.MaxH2CData == 0 {
		c.MaxH2CData = c.MaxTransfer
	}
	if c.SmallBuffers == 0 {
		c.SmallBuffers = DefaultSmallBuffers
	}
	if c.LargeBuffers == 0 {
		c.LargeBuffers = DefaultLargeBuffers
	}
	if c.CapsuleBuffers == 0 {
		c.CapsuleBuffers = DefaultCapsuleBuffers
	}
	if c.FusedReserve == 0 {
		c.FusedReserve = DefaultFusedReserve
	}
	if c.PollSpin == 0 {
		c.PollSpin = DefaultPollSpin
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.MaxPending == 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.MaxPendingPerSource == 0 {
		c.MaxPendingPerSource = min(DefaultMaxPendingPerSource, c.MaxPending)
	}
	return c
}

// Validate checks cfg after defaults: every problem, joined.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("tcp: config: "+format, a...)) }
	if err := target.CheckListenAddr(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("tcp: %w", err))
	}
	if c.AdvertiseAddr != "" {
		if _, _, err := target.ParseAdvertiseAddr(c.AdvertiseAddr); err != nil {
			errs = append(errs, fmt.Errorf("tcp: %w", err))
		}
	}
	if c.Cores < 1 || c.Cores > 1024 {
		bad("Cores %d outside [1, 1024]", c.Cores)
	}
	mt := c.MaxTransfer
	if mt < 4096 || mt%4096 != 0 || (mt/4096)&(mt/4096-1) != 0 {
		bad("MaxTransfer %d is not a power of two times 4096", mt)
	}
	if c.InCapsule%16 != 0 {
		bad("InCapsule %d is not a multiple of 16 (IOCCSZ counts 16-byte units)", c.InCapsule)
	}
	if c.InCapsule > mt {
		bad("InCapsule %d exceeds MaxTransfer %d", c.InCapsule, mt)
	}
	if c.MaxQueueEntries < 2 || c.MaxQueueEntries > 65536 {
		bad("MaxQueueEntries %d outside [2, 65536]", c.MaxQueueEntries)
	}
	if c.MaxH2CData < nvme.TCPMinMaxH2CData || c.MaxH2CData%4 != 0 {
		bad("MaxH2CData %d is less than %d or not a multiple of 4 (a Linux host refuses it)", c.MaxH2CData, nvme.TCPMinMaxH2CData)
	}
	if c.PollSpin > MaxPollSpin {
		bad("PollSpin %v is above %v", c.PollSpin, MaxPollSpin)
	}
	if c.ConnectTimeout < 0 {
		bad("ConnectTimeout %v is negative", c.ConnectTimeout)
	}
	if c.MaxPending < 0 {
		bad("MaxPending %d is negative", c.MaxPending)
	}
	if c.MaxPendingPerSource < 0 || c.MaxPendingPerSource > c.MaxPending {
		bad("MaxPendingPerSource %d is outside [1, MaxPending %d]", c.MaxPendingPerSource, c.MaxPending)
	}
	if c.SmallBuffers < 1 || c.LargeBuffers < 1 {
		bad("SmallBuffers %d and LargeBuffers %d must be at least 1", c.SmallBuffers, c.LargeBuffers)
	}
	return errors.Join(errs...)
}

// Limits returns the limits a target served by a port of cfg must be
// created with (target.Config.Limits), or the port's own limits once
// target.QueueParams carries them.
func Limits(cfg Config) (target.Limits, error) {
	if err := cfg.Validate(); err != nil {
		return target.Limits{}, err
	}
	cfg = cfg.withDefaults()
	return target.Limits{
		MaxTransfer:       cfg.MaxTransfer,
		InCapsule:         cfg.InCapsule,
		MaxQueueEntries:   cfg.MaxQueueEntries,
		AdminQueueEntries: AdminQueueEntries,
		MaxIOQueues:       cfg.MaxIOQueues,
	}, nil
}

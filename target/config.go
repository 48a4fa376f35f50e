package target

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/auth"
)

// Config configures a Target. The zero value of every field means its
// default (for Limits: none); WithDefaults fills them in and Validate
// checks the relationships. A Config round-trips through encoding/json unchanged
// except for Logf, Logger and Clock, which are not data.
type Config struct {
	// Limits are the limits of a queue whose binding gives none
	// (QueueParams.Limits nil). The zero Limits means none: every queue
	// must then bring its own, which is what a target serving ports of
	// different transports wants. When set, they must pass
	// Limits.Validate (MaxTransfer, MaxQueueEntries, AdminQueueEntries
	// and MaxIOQueues set).
	Limits Limits `json:"limits"`

	// Logf receives the target's log lines (controller creation and
	// teardown, refused connects, fatal controller states). Nil: silent.
	Logf func(format string, args ...any) `json:"-"`

	// Logger receives the target's events as structured records, one per
	// controller created or destroyed, refused Connect and expired
	// keep-alive (see EventControllerCreated and the others in
	// events.go), never one per command; and, when Logf is nil, the
	// other log lines as warnings. Nil: no events. The target does not
	// bound their rate: a host can provoke refused Connects at will, so
	// give it a rate-limiting handler (blkd uses internal/ratelog).
	Logger *slog.Logger `json:"-"`

	// Clock drives keep-alive timers. Nil: the wall clock.
	Clock Clock `json:"-"`

	// SyncWorkers is the number of goroutines, started by New, that run
	// the commands which may wait for a disk sync (Flush, FUA writes,
	// Write Zeroes with FUA, and the flush of a shutdown), so that
	// Queue.Execute never blocks its caller on one. Default 32: pebble
	// commits concurrent syncs as one group, so a worker per FUA write in
	// flight (up to 32, a typical I/O queue depth) lets them share one
	// WAL sync instead of queueing for one each.
	SyncWorkers int `json:"sync_workers"`

	// SyncQueue is the number of sync commands that may wait for a
	// worker. Default 1024. A command that finds it full runs on a new
	// goroutine instead (counted in Stats.SyncOverflow): Execute still
	// never blocks, and the allocation shows in the counters.
	SyncQueue int `json:"sync_queue"`

	// MaxControllers bounds the live controllers of the target,
	// discovery controllers included; a Connect beyond it gets Connect
	// Controller Busy (without DNR: the host may retry). Default 1024, or
	// the size of the CNTLID range if smaller; at most that size.
	MaxControllers int `json:"max_controllers"`

	// CNTLIDMin and CNTLIDMax are the controller IDs the target hands
	// out, both included. Default 1 and 0xFFEF, every ID. Several targets
	// that export one subsystem NQN (ANA paths of one volume) must hand
	// out disjoint ranges: a Linux host refuses a controller whose CNTLID
	// another controller of the same subsystem has already
	// (nvme_validate_cntlid, "Duplicate cntlid"). 1 ≤ CNTLIDMin ≤
	// CNTLIDMax ≤ 0xFFEF, and the range holds MaxControllers IDs.
	CNTLIDMin uint16 `json:"cntlid_min"`
	CNTLIDMax uint16 `json:"cntlid_max"`

	// MaxDiscoveryControllers bounds the live discovery controllers, a
	// share of MaxControllers: discovery is open to any host NQN, so
	// without it anyone who reaches a port could take every controller
	// and lock the allowed hosts out. I/O controllers (which only hosts
	// a subsystem allows can create) always have MaxControllers −
	// MaxDiscoveryControllers to themselves. Default MaxControllers/4
	// (256 of the default 1024), at least 1 and below MaxControllers
	// (a target of one controller shares it).
	MaxDiscoveryControllers int `json:"max_discovery_controllers"`

	// MaxDiscoveryPerSource bounds the live discovery controllers of one
	// source address (the host part of QueueParams.RemoteAddr), so one
	// peer cannot take the whole discovery budget either. Default 16: a
	// Linux host holds one per persistent discovery connection (one per
	// discovery port it watches) and one for a moment per nvme discover
	// or connect-all; 16 leaves room for several tools and referrals at
	// once, or a few hosts behind one NAT address. At most
	// MaxDiscoveryControllers.
	MaxDiscoveryPerSource int `json:"max_discovery_per_source"`

	// DiscoveryIdleTimeout is how long a discovery controller may send
	// nothing after its Connect before it is torn down, whatever its
	// KATO: a host that discovers sends its next command (Property Get
	// CAP, then enable, Identify, Get Log Page) at once — nvme discover
	// is done in milliseconds, and a persistent discovery controller
	// enables and arms an AER right away, then keeps alive within its
	// KATO. A peer that only connects holds its slot this long, not
	// DiscoveryKATO. Default 10 s, as ConnectTimeout; at least 1 s.
	DiscoveryIdleTimeout time.Duration `json:"discovery_idle_timeout"`

	// MaxNSID is the largest namespace ID (Identify Controller NN). Default
	// 1024, at most 0xFFFFFFFE.
	MaxNSID uint32 `json:"max_nsid"`

	// ErrorLogEntries is the number of entries each controller keeps in
	// its Error Information log (ELPE+1). Default 64, at most 256.
	ErrorLogEntries int `json:"error_log_entries"`

	// DiscoveryKATO is the keep-alive timeout of a discovery controller
	// whose Connect asks for none (KATO 0), as nvmet does, so that an
	// abandoned discovery association is eventually reclaimed. Default
	// 120 s.
	DiscoveryKATO time.Duration `json:"discovery_kato"`

	// FirmwareRevision is Identify Controller FR: printable ASCII, at most
	// 8 bytes. Default "blk-1".
	FirmwareRevision string `json:"firmware_revision"`

	// AuthTimeout is how long a queue that must authenticate (a host
	// with secrets, see HostKeys) may take to do it before it is ended.
	// Default 30 s: a Linux host authenticates right after its Connect;
	// ffdhe8192 takes it milliseconds.
	AuthTimeout time.Duration `json:"auth_timeout"`
	// ConnectTimeout is how long a queue may stay without a successful
	// Connect once its binding created it (NewQueue) before the target
	// asks the binding to drop its connection (Responder.Disconnect):
	// a connection that never connects, or whose Connect was refused and
	// that lingers, holds no resources for longer. Default 10 s; a Linux
	// host sends its Connect right after the transport connection is up.
	ConnectTimeout time.Duration `json:"connect_timeout"`
	// AuthHashes and AuthDHGroups are the DH-HMAC-CHAP hashes and groups
	// the target accepts, in its order of preference (nil:
	// auth.DefaultHashes, auth.DefaultDHGroups: SHA-256 first, any DH
	// group before none).
	AuthHashes   []auth.HashID  `json:"auth_hashes"`
	AuthDHGroups []auth.DHGroup `json:"auth_dhgroups"`

	// DiscoverySerial is the serial number of the discovery controller:
	// printable ASCII, at most 20 bytes. Default "blk-discovery".
	DiscoverySerial string `json:"discovery_serial"`
}

// Defaults, in the units of the fields they fill.
const (
	DefaultSyncWorkers      = 32
	DefaultSyncQueue        = 1024
	DefaultMaxControllers   = 1024
	DefaultMaxNSID          = 1024
	DefaultErrorLogEntries  = 64
	DefaultDiscoveryKATO    = 120 * time.Second
	DefaultFirmwareRevision = "blk-1"
	DefaultDiscoverySerial  = "blk-discovery"
	DefaultAuthTimeout      = 30 * time.Second
	DefaultConnectTimeout   = 10 * time.Second
	// DefaultMaxDiscoveryPerSource and DefaultDiscoveryIdleTimeout are
	// explained on the fields; MaxDiscoveryControllers defaults to
	// MaxControllers/discoveryShare.
	DefaultMaxDiscoveryPerSource = 16
	DefaultDiscoveryIdleTimeout  = 10 * time.Second
	discoveryShare               = 4
)

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.SyncWorkers == 0 {
		c.SyncWorkers = DefaultSyncWorkers
	}
	if c.SyncQueue == 0 {
		c.SyncQueue = DefaultSyncQueue
	}
	if c.CNTLIDMin == 0 {
		c.CNTLIDMin = nvme.CNTLIDMin
	}
	if c.CNTLIDMax == 0 {
		c.CNTLIDMax = nvme.CNTLIDMax
	}
	if c.MaxControllers == 0 {
		c.MaxControllers = DefaultMaxControllers
		if c.CNTLIDMax >= c.CNTLIDMin {
			c.MaxControllers = min(c.MaxControllers, int(c.CNTLIDMax-c.CNTLIDMin)+1)
		}
	}
	if c.MaxDiscoveryControllers == 0 {
		c.MaxDiscoveryControllers = max(1, c.MaxControllers/discoveryShare)
	}
	if c.MaxDiscoveryPerSource == 0 {
		c.MaxDiscoveryPerSource = min(DefaultMaxDiscoveryPerSource, c.MaxDiscoveryControllers)
	}
	if c.DiscoveryIdleTimeout == 0 {
		c.DiscoveryIdleTimeout = DefaultDiscoveryIdleTimeout
	}
	if c.MaxNSID == 0 {
		c.MaxNSID = DefaultMaxNSID
	}
	if c.ErrorLogEntries == 0 {
		c.ErrorLogEntries = DefaultErrorLogEntries
	}
	if c.DiscoveryKATO == 0 {
		c.DiscoveryKATO = DefaultDiscoveryKATO
	}
	if c.FirmwareRevision == "" {
		c.FirmwareRevision = DefaultFirmwareRevision
	}
	if c.DiscoverySerial == "" {
		c.DiscoverySerial = DefaultDiscoverySerial
	}
	if c.AuthTimeout == 0 {
		c.AuthTimeout = DefaultAuthTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	return c
}

// Validate checks c after defaults are applied. It returns every problem
// found, each wrapping ErrInvalid.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("target: config: "+format+": %w", append(args, ErrInvalid)...))
	}
	if c.Limits != (Limits{}) {
		if err := c.Limits.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.SyncWorkers < 1 {
		bad("SyncWorkers %d is below 1", c.SyncWorkers)
	}
	if c.SyncQueue < 1 {
		bad("SyncQueue %d is below 1", c.SyncQueue)
	}
	if c.CNTLIDMin < nvme.CNTLIDMin || c.CNTLIDMax > nvme.CNTLIDMax || c.CNTLIDMin > c.CNTLIDMax {
		bad("CNTLIDMin %#x and CNTLIDMax %#x are not 1 ≤ min ≤ max ≤ %#x", c.CNTLIDMin, c.CNTLIDMax, nvme.CNTLIDMax)
	} else if n := int(c.CNTLIDMax-c.CNTLIDMin) + 1; c.MaxControllers > n {
		bad("MaxControllers %d is above the %d IDs of [CNTLIDMin %#x, CNTLIDMax %#x]", c.MaxControllers, n, c.CNTLIDMin, c.CNTLIDMax)
	}
	if c.MaxControllers < 1 || c.MaxControllers > int(nvme.CNTLIDMax) {
		bad("MaxControllers %d is outside [1, %d]", c.MaxControllers, nvme.CNTLIDMax)
	}
	if c.MaxDiscoveryControllers < 1 || (c.MaxControllers > 1 && c.MaxDiscoveryControllers >= c.MaxControllers) {
		bad("MaxDiscoveryControllers %d is outside [1, MaxControllers %d): I/O controllers must keep room of their own", c.MaxDiscoveryControllers, c.MaxControllers)
	}
	if c.MaxDiscoveryPerSource < 1 || c.MaxDiscoveryPerSource > c.MaxDiscoveryControllers {
		bad("MaxDiscoveryPerSource %d is outside [1, MaxDiscoveryControllers %d]", c.MaxDiscoveryPerSource, c.MaxDiscoveryControllers)
	}
	if c.DiscoveryIdleTimeout < time.Second {
		bad("DiscoveryIdleTimeout %v is below 1s", c.DiscoveryIdleTimeout)
	}
	if c.MaxNSID > nvme.NSIDMax {
		bad("MaxNSID %#x is above %#x", c.MaxNSID, nvme.NSIDMax)
	}
	if c.ErrorLogEntries < 1 || c.ErrorLogEntries > 256 {
		bad("ErrorLogEntries %d is outside [1, 256]", c.ErrorLogEntries)
	}
	if c.DiscoveryKATO < time.Second {
		bad("DiscoveryKATO %v is below 1s", c.DiscoveryKATO)
	}
	if c.AuthTimeout < 0 {
		bad("AuthTimeout %v is negative", c.AuthTimeout)
	}
	if c.ConnectTimeout < 0 {
		bad("ConnectTimeout %v is negative", c.ConnectTimeout)
	}
	if c.AuthHashes != nil && len(c.AuthHashes) == 0 {
		bad("AuthHashes is empty")
	}
	for _, h := range c.AuthHashes {
		if h.Size() == 0 {
			bad("AuthHashes: unknown hash %v", h)
		}
	}
	if c.AuthDHGroups != nil && len(c.AuthDHGroups) == 0 {
		bad("AuthDHGroups is empty")
	}
	for _, g := range c.AuthDHGroups {
		if !g.Known() {
			bad("AuthDHGroups: unknown group %v", g)
		}
	}
	var fr [8]byte
	if err := nvme.SetASCII(fr[:], c.FirmwareRevision); err != nil {
		bad("FirmwareRevision %q: %v", c.FirmwareRevision, err)
	}
	var sn [20]byte
	if err := nvme.SetASCII(sn[:], c.DiscoverySerial); err != nil {
		bad("DiscoverySerial %q: %v", c.DiscoverySerial, err)
	}
	return errors.Join(errs...)
}

// Validate checks the limits a binding reports: MaxTransfer a power of two
// times 4096, InCapsule a multiple of 16, queue sizes within what the
// 16-bit SQSIZE and MQES fields can say.
func (l Limits) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("target: limits: "+format+": %w", append(args, ErrInvalid)...))
	}
	if l.MaxTransfer < 4096 || l.MaxTransfer%4096 != 0 || bits.OnesCount32(l.MaxTransfer/4096) != 1 {
		bad("MaxTransfer %d is not a power of two times 4096", l.MaxTransfer)
	}
	if l.InCapsule%16 != 0 || l.InCapsule > 1<<24 {
		bad("InCapsule %d is not a multiple of 16 up to 16 MiB", l.InCapsule)
	}
	if l.MaxQueueEntries < 2 || l.MaxQueueEntries > 65536 {
		bad("MaxQueueEntries %d is outside [2, 65536]", l.MaxQueueEntries)
	}
	if l.AdminQueueEntries < 2 || l.AdminQueueEntries > 4096 {
		bad("AdminQueueEntries %d is outside [2, 4096]", l.AdminQueueEntries)
	}
	if l.MaxIOQueues < 1 || l.MaxIOQueues == 0xFFFF {
		bad("MaxIOQueues %d is outside [1, 65534]", l.MaxIOQueues)
	}
	return errors.Join(errs...)
}

// MDTS returns Identify Controller MDTS for MaxTransfer: log2 of the
// largest transfer in 4 KiB units.
func (l Limits) MDTS() uint8 {
	return uint8(bits.TrailingZeros32(l.MaxTransfer / 4096))
}

// IOCCSZ returns Identify Controller IOCCSZ: the I/O command capsule size
// (64-byte SQE plus in-capsule data) in 16-byte units.
func (l Limits) IOCCSZ() uint32 { return (nvme.SQESize + l.InCapsule) / 16 }

// SGLS returns Identify Controller SGLS: SGLs supported (always), keyed
// data blocks if the transport has them, offset addressing (in-capsule
// data) if it takes in-capsule data.
func (l Limits) SGLS() uint32 {
	s := nvme.SGLSSupported
	if l.KeyedSGL {
		s |= nvme.SGLSKeyed
	}
	if l.InCapsule > 0 {
		s |= nvme.SGLSOffset
	}
	return s
}

// CheckQueue checks a queue a host asks for (for RDMA, from the CM private
// data: QID and HSQSIZE, 0's based) against the limits: the binding can
// refuse it before accepting the connection (CM reject "invalid QID" or
// "invalid HSQSIZE"). The Connect command is checked again by the core.
func (l Limits) CheckQueue(qid, sqsize uint16) error {
	if qid > l.MaxIOQueues {
		return fmt.Errorf("target: QID %d above the %d I/O queues: %w", qid, l.MaxIOQueues, ErrInvalid)
	}
	max := l.MaxQueueEntries
	if qid == 0 {
		max = l.AdminQueueEntries
	}
	if sqsize == 0 || uint32(sqsize)+1 > max {
		return fmt.Errorf("target: SQSIZE %d (0's based) outside [1, %d] for QID %d: %w", sqsize, max-1, qid, ErrInvalid)
	}
	return nil
}

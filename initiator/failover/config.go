package failover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/blk-project/blk/initiator"
)

// Endpoint is where a volume is served: what Config.Connect needs, and
// comparable, so that the Device can tell whether the volume moved.
type Endpoint struct {
	// Transport names the NVMe-oF transport ("tcp", "rdma").
	Transport string
	// Addr is the port's "host:port".
	Addr string
	// SubNQN is the subsystem, NSID the namespace in it.
	SubNQN string
	NSID   uint32
}

func (e Endpoint) String() string {
	return fmt.Sprintf("%s namespace %d at %s (%s)", e.SubNQN, e.NSID, e.Addr, e.Transport)
}

// Path is one connection to the volume: its namespace on a controller
// connected to Endpoint.
type Path struct {
	Endpoint  Endpoint
	Namespace *initiator.Namespace
	// Close releases the path: the controller and whatever Connect opened
	// for it (an RDMA adapter). Nil: the namespace's controller is closed.
	Close func()
}

// Defaults of Config, each with its reason.
const (
	// DefaultHoldTimeout bounds how long an I/O is held without a usable
	// path before it fails: 30 s, the Linux host's io_timeout, and well
	// under the NBD driver's own request timeout (120 s, nbd.Attach), so
	// the client sees our clear error rather than the kernel's abort. A
	// failover takes ≤ 10 s (docs/replication.md §4).
	DefaultHoldTimeout = 30 * time.Second
	// DefaultRetryDelay is the first pause before a held I/O is retried
	// on the same path, and between two resolves of the follower: 100 ms,
	// about the time a new primary takes to turn optimized after the
	// registry names it. It doubles per attempt up to DefaultMaxRetryDelay.
	DefaultRetryDelay = 100 * time.Millisecond
	// DefaultMaxRetryDelay caps that backoff at 1 s: an I/O resumes at
	// most about a second after its path serves again, and a volume with
	// no path costs the API one resolve a second.
	DefaultMaxRetryDelay = time.Second
	// DefaultAttemptTimeout bounds one Resolve and one Connect: 10 s, the
	// initiator's connect timeout.
	DefaultAttemptTimeout = 10 * time.Second
)

// Config configures a Device. Resolve and Connect are required; zero
// durations take the defaults above.
type Config struct {
	// Resolve says where the volume is served now (blkctl: the API's
	// primary node). It is called by the follower only, one call at a
	// time, with a context bounded by AttemptTimeout and cancelled by
	// Close.
	Resolve func(ctx context.Context) (Endpoint, error)
	// Connect connects to ep as the first path was (same host NQN,
	// secrets, transport settings). Called like Resolve.
	Connect func(ctx context.Context, ep Endpoint) (Path, error)
	// HoldTimeout bounds how long an I/O waits for a usable path,
	// counted from when it (or, for an I/O waiting inside the initiator,
	// its path's controller) first failed. Default 30 s.
	HoldTimeout time.Duration
	// RetryDelay and MaxRetryDelay bound the backoff of retries on one
	// path and of resolves. Defaults 100 ms and 1 s.
	RetryDelay, MaxRetryDelay time.Duration
	// AttemptTimeout bounds one Resolve or Connect. Default 10 s.
	AttemptTimeout time.Duration
	// Logf receives one line per failover decision (path failed,
	// resolved, connected, switched). Default: discard.
	Logf func(format string, args ...any)
}

// ErrInvalidConfig: a Config field or relationship is invalid.
var ErrInvalidConfig = errors.New("failover: invalid configuration")

func (c Config) withDefaults() Config {
	if c.HoldTimeout == 0 {
		c.HoldTimeout = DefaultHoldTimeout
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.MaxRetryDelay == 0 {
		c.MaxRetryDelay = max(DefaultMaxRetryDelay, c.RetryDelay)
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = DefaultAttemptTimeout
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}

// Validate checks the fields (after defaults) and their relationships.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Resolve == nil || c.Connect == nil:
		return fmt.Errorf("%w: Resolve and Connect are required", ErrInvalidConfig)
	case c.HoldTimeout < 0 || c.RetryDelay < 0 || c.AttemptTimeout < 0:
		return fmt.Errorf("%w: negative duration (HoldTimeout %v, RetryDelay %v, AttemptTimeout %v)",
			ErrInvalidConfig, c.HoldTimeout, c.RetryDelay, c.AttemptTimeout)
	case c.MaxRetryDelay < c.RetryDelay:
		return fmt.Errorf("%w: MaxRetryDelay %v below RetryDelay %v", ErrInvalidConfig, c.MaxRetryDelay, c.RetryDelay)
	}
	return nil
}

package nbd

import (
	"fmt"
	"time"
)

// Config configures a Server. The zero value is valid: every field has a
// documented default.
type Config struct {
	// ExportName is the name clients ask for; the empty name (the
	// client's default export) is always accepted too. Default "".
	ExportName string
	// Description is sent as NBD_INFO_DESCRIPTION when asked. Default "".
	Description string
	// ReadOnly exports the device read-only (NBD_FLAG_READ_ONLY; writes,
	// trims and write-zeroes fail with EPERM). Default false.
	ReadOnly bool
	// Workers is the number of requests one connection executes at once
	// (each with its own preallocated buffer). Default 16: enough to keep
	// the initiator's I/O queues busy from one connection (the blocking
	// Namespace calls each put up to 32 commands in flight); the kernel
	// queues up to 128 requests per connection and waits for the rest.
	Workers int
	// WorkerBuffer is each worker's preallocated data buffer in bytes.
	// Default 1280 KiB: the largest request the Linux nbd driver sends by
	// default (max_sectors_kb defaults to BLK_DEF_MAX_SECTORS, 2560
	// sectors). Requests above it (up to MaxRequest) share one larger
	// buffer per connection, allocated on first use and kept.
	WorkerBuffer int
	// MaxRequest is the largest read or write accepted, in bytes (larger
	// ones fail with EINVAL; it is advertised as the maximum block size).
	// Default 32 MiB: the Linux nbd driver's max_hw_sectors (65536
	// sectors), which max_sectors_kb may be raised to. It does not bound
	// TRIM or WRITE_ZEROES, which carry no data.
	MaxRequest int
	// HandshakeTimeout bounds the whole handshake. Default 10 s.
	HandshakeTimeout time.Duration
	// Logf, if set, receives one line per connection error.
	Logf func(format string, args ...any)
}

const (
	defaultWorkers          = 16
	defaultWorkerBuffer     = 1280 << 10
	defaultMaxRequest       = 32 << 20
	defaultHandshakeTimeout = 10 * time.Second
	// maxWorkers bounds Workers: the kernel's per-connection queue depth
	// (nbd tag_set.queue_depth, 128); more could never all be busy.
	maxWorkers = 128
	// maxRequestLimit bounds MaxRequest: the length field is 32 bits.
	maxRequestLimit = 1 << 31
	// maxOptionData bounds the data of one option we parse: a name of at
	// most 4096 bytes (the spec's longest string), its 4-byte length, and
	// up to 32 two-byte info requests, with room to spare.
	maxOptionData = 8 << 10
	// readBufferSize is the connection's read buffer: many 28-byte request
	// headers per read system call.
	readBufferSize = 64 << 10
)

func (c Config) withDefaults() Config {
	if c.Workers == 0 {
		c.Workers = defaultWorkers
	}
	if c.MaxRequest == 0 {
		c.MaxRequest = defaultMaxRequest
	}
	if c.WorkerBuffer == 0 {
		c.WorkerBuffer = min(defaultWorkerBuffer, c.MaxRequest)
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = defaultHandshakeTimeout
	}
	return c
}

// Validate checks the fields (after defaults) and their relationships.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Workers < 1 || c.Workers > maxWorkers:
		return fmt.Errorf("%w: Workers %d not in [1, %d]", ErrInvalidConfig, c.Workers, maxWorkers)
	case c.MaxRequest < 4096 || c.MaxRequest > maxRequestLimit:
		return fmt.Errorf("%w: MaxRequest %d not in [4096, %d]", ErrInvalidConfig, c.MaxRequest, maxRequestLimit)
	case c.WorkerBuffer < 4096 || c.WorkerBuffer > c.MaxRequest:
		return fmt.Errorf("%w: WorkerBuffer %d not in [4096, MaxRequest %d]", ErrInvalidConfig, c.WorkerBuffer, c.MaxRequest)
	case c.HandshakeTimeout < 0:
		return fmt.Errorf("%w: HandshakeTimeout %v", ErrInvalidConfig, c.HandshakeTimeout)
	case len(c.ExportName) > 4096 || len(c.Description) > 4096:
		return fmt.Errorf("%w: ExportName or Description longer than 4096 bytes", ErrInvalidConfig)
	}
	return nil
}

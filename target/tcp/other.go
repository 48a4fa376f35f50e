//go:build !linux

package tcp

import (
	"errors"
	"net"

	"github.com/blk-project/blk/target"
)

// Port is the NVMe/TCP binding; it needs Linux (epoll, eventfd, readv).
type Port struct{}

// Stats are the port's counters (see the Linux build).
type Stats struct{}

var errNotLinux = errors.New("tcp: the NVMe/TCP binding needs Linux (epoll poll groups)")

// Listen fails outside Linux.
func Listen(*target.Target, Config) (*Port, error) { return nil, errNotLinux }

// Addr is nil outside Linux.
func (*Port) Addr() net.Addr { return nil }

// Close does nothing outside Linux.
func (*Port) Close() error { return nil }

// Stats is empty outside Linux.
func (*Port) Stats() Stats { return Stats{} }

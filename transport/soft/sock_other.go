//go:build !linux

package soft

import (
	"net"

	"github.com/blk-project/blk/transport/soft/wire"
)

func tcpMSS(c *net.TCPConn) int { return wire.FPDULen(wire.MaxULPDU) }

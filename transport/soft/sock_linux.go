//go:build linux

package soft

import (
	"net"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/transport/soft/wire"
)

// tcpMSS sizes FPDUs to the connection: one FPDU per TCP segment, as RFC
// 5044 recommends, at most a full 16-bit ULPDU.
func tcpMSS(c *net.TCPConn) int {
	mss := 0
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			mss, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG)
		})
	}
	return clampFPDU(mss)
}

func clampFPDU(mss int) int {
	if mss < 536 {
		mss = 536
	}
	return min(mss, wire.FPDULen(wire.MaxULPDU))
}

//go:build !linux

package peercred

import "net"

const supported = false

func lookup(local, remote *net.TCPAddr) (uint32, error) { return 0, ErrUnsupported }

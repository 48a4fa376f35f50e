package peercred

import (
	"errors"
	"fmt"
	"net"
	"os/user"
	"strconv"
)

// ErrUnsupported: this system has no way to tell a peer's uid.
var ErrUnsupported = errors.New("peercred: peer credentials are not available on this system")

// ErrNotFound: no socket of this machine is the connection's other end
// (the peer is remote, or gone).
var ErrNotFound = errors.New("peercred: the peer's socket was not found on this machine")

// UID returns the uid of the user owning the socket at the far end of
// the TCP connection c (local and remote addresses as c reports them).
func UID(c net.Conn) (uint32, error) {
	l, ok1 := c.LocalAddr().(*net.TCPAddr)
	r, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("peercred: %T is not a TCP connection", c)
	}
	return lookup(l, r)
}

// Name is "uid N (login)" for logs and errors, or "uid N" when the user
// database does not know N.
func Name(uid uint32) string {
	s := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(s); err == nil && u.Username != "" {
		return "uid " + s + " (" + u.Username + ")"
	}
	return "uid " + s
}

// Supported says whether UID can work on this system.
func Supported() bool { return supported }

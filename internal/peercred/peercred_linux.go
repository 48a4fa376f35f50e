package peercred

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
)

const supported = true

// The tables the kernel prints TCP sockets in (one line each:
// "sl local_address rem_address st ... uid timeout inode").
var (
	tcp4Table = "/proc/self/net/tcp"
	tcp6Table = "/proc/self/net/tcp6"
)

// stateTimeWait is TCP_TIME_WAIT in the tables' st column: such sockets
// are printed with uid 0 whoever owned them.
const stateTimeWait = "06"

// lookup finds the socket whose local address is the connection's remote
// end and whose remote address is the connection's local end.
func lookup(local, remote *net.TCPAddr) (uint32, error) {
	// An IPv4 peer may sit in the tcp table (an AF_INET socket) or in
	// tcp6 as a v4-mapped address (an AF_INET6 socket).
	if r4, l4 := remote.IP.To4(), local.IP.To4(); r4 != nil && l4 != nil {
		if uid, err := scan(tcp4Table, addr4(r4, remote.Port), addr4(l4, local.Port)); err != ErrNotFound {
			return uid, err
		}
		return scan(tcp6Table, addr6(net.IP(r4).To16(), remote.Port), addr6(net.IP(l4).To16(), local.Port))
	}
	return scan(tcp6Table, addr6(remote.IP.To16(), remote.Port), addr6(local.IP.To16(), local.Port))
}

// addr4 formats an IPv4 address and port as the table prints them: the
// address's 32 bits as the kernel holds them (network order bytes read
// in the host's order), then the port in hex.
func addr4(ip net.IP, port int) string {
	return fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(ip), port)
}

// addr6 likewise for IPv6: four 32-bit words, each in the host's order.
func addr6(ip net.IP, port int) string {
	if ip == nil {
		return ""
	}
	return fmt.Sprintf("%08X%08X%08X%08X:%04X",
		binary.NativeEndian.Uint32(ip[0:4]), binary.NativeEndian.Uint32(ip[4:8]),
		binary.NativeEndian.Uint32(ip[8:12]), binary.NativeEndian.Uint32(ip[12:16]), port)
}

func scan(table, local, remote string) (uint32, error) {
	f, err := os.Open(table)
	if err != nil {
		return 0, fmt.Errorf("peercred: %w", err)
	}
	defer f.Close()
	return parse(f, local, remote)
}

// parse reads a table and returns the uid of the line with these local
// and remote addresses.
func parse(r io.Reader, local, remote string) (uint32, error) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 512), 4096)
	lb, rb := []byte(local), []byte(remote)
	first := true
	for s.Scan() {
		if first { // the column titles
			first = false
			continue
		}
		f := bytes.Fields(s.Bytes())
		if len(f) < 8 || !bytes.Equal(f[1], lb) || !bytes.Equal(f[2], rb) {
			continue
		}
		if string(f[3]) == stateTimeWait {
			return 0, fmt.Errorf("%w (it is in TIME_WAIT: no owner)", ErrNotFound)
		}
		uid, err := strconv.ParseUint(string(f[7]), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("peercred: uid %q: %w", f[7], err)
		}
		return uint32(uid), nil
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("peercred: %w", err)
	}
	return 0, ErrNotFound
}

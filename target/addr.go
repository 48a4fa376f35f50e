package target

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/blk-project/blk/nvme"
)

// Addresses as every transport binding takes them: a listen address, the
// address a port advertises, and what the discovery log reports of them.
// target/tcp, target/rdma and blkd share these so that both transports
// accept, refuse and report the same addresses.
//
// The errors name no package: each binding prefixes its own ("tcp: ",
// "rdma: "), so that an operator reads which port refused its
// configuration, and blkd shows them under its own flag names.

// SplitHostPort splits a host:port address, such as a listener's or a
// connection's local address (net.Addr.String), into its host (IPv6
// without brackets) and its port. An address that is not host:port is
// all host, with no port: the discovery log then reports it as it is.
func SplitHostPort(addr string) (host, port string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, ""
	}
	return host, port
}

// AdrFam is the discovery log's ADRFAM for host: IPv6 for an IPv6
// address, IPv4 for an IPv4 address (IPv4-mapped ones included) and for
// anything that is no IP address.
func AdrFam(host string) uint8 {
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return nvme.AdrFamIPv6
	}
	return nvme.AdrFamIPv4
}

// ipFamily returns the address family of addr if it is an IP address and
// def is an IP family; def otherwise (a port of another family keeps it).
func ipFamily(addr string, def uint8) uint8 {
	if net.ParseIP(addr) == nil || (def != nvme.AdrFamIPv4 && def != nvme.AdrFamIPv6) {
		return def
	}
	return AdrFam(addr)
}

// IsWildcardHost reports whether the host part of a listen address
// (host:port) is empty or an "any" address (0.0.0.0, ::): such a port
// listens on every local address and has none of its own to advertise.
// An address that is not host:port is not a wildcard.
func IsWildcardHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && wildcardHost(host)
}

// wildcardHost reports whether host (an IPv6 address with or without
// brackets) is empty or an "any" address, however it is spelled.
func wildcardHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(trimBrackets(host))
	return ip != nil && ip.IsUnspecified()
}

// CheckListenAddr checks a listen address: host:port with a port 0-65535
// (0 picks a free port). The host may be empty (every local address), an
// IP address or a name; listening tells whether it is one of this
// machine's.
func CheckListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("listen address %q: port is not a number 0-65535", addr)
	}
	return nil
}

// ParseAdvertiseAddr checks an advertised address (the bindings'
// Config.AdvertiseAddr, blkd's --advertise-addr): an IP address other
// than an "any" address, with an optional port 1-65535. It returns the
// host (without brackets, in its canonical form) and the port ("" if
// none was given: the port advertises its listen port). A name is
// refused: the discovery log's TRADDR is an address of the family ADRFAM
// names, and hosts connect to it as it stands.
func ParseAdvertiseAddr(s string) (host, port string, err error) {
	host = s
	if ip := net.ParseIP(trimBrackets(s)); ip == nil {
		if host, port, err = net.SplitHostPort(s); err != nil {
			return "", "", fmt.Errorf("advertised address %q is not an IP address with an optional port (for example 203.0.113.7 or 203.0.113.7:4420)", s)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return "", "", fmt.Errorf("advertised address %q: port %q is not a number 1-65535", s, port)
		}
	}
	host = trimBrackets(host)
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return "", "", fmt.Errorf("advertised address %q: %q is not an IP address (hosts connect to an address, not a name)", s, host)
	case ip.IsUnspecified():
		return "", "", fmt.Errorf("advertised address %q is an \"any\" address, which no host can connect to: give the address hosts use", s)
	}
	return ip.String(), port, nil
}

// trimBrackets strips the brackets of an IPv6 address written as in a
// URL or a host:port ("[2001:db8::1]").
func trimBrackets(host string) string {
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}

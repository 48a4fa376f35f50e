package meta

import (
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// checkedStreamLayer is raft over plain TCP whose listener hands raft only
// the connections Config.AcceptPeer lets in: a node that serves raft on
// loopback without TLS lets only its own user's processes (the other
// nodes of a local cluster) append, vote or install a snapshot (blkd
// checks the peer socket's owner, package peercred). A refused
// connection is closed before raft reads a byte and reported to refused.
type checkedStreamLayer struct {
	ln        net.Listener
	advertise net.Addr
	accept    func(net.Conn) error
	refused   func(remote net.Addr, err error)
}

func newCheckedStreamLayer(bind string, advertise net.Addr, accept func(net.Conn) error, refused func(net.Addr, error)) (raft.StreamLayer, error) {
	ln, advertise, err := listenRaft(bind, advertise)
	if err != nil {
		return nil, err
	}
	if refused == nil {
		refused = func(net.Addr, error) {}
	}
	return &checkedStreamLayer{ln: ln, advertise: advertise, accept: accept, refused: refused}, nil
}

// listenRaft listens on bind and returns the address peers are to dial:
// advertise, or the listener's own, which must then name a host.
func listenRaft(bind string, advertise net.Addr) (net.Listener, net.Addr, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, nil, err
	}
	if advertise == nil {
		advertise = ln.Addr()
	}
	if ta, ok := advertise.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		ln.Close()
		return nil, nil, fmt.Errorf("meta: raft: %v is not an address peers can dial: set AdvertiseAddr", advertise)
	}
	return ln, advertise, nil
}

// Accept returns the next connection the check lets in. The check is
// local and quick (it reads no byte from the peer), so it runs inline.
func (l *checkedStreamLayer) Accept() (net.Conn, error) {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return nil, err
		}
		if err := l.accept(c); err != nil {
			c.Close()
			l.refused(c.RemoteAddr(), err)
			continue
		}
		return c, nil
	}
}

func (l *checkedStreamLayer) Close() error   { return l.ln.Close() }
func (l *checkedStreamLayer) Addr() net.Addr { return l.advertise }

func (l *checkedStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}

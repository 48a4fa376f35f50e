package meta

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Raft over mutual TLS: a raft.StreamLayer whose listener and dialer both
// run TLS 1.3 with certificates from the cluster CA, so a peer without a
// certificate the CA signed for a node cannot append, vote or install a
// snapshot: its connection ends in the handshake, before raft reads a
// byte. Which certificates count (the CA, the node role) is the caller's
// tls.Config: package pki builds it (VerifyPeerCertificate checks the
// role; ClientAuth is RequireAndVerifyClientCert).

// Handshakes run on goroutines of their own, at most maxHandshakes at
// once: a peer that connects and sends nothing holds one slot for
// handshakeTimeout, never the listener (a serial handshake would let one
// silent connection stop every peer's for that long).
const (
	maxHandshakes    = 64
	handshakeTimeout = 10 * time.Second
)

// tlsStreamLayer implements raft.StreamLayer on a TLS listener.
type tlsStreamLayer struct {
	ln        net.Listener // the TLS listener
	advertise net.Addr
	client    *tls.Config
	refused   func(remote net.Addr, err error)

	conns chan net.Conn // handshaken connections for Accept
	slots chan struct{} // handshakes in progress
	done  chan struct{} // closed by Close
	once  sync.Once
	mu    sync.Mutex
	err   error // the listener's, once it fails (guarded by mu)
}

// NewTLSStreamLayer listens on bind with server and dials peers with
// client. server must require and verify client certificates; client
// must verify the server's. advertise (optional) is the address peers
// dial. refused (optional) is told of every connection whose handshake
// failed (no certificate, another CA's, an expired one, a wrong role).
func NewTLSStreamLayer(bind string, advertise net.Addr, server, client *tls.Config, refused func(remote net.Addr, err error)) (raft.StreamLayer, error) {
	if server == nil || client == nil {
		return nil, errors.New("meta: raft TLS: server and client configurations are required")
	}
	if server.ClientAuth != tls.RequireAndVerifyClientCert {
		return nil, errors.New("meta: raft TLS: the server configuration must require and verify client certificates")
	}
	inner, advertise, err := listenRaft(bind, advertise)
	if err != nil {
		return nil, err
	}
	if refused == nil {
		refused = func(net.Addr, error) {}
	}
	l := &tlsStreamLayer{ln: tls.NewListener(inner, server), advertise: advertise, client: client, refused: refused,
		conns: make(chan net.Conn), slots: make(chan struct{}, maxHandshakes), done: make(chan struct{})}
	go l.acceptLoop()
	return l, nil
}

// acceptLoop accepts connections and hands each to a handshake goroutine.
func (l *tlsStreamLayer) acceptLoop() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			l.Close()
			return
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			c.Close()
			return
		}
		go l.handshake(c.(*tls.Conn))
	}
}

// handshake completes a connection's TLS handshake and passes it to
// Accept: a peer that fails it is dropped here and never reaches raft.
func (l *tlsStreamLayer) handshake(tc *tls.Conn) {
	defer func() { <-l.slots }()
	_ = tc.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := tc.Handshake(); err != nil {
		tc.Close()
		l.refused(tc.RemoteAddr(), err)
		return
	}
	_ = tc.SetDeadline(time.Time{})
	select {
	case l.conns <- tc:
	case <-l.done:
		tc.Close()
	}
}

// Accept returns a connection whose TLS handshake has completed.
func (l *tlsStreamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

func (l *tlsStreamLayer) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
	})
	return err
}

func (l *tlsStreamLayer) Addr() net.Addr { return l.advertise }

// Dial connects to a peer and completes the handshake (the peer's
// certificate verified by the client configuration).
func (l *tlsStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: l.client}
	c, err := d.Dial("tcp", string(address))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// PeerCertificate returns the verified leaf certificate of a TLS
// connection raft handed out (for logging which node it is).
func PeerCertificate(c net.Conn) (*x509.Certificate, bool) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, false
	}
	st := tc.ConnectionState()
	if len(st.PeerCertificates) == 0 {
		return nil, false
	}
	return st.PeerCertificates[0], true
}

package meta

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
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

// tlsStreamLayer implements raft.StreamLayer on a TLS listener.
type tlsStreamLayer struct {
	ln        net.Listener // the TLS listener
	advertise net.Addr
	client    *tls.Config
}

// NewTLSStreamLayer listens on bind with server and dials peers with
// client. server must require and verify client certificates; client
// must verify the server's. advertise (optional) is the address peers
// dial.
func NewTLSStreamLayer(bind string, advertise net.Addr, server, client *tls.Config) (raft.StreamLayer, error) {
	if server == nil || client == nil {
		return nil, errors.New("meta: raft TLS: server and client configurations are required")
	}
	if server.ClientAuth != tls.RequireAndVerifyClientCert {
		return nil, errors.New("meta: raft TLS: the server configuration must require and verify client certificates")
	}
	inner, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	if advertise == nil {
		advertise = inner.Addr()
	}
	if ta, ok := advertise.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		inner.Close()
		return nil, fmt.Errorf("meta: raft TLS: %v is not an address peers can dial: set AdvertiseAddr", advertise)
	}
	return &tlsStreamLayer{ln: tls.NewListener(inner, server), advertise: advertise, client: client}, nil
}

// Accept returns a connection whose TLS handshake has completed: a peer
// that fails it is dropped here and never reaches raft.
func (l *tlsStreamLayer) Accept() (net.Conn, error) {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return nil, err
		}
		tc := c.(*tls.Conn)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			tc.Close()
			continue
		}
		_ = tc.SetDeadline(time.Time{})
		return tc, nil
	}
}

func (l *tlsStreamLayer) Close() error   { return l.ln.Close() }
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

package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// TLS configurations for blk's mutual TLS: both ends present a
// certificate the cluster CA signed and check the other's chain, usage
// and role. Host names are not checked: inside a cluster a node is who its
// certificate says (its role and name), whatever address it was dialled
// at, which spares operators a certificate per address change. TLS 1.3
// only.

// ErrPeer wraps every refusal of a peer's certificate by this package's
// configurations (chain, usage, role): a refusal no retry can mend.
var ErrPeer = errors.New("pki: peer certificate refused")

// NodeFiles loads a node's credentials from dir: ca.crt and NAME.crt /
// NAME.key.
func NodeFiles(dir, name string) (caPEM, certPEM, keyPEM []byte, err error) {
	read := func(f string) []byte {
		if err != nil {
			return nil
		}
		var b []byte
		b, err = os.ReadFile(filepath.Join(dir, f))
		return b
	}
	caPEM, certPEM, keyPEM = read("ca.crt"), read(name+".crt"), read(name+".key")
	return caPEM, certPEM, keyPEM, err
}

// MutualTLS returns the server and client configurations of a holder of
// certPEM/keyPEM that accepts peers whose certificates caPEM's CA signed
// with one of roles.
func MutualTLS(caPEM, certPEM, keyPEM []byte, roles ...string) (server, client *tls.Config, err error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, errors.New("pki: no CA certificate in the CA file")
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: certificate and key: %w", err)
	}
	check := func(usage x509.ExtKeyUsage) func([][]byte, [][]*x509.Certificate) error {
		return func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return fmt.Errorf("%w: the peer presented none", ErrPeer)
			}
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, r := range raw[1:] {
				if c, err := x509.ParseCertificate(r); err == nil {
					inter.AddCert(c)
				}
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}, CurrentTime: time.Now()}); err != nil {
				return fmt.Errorf("%w: %q: %w", ErrPeer, leaf.Subject.CommonName, err)
			}
			id, err := IdentityOf(leaf)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrPeer, err)
			}
			if !slices.Contains(roles, id.Role) {
				return fmt.Errorf("%w: %w: %s may not connect here (want %v)", ErrPeer, ErrRole, id, roles)
			}
			return nil
		}
	}
	server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		// The standard verification checks the chain; this adds the role.
		VerifyPeerCertificate: check(x509.ExtKeyUsageClientAuth),
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		// Host names are not checked (see above): the chain, usage and
		// role are, in VerifyPeerCertificate.
		InsecureSkipVerify:    true,
		VerifyPeerCertificate: check(x509.ExtKeyUsageServerAuth),
	}
	return server, client, nil
}

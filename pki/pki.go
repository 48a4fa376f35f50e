// Package pki is blk's certificate authority: one CA per cluster issues
// node certificates (raft, node-to-node calls, the management API's server
// side) and operator certificates (blkctl), each carrying its holder's name
// and role. It uses the standard library only (crypto/x509, crypto/ecdsa);
// keys are ECDSA P-256.
//
// Files: a certificate is PEM in NAME.crt (mode 0644), its key PKCS#8 PEM
// in NAME.key (mode 0600); the CA is ca.crt and ca.key. Nothing is ever
// overwritten: issuing over an existing file fails, so a rotation writes
// new files and the operator swaps them (docs/security.md).
package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Roles a certificate grants, in its subject's OrganizationalUnit.
const (
	// RoleNode: a storage node (raft, node-to-node calls, joins).
	RoleNode = "node"
	// RoleAdmin: an operator who may change anything.
	RoleAdmin = "admin"
	// RoleReader: an operator who may only read.
	RoleReader = "reader"
	// RoleHost: a host's agent (the CSI node plugin), which may only
	// register hosts and read them (docs/operations.md §1.9). One host
	// certificate is shared by every node of a Kubernetes cluster: a
	// stolen one registers host names, which grant nothing.
	RoleHost = "host"
)

// knownRoles are the roles a certificate may carry.
var knownRoles = []string{RoleNode, RoleAdmin, RoleReader, RoleHost}

// Validity defaults.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
	// backdate covers clocks a little behind the issuer's.
	backdate = 5 * time.Minute
)

// Errors.
var (
	// ErrExists: a file the call would write is already there.
	ErrExists = errors.New("pki: file exists")
	// ErrRole: an unknown role, or a certificate without a valid one.
	ErrRole = errors.New("pki: bad role")
)

// CA is a certificate authority: its certificate and signing key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA creates a self-signed CA named name ("blk cluster <id>").
func NewCA(name string, validity time.Duration) (*CA, error) {
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"blk"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Request describes a certificate to issue.
type Request struct {
	// Name is the holder: a node ID or an operator's name (CommonName).
	Name string
	// Role is RoleNode, RoleAdmin, RoleReader or RoleHost.
	Role string
	// Hosts are the DNS names and IP addresses a node is reached at
	// (server certificates); ignored for operators.
	Hosts []string
	// Validity defaults to DefaultCertValidity; NotBefore, if set,
	// replaces "now" (tests make expired certificates with it).
	Validity  time.Duration
	NotBefore time.Time
}

// Issue signs a new key pair for r and returns the certificate and key
// PEM.
func (ca *CA) Issue(r Request) (certPEM, keyPEM []byte, err error) {
	if r.Name == "" {
		return nil, nil, errors.New("pki: empty name")
	}
	if !slices.Contains(knownRoles, r.Role) {
		return nil, nil, fmt.Errorf("%w: %q (use %s, %s, %s or %s)", ErrRole, r.Role, RoleNode, RoleAdmin, RoleReader, RoleHost)
	}
	if r.Validity <= 0 {
		r.Validity = DefaultCertValidity
	}
	start := r.NotBefore
	if start.IsZero() {
		start = time.Now().Add(-backdate)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: r.Name, OrganizationalUnit: []string{r.Role}, Organization: []string{"blk"}},
		NotBefore:    start,
		NotAfter:     start.Add(r.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if r.Role == RoleNode {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range r.Hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if h != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}), nil
}

// Identity is who a verified certificate names.
type Identity struct {
	Name, Role string
}

func (id Identity) String() string { return id.Role + ":" + id.Name }

// IdentityOf reads the holder and role of a certificate this package
// issued (the caller has verified its chain).
func IdentityOf(c *x509.Certificate) (Identity, error) {
	if len(c.Subject.OrganizationalUnit) != 1 {
		return Identity{}, fmt.Errorf("%w: certificate %q carries %d roles, want 1", ErrRole, c.Subject.CommonName, len(c.Subject.OrganizationalUnit))
	}
	role := c.Subject.OrganizationalUnit[0]
	if !slices.Contains(knownRoles, role) {
		return Identity{}, fmt.Errorf("%w: certificate %q has role %q", ErrRole, c.Subject.CommonName, role)
	}
	return Identity{Name: c.Subject.CommonName, Role: role}, nil
}

// Pool returns a certificate pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// CertPEM is the CA certificate in PEM.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// Save writes ca.crt (0644) and ca.key (0600) into dir (created 0700 if
// absent); it refuses to overwrite either.
func (ca *CA) Save(dir string) error {
	kd, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return err
	}
	return WritePair(dir, "ca", ca.CertPEM(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}))
}

// LoadCA reads ca.crt and ca.key from dir.
func LoadCA(dir string) (*CA, error) {
	cert, err := LoadCert(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", filepath.Join(dir, "ca.crt"))
	}
	kb, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, err
	}
	key, err := parseKey(kb)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", filepath.Join(dir, "ca.key"), err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("pki: %s does not belong to %s", filepath.Join(dir, "ca.key"), filepath.Join(dir, "ca.crt"))
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadCert reads one PEM certificate.
func LoadCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("pki: %s holds no PEM certificate", path)
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, errors.New("no PKCS#8 PEM private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T key, want ECDSA", k)
	}
	return ek, nil
}

// WritePair writes base.crt (0644) and base.key (0600) into dir, created
// 0700 if absent. It refuses to overwrite either file (ErrExists) and
// writes the key first with its final mode, so it is never readable by
// others even for a moment.
func WritePair(dir, base string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cp, kp := filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	for _, p := range []string{cp, kp} {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%w: %s (rotate by writing new files elsewhere, then swap them)", ErrExists, p)
		}
	}
	if err := writeNew(kp, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeNew(cp, certPEM, 0o644); err != nil {
		_ = os.Remove(kp)
		return err
	}
	return nil
}

func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %s", ErrExists, path)
		}
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Verify checks that cert chains to the CA in pool for usage at time now,
// and returns its identity.
func Verify(pool *x509.CertPool, cert *x509.Certificate, usage x509.ExtKeyUsage, now time.Time) (Identity, error) {
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}, CurrentTime: now}); err != nil {
		return Identity{}, err
	}
	return IdentityOf(cert)
}

// SameCert says whether two PEM certificates are the same certificate.
func SameCert(a, b []byte) bool {
	ba, _ := pem.Decode(a)
	bb, _ := pem.Decode(b)
	return ba != nil && bb != nil && bytes.Equal(ba.Bytes, bb.Bytes)
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

package pki

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func parse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatal("no PEM")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestIssueAndVerify: node and operator certificates chain to their CA
// with their names and roles; a certificate of another CA, an expired one,
// an operator certificate used as a server, and a role the package does
// not know are refused.
func TestIssueAndVerify(t *testing.T) {
	ca, err := NewCA("blk cluster test", 0)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("blk cluster other", 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	node, _, err := ca.Issue(Request{Name: "node1", Role: RoleNode, Hosts: []string{"127.0.0.1", "node1.example"}})
	if err != nil {
		t.Fatal(err)
	}
	nc := parse(t, node)
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		id, err := Verify(ca.Pool(), nc, usage, now)
		if err != nil || id != (Identity{"node1", RoleNode}) {
			t.Fatalf("node certificate for %v: %v, %v", usage, id, err)
		}
	}
	if err := nc.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatalf("node certificate host: %v", err)
	}
	if err := nc.VerifyHostname("node1.example"); err != nil {
		t.Fatalf("node certificate DNS name: %v", err)
	}

	op, _, err := ca.Issue(Request{Name: "alice", Role: RoleReader})
	if err != nil {
		t.Fatal(err)
	}
	oc := parse(t, op)
	if id, err := Verify(ca.Pool(), oc, x509.ExtKeyUsageClientAuth, now); err != nil || id.Role != RoleReader || id.Name != "alice" {
		t.Fatalf("operator certificate: %v, %v", id, err)
	}
	if _, err := Verify(ca.Pool(), oc, x509.ExtKeyUsageServerAuth, now); err == nil {
		t.Fatal("an operator certificate verified as a server's")
	}
	if _, err := Verify(other.Pool(), nc, x509.ExtKeyUsageClientAuth, now); err == nil {
		t.Fatal("a certificate of another CA verified")
	}
	old, _, err := ca.Issue(Request{Name: "node2", Role: RoleNode, NotBefore: now.Add(-48 * time.Hour), Validity: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(ca.Pool(), parse(t, old), x509.ExtKeyUsageClientAuth, now); err == nil {
		t.Fatal("an expired certificate verified")
	}
	if _, _, err := ca.Issue(Request{Name: "x", Role: "root"}); !errors.Is(err, ErrRole) || !strings.Contains(err.Error(), RoleHost) {
		t.Fatalf("role root: %v, want ErrRole naming the roles, host among them", err)
	}
	// A host certificate (the CSI node plugin's) is a client's only.
	hp, _, err := ca.Issue(Request{Name: "csi-node", Role: RoleHost, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	hc := parse(t, hp)
	if id, err := Verify(ca.Pool(), hc, x509.ExtKeyUsageClientAuth, now); err != nil || id.Role != RoleHost || id.Name != "csi-node" {
		t.Fatalf("host certificate: %v, %v", id, err)
	}
	if _, err := Verify(ca.Pool(), hc, x509.ExtKeyUsageServerAuth, now); err == nil || len(hc.IPAddresses) != 0 {
		t.Fatal("a host certificate verified as a server's, or carries addresses")
	}
}

// TestFiles: the CA and issued pairs are written with the key 0600 and
// the certificate 0644, read back equal, and never overwritten.
func TestFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	ca, err := NewCA("blk cluster test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); !errors.Is(err, ErrExists) {
		t.Fatalf("saving over a CA: %v, want ErrExists", err)
	}
	back, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Cert.Equal(ca.Cert) || !back.Key.Equal(ca.Key) {
		t.Fatal("CA read back differs")
	}
	c, k, err := back.Issue(Request{Name: "admin", Role: RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePair(dir, "admin", c, k); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"ca.key": 0o600, "ca.crt": 0o644, "admin.key": 0o600, "admin.crt": 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, mode %v, want %v", name, err, fi.Mode().Perm(), want)
		}
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v, want 0700", fi.Mode().Perm())
	}
	if err := WritePair(dir, "admin", c, k); !errors.Is(err, ErrExists) {
		t.Fatalf("writing over a pair: %v, want ErrExists", err)
	}
	got, err := LoadCert(filepath.Join(dir, "admin.crt"))
	if err != nil || !SameCert(c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: got.Raw})) {
		t.Fatalf("certificate read back: %v", err)
	}
	// A key that is not the CA's is refused.
	other, _ := NewCA("other", 0)
	odir := filepath.Join(t.TempDir(), "o")
	if err := other.Save(odir); err != nil {
		t.Fatal(err)
	}
	kb, _ := os.ReadFile(filepath.Join(odir, "ca.key"))
	mixed := filepath.Join(t.TempDir(), "m")
	os.MkdirAll(mixed, 0o700)
	os.WriteFile(filepath.Join(mixed, "ca.crt"), ca.CertPEM(), 0o644)
	os.WriteFile(filepath.Join(mixed, "ca.key"), kb, 0o600)
	if _, err := LoadCA(mixed); err == nil {
		t.Fatal("a CA with another CA's key loaded")
	}
}

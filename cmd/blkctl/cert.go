package main

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/blk-project/blk/pki"
	"github.com/urfave/cli/v2"
)

// The cluster's certificates (package pki; docs/security.md): a CA, node
// certificates for blkd, operator certificates for blkctl.
func certCommand() *cli.Command {
	days := &cli.IntFlag{Name: "days", Value: 365, Usage: "validity in days"}
	return &cli.Command{
		Name:  "cert",
		Usage: "create the cluster's CA and issue node and operator certificates",
		Subcommands: []*cli.Command{
			{
				Name: "ca", Usage: "create a new cluster CA (ca.crt, ca.key)", UsageText: "blkctl cert ca --dir DIR [--name NAME] [--days 3650]",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "dir", Usage: "directory to write ca.crt and ca.key into (created 0700)"},
					&cli.StringFlag{Name: "name", Value: "blk cluster", Usage: "the CA's name"},
					&cli.IntFlag{Name: "days", Value: 3650, Usage: "validity in days"},
				},
				Action: certCA,
			},
			{
				Name: "issue", Usage: "issue a node or operator certificate signed by the CA",
				UsageText: "blkctl cert issue NAME --role node|admin|reader|host --ca-dir DIR [--out DIR] [--host H ...] [--days 365]",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "role", Usage: "node (a blkd), admin or reader (an operator), or host (the CSI node plugin: may only register hosts)"},
					&cli.StringFlag{Name: "ca-dir", Usage: "directory holding ca.crt and ca.key"},
					&cli.StringFlag{Name: "out", Usage: "directory to write NAME.crt and NAME.key into (default: --ca-dir)"},
					&cli.StringSliceFlag{Name: "host", Usage: "for a node: a DNS name or IP address it is reached at (repeat)"},
					days,
				},
				Action: certIssue,
			},
			{Name: "show", Usage: "show who a certificate names, its role and validity", UsageText: "blkctl cert show FILE", Action: certShow},
		},
	}
}

func certCA(c *cli.Context) error {
	if _, err := args(c); err != nil {
		return err
	}
	dir := c.String("dir")
	if dir == "" {
		return usageErrorf("cert ca: --dir is required")
	}
	ca, err := pki.NewCA(c.String("name"), time.Duration(c.Int("days"))*24*time.Hour)
	if err != nil {
		return err
	}
	if err := ca.Save(dir); err != nil {
		return err
	}
	if wantJSON(c) {
		return writeJSON(c, map[string]string{"ca": c.String("name"), "cert": filepath.Join(dir, "ca.crt"), "key": filepath.Join(dir, "ca.key")})
	}
	fmt.Fprintf(c.App.Writer, "CA %q written to %s (ca.key is secret: keep it off the nodes if you can)\n", c.String("name"), dir)
	return nil
}

func certIssue(c *cli.Context) error {
	a, err := args(c, "name")
	if err != nil {
		return err
	}
	caDir := c.String("ca-dir")
	if caDir == "" {
		return usageErrorf("cert issue: --ca-dir is required")
	}
	out := c.String("out")
	if out == "" {
		out = caDir
	}
	ca, err := pki.LoadCA(caDir)
	if err != nil {
		return fmt.Errorf("cert issue: %w", err)
	}
	role := c.String("role")
	if hosts := c.StringSlice("host"); len(hosts) > 0 && role != pki.RoleNode {
		return usageErrorf("cert issue: --host %s: only a node certificate names the addresses it is reached at; a %s certificate is a client's", hosts[0], role)
	}
	certPEM, keyPEM, err := ca.Issue(pki.Request{Name: a[0], Role: role, Hosts: c.StringSlice("host"), Validity: time.Duration(c.Int("days")) * 24 * time.Hour})
	if errors.Is(err, pki.ErrRole) {
		return usageErrorf("cert issue: %v", err)
	}
	if err != nil {
		return err
	}
	if err := pki.WritePair(out, a[0], certPEM, keyPEM); err != nil {
		return err
	}
	if wantJSON(c) {
		return writeJSON(c, map[string]string{"name": a[0], "role": role, "cert": filepath.Join(out, a[0]+".crt"), "key": filepath.Join(out, a[0]+".key")})
	}
	fmt.Fprintf(c.App.Writer, "%s certificate for %q written to %s (%s.key is secret, mode 0600)\n", role, a[0], filepath.Join(out, a[0]+".crt"), a[0])
	return nil
}

func certShow(c *cli.Context) error {
	a, err := args(c, "file")
	if err != nil {
		return err
	}
	cert, err := pki.LoadCert(a[0])
	if err != nil {
		return err
	}
	kind := "certificate"
	role := ""
	if cert.IsCA {
		kind = "CA"
	} else if id, err := pki.IdentityOf(cert); err == nil {
		role = id.Role
	}
	var hosts []string
	hosts = append(hosts, cert.DNSNames...)
	for _, ip := range cert.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	state := "valid"
	now := time.Now()
	switch {
	case now.After(cert.NotAfter):
		state = "EXPIRED"
	case now.Before(cert.NotBefore):
		state = "not yet valid"
	case cert.NotAfter.Sub(now) < 30*24*time.Hour:
		state = "valid, expires within 30 days: rotate it"
	}
	usages := []string{}
	for _, u := range cert.ExtKeyUsage {
		switch u {
		case x509.ExtKeyUsageServerAuth:
			usages = append(usages, "server")
		case x509.ExtKeyUsageClientAuth:
			usages = append(usages, "client")
		}
	}
	if wantJSON(c) {
		if hosts == nil {
			hosts = []string{}
		}
		return writeJSON(c, certInfo{Kind: kind, Name: cert.Subject.CommonName, Issuer: cert.Issuer.CommonName, Role: role,
			Hosts: hosts, Usage: usages, NotBefore: cert.NotBefore.UTC(), NotAfter: cert.NotAfter.UTC(), State: state})
	}
	usage := ""
	for _, u := range usages {
		usage += " " + u
	}
	fmt.Fprintf(c.App.Writer, "%s %q issued by %q\nrole: %s\nhosts: %s\nusage:%s\nvalid: %s to %s (%s)\n",
		kind, cert.Subject.CommonName, cert.Issuer.CommonName, orDash(role), orDash(strings.Join(hosts, ", ")), usage,
		cert.NotBefore.Format(time.RFC3339), cert.NotAfter.Format(time.RFC3339), state)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// certInfo is cert show's -o json object; times are RFC 3339.
type certInfo struct {
	Kind      string    `json:"kind"` // "CA" or "certificate"
	Name      string    `json:"name"`
	Issuer    string    `json:"issuer"`
	Role      string    `json:"role,omitempty"` // node, admin, reader; none for a CA
	Hosts     []string  `json:"hosts"`
	Usage     []string  `json:"usage"` // server, client
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	State     string    `json:"state"`
}

// wantJSON: -o json, before or after the verb. The cert verbs need no
// API, so they read the flag without newEnv.
func wantJSON(c *cli.Context) bool { return global(c, "output") == "json" }

func writeJSON(c *cli.Context, v any) error {
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

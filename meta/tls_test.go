package meta

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/pki"
)

// TestClusterMutualTLS: three members with node certificates of one CA
// form a cluster over mutual TLS and replicate; a node with a node
// certificate of another CA, and one with an operator (admin) certificate
// of the right CA, are added as nonvoters but never receive an entry (their
// handshakes fail); a plain TCP peer speaking raft gets nothing either.
func TestClusterMutualTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	ca, err := pki.NewCA("blk test", 0)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("blk other", 0)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	var refused atomic.Int64 // n0's refused raft handshakes
	start := func(name string, issuer *pki.CA, role string, bootstrap bool) *Node {
		t.Helper()
		certPEM, keyPEM, err := issuer.Issue(pki.Request{Name: name, Role: role, Hosts: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		// Every node trusts the cluster's CA (ca), whoever signed its own
		// certificate.
		srv, cli, err := pki.MutualTLS(ca.CertPEM(), certPEM, keyPEM, pki.RoleNode)
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t, name, filepath.Join(root, name))
		cfg.BindAddr, cfg.Bootstrap, cfg.TLSServer, cfg.TLSClient = "127.0.0.1:0", bootstrap, srv, cli
		if name == "n0" {
			cfg.TLSRefused = func(net.Addr, error) { refused.Add(1) }
		}
		n, err := NewNode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		return n
	}
	n0 := start("n0", ca, pki.RoleNode, true)
	n1 := start("n1", ca, pki.RoleNode, false)
	n2 := start("n2", ca, pki.RoleNode, false)
	rogue := start("rogue", other, pki.RoleNode, false)
	operator := start("op", ca, pki.RoleAdmin, false)
	ctx := context.Background()
	eventually(t, "n0 leads", func() error {
		if !n0.IsLeader() {
			return errors.New("not yet")
		}
		return nil
	})
	for _, n := range []*Node{n1, n2} {
		if err := n0.AddVoter(ctx, n.ID(), n.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []*Node{rogue, operator} {
		if err := n0.AddNonvoter(ctx, n.ID(), n.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	// A plain TCP peer: raft bytes without TLS.
	if c, err := net.Dial("tcp", n0.Addr()); err == nil {
		c.Write(bytes.Repeat([]byte{0}, 64))
		c.Close()
	}
	for i := range 5 {
		if _, err := n0.Apply(ctx, RegisterNode{ID: fmt.Sprintf("s%d", i), TargetAddr: "a:1", MgmtAddr: "a:2"}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "members replicate over TLS", func() error {
		for _, n := range []*Node{n1, n2} {
			if !bytes.Equal(n.FSM().MarshalState(), n0.FSM().MarshalState()) {
				return fmt.Errorf("%s differs", n.ID())
			}
		}
		return nil
	})
	// An operator certificate of the right CA dialling the raft port as a
	// client is refused for its role; a node certificate is accepted.
	dialAs := func(role string) error {
		certPEM, keyPEM, err := ca.Issue(pki.Request{Name: "dialer", Role: role})
		if err != nil {
			t.Fatal(err)
		}
		_, cli, err := pki.MutualTLS(ca.CertPEM(), certPEM, keyPEM, pki.RoleNode)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.Dial("tcp", n0.Addr(), cli)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = c.Read(make([]byte, 1)) // TLS 1.3: the server's refusal arrives here
		return err
	}
	var ne net.Error
	if err := dialAs(pki.RoleAdmin); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("an admin certificate on the raft port: %v, want the server's refusal", err)
	}
	// A connection that never starts its handshake holds no one up.
	silent, err := net.Dial("tcp", n0.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	began := time.Now()
	if err := dialAs(pki.RoleNode); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("a node certificate on the raft port: %v, want an open connection (read timeout)", err)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("a node's handshake took %v behind a silent connection", d)
	}
	// Refusals are reported: the plain TCP peer, the admin certificate.
	eventually(t, "refused handshakes counted", func() error {
		if n := refused.Load(); n < 2 {
			return fmt.Errorf("%d refused", n)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // ample time for a replication that should not happen
	for _, n := range []*Node{rogue, operator} {
		if got := len(n.FSM().Export().Nodes); got != 0 || n.AppliedIndex() != 0 {
			t.Errorf("%s (refused certificate) applied %d entries, knows %d nodes", n.ID(), n.AppliedIndex(), got)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/logline"
	"github.com/blk-project/blk/nvme"
)

// TestDiscoveryPort: with --discovery-addr, blkd serves an NVMe/TCP port
// for discovery only. Its log sends the host to the NVMe/TCP and
// NVMe/RDMA ports (the discovery port itself lists only the discovery
// subsystem), and a Connect to the volume through it is refused.
func TestDiscoveryPort(t *testing.T) {
	disc := freeAddr(t)
	_, discPort, _ := net.SplitHostPort(disc)
	d := startBlkd(t, t.TempDir(), "--discovery-addr", disc)
	if _, ok := logline.Find(d.output(), "listening", "port", "nvme-tcp-discovery", "addr", disc, "serves", "discovery only"); !ok {
		t.Fatalf("output lacks the discovery port:\n%s", d.output())
	}
	v, a := attachNew(t, d, "dp", "1MiB")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := initiator.Config{Transport: initiator.TransportTCP, HostNQN: hostNQN}
	entries, err := initiator.Discover(ctx, cfg, disc)
	if err != nil {
		t.Fatalf("discover through %s: %v", disc, err)
	}
	cstr := func(b []byte) string { return string(bytes.TrimRight(b, "\x00 ")) }
	got := map[string]string{}
	for _, e := range entries {
		at := net.JoinHostPort(cstr(e.TrAddr[:]), cstr(e.TrSvcID[:]))
		switch {
		case e.SubType == nvme.SubTypeCurrentDiscovery:
			if cstr(e.TrSvcID[:]) != discPort || e.TrType != nvme.TrTypeTCP {
				t.Errorf("current discovery subsystem listed at %s (trtype %d), want the discovery port %s", at, e.TrType, disc)
			}
		case e.SubNQN.String() == v.NQN:
			tr := map[uint8]string{nvme.TrTypeTCP: "tcp", nvme.TrTypeRDMA: "rdma"}[e.TrType]
			got[tr] = at
		}
	}
	if len(got) != 2 || got["tcp"] != a.endpoint("tcp") || got["rdma"] != a.endpoint("rdma") {
		t.Fatalf("discovery through the discovery port lists %s at %v, want tcp %s and rdma %s (and nothing at %s)",
			v.NQN, got, a.endpoint("tcp"), a.endpoint("rdma"), disc)
	}
	if c, err := initiator.Connect(ctx, cfg, disc, v.NQN); err == nil {
		c.Close()
		t.Fatal("connected to the volume through the discovery-only port")
	}
}

package main

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/logline"
	"github.com/blk-project/blk/transport/soft"
)

// discover reads the discovery log through addr as hostNQN and returns
// TRADDR:TRSVCID of the entry for subnqn.
func discover(t *testing.T, addr, subnqn string) string {
	t.Helper()
	nic, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer nic.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries, err := initiator.Discover(ctx, initiator.Config{Adapter: nic, HostNQN: hostNQN}, addr)
	if err != nil {
		t.Fatalf("discover through %s: %v", addr, err)
	}
	cstr := func(b []byte) string { return string(bytes.TrimRight(b, "\x00 ")) }
	for _, e := range entries {
		if e.SubNQN.String() == subnqn {
			return net.JoinHostPort(cstr(e.TrAddr[:]), cstr(e.TrSvcID[:]))
		}
	}
	t.Fatalf("discovery through %s lists no %s (%d entries)", addr, subnqn, len(entries))
	return ""
}

// TestAdvertiseAddr: with --advertise-addr, attach, the registry's node
// address and the discovery log give the advertised address, while hosts
// still reach the node through the listen address.
func TestAdvertiseAddr(t *testing.T) {
	nvme, tcpAddr := freeAddr(t), freeAddr(t)
	_, tcpPort, _ := net.SplitHostPort(tcpAddr)
	d := startBlkdOn(t, t.TempDir(), freeAddr(t), nvme, freeAddr(t), "--advertise-addr", "192.0.2.10:14420", "--tcp-addr", tcpAddr)
	if _, ok := logline.Find(d.output(), "listening", "port", "nvme-rdma", "addr", nvme, "serves", "I/O and discovery", "advertised", "192.0.2.10:14420"); !ok {
		t.Fatalf("output lacks the advertised address:\n%s", d.output())
	}
	v, a := attachNew(t, d, "adv", "1MiB")
	// The advertised address serves both ports; its port is the RDMA
	// port's, the TCP port advertises its own.
	if got := a.endpoint("rdma"); got != "192.0.2.10:14420" {
		t.Fatalf("attach answered RDMA at %q, want the advertised 192.0.2.10:14420", got)
	}
	if a.Transport != "tcp" || a.Address != "192.0.2.10" || a.endpoint("tcp") != "192.0.2.10:"+tcpPort {
		t.Fatalf("attach answered %+v, want NVMe/TCP first at 192.0.2.10:%s", a, tcpPort)
	}
	var c struct {
		Members []struct {
			NVMeAddr string `json:"nvme_addr"`
		} `json:"members"`
	}
	d.must(t, "GET", "/v1/cluster", "", 200, &c)
	if len(c.Members) != 1 || c.Members[0].NVMeAddr != "192.0.2.10:14420" {
		t.Fatalf("registry members %+v, want nvme_addr 192.0.2.10:14420", c.Members)
	}
	if got := discover(t, nvme, v.NQN); got != "192.0.2.10:14420" {
		t.Fatalf("discovery log entry %s, want the advertised 192.0.2.10:14420", got)
	}
}

// TestAdvertiseWildcard: listening on 0.0.0.0 needs --advertise-addr
// (TestStartRefusals); with one, attach answers it with the listen port,
// and a host connects through it.
func TestAdvertiseWildcard(t *testing.T) {
	_, port, _ := net.SplitHostPort(freeAddr(t))
	d := startBlkdOn(t, t.TempDir(), freeAddr(t), "0.0.0.0:"+port, freeAddr(t), "--advertise-addr", "127.0.0.1")
	v, a := attachNew(t, d, "wild", "1MiB")
	if got, want := a.endpoint("rdma"), "127.0.0.1:"+port; got != want {
		t.Fatalf("attach answered %s, want %s", got, want)
	}
	if got := discover(t, "127.0.0.1:"+port, v.NQN); got != "127.0.0.1:"+port {
		t.Fatalf("discovery log entry %s, want 127.0.0.1:%s", got, port)
	}
	ctrl, ns := connect(t, a)
	defer ctrl.Close()
	if _, err := ns.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("write through the advertised address: %v", err)
	}
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
)

// tcpEntries reads the discovery log through addr as hostNQN and returns
// its NVMe/TCP entries of NVM subsystems, by subsystem NQN.
func tcpEntries(t *testing.T, l []nvme.DiscoveryLogEntry) map[string][]nvme.DiscoveryLogEntry {
	t.Helper()
	out := map[string][]nvme.DiscoveryLogEntry{}
	for _, e := range l {
		if e.SubType == nvme.SubTypeNVM && e.TrType == nvme.TrTypeTCP {
			out[e.SubNQN.String()] = append(out[e.SubNQN.String()], e)
		}
	}
	return out
}

// entryAddr is an entry's TRADDR:TRSVCID.
func entryAddr(e nvme.DiscoveryLogEntry) string {
	cstr := func(b []byte) string { return string(bytes.TrimRight(b, "\x00 ")) }
	return net.JoinHostPort(cstr(e.TrAddr[:]), cstr(e.TrSvcID[:]))
}

// TestDiscoveryAcrossCluster (docs/reservations.md §3): in a cluster of
// three nodes with a volume of one replica on each, the discovery log of
// node1 lists all three, each once on NVMe/TCP, at its serving node's
// address and with the PORTID that node's own log gives its port (so a
// host sees one port by one PORTID whichever node it asks); a volume
// created on node3 later posts the discovery change notice on node1's
// persistent discovery controller, whose log then lists it; and the host
// connects to it where node1's log says, and reads back what it wrote.
func TestDiscoveryAcrossCluster(t *testing.T) {
	c := startCluster(t)
	leader := c.settled(nil)
	lp := c.procs[leader]
	tcp := tcpAddrsOf(t, lp)
	ids := []string{"node1", "node2", "node3"}
	nqns := map[string]string{} // node -> its volume's NQN
	create := func(name, node string) string {
		t.Helper()
		var v volumeJSON
		lp.must(t, "POST", "/v1/volumes", `{"name": "`+name+`", "size": "1MiB", "node": "`+node+`", "replicas": 1}`, 201, &v)
		lp.must(t, "POST", "/v1/volumes/"+name+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
		return v.NQN
	}
	for _, id := range ids {
		nqns[id] = create("disc-"+id, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cfg := initiator.Config{Transport: initiator.TransportTCP, HostNQN: hostNQN, KATO: 5 * time.Second}

	// Each node's own log gives its own port's PORTID.
	own := map[string]uint16{}
	for _, id := range ids {
		eventually(t, 30*time.Second, id+" lists its own volume", func() error {
			l, err := initiator.Discover(ctx, cfg, tcp[id])
			if err != nil {
				return err
			}
			es := tcpEntries(t, l)[nqns[id]]
			if len(es) != 1 || entryAddr(es[0]) != tcp[id] {
				return fmt.Errorf("%s lists %s at %d TCP entries: %v", id, nqns[id], len(es), es)
			}
			own[id] = es[0].PortID
			return nil
		})
	}
	if own["node1"] == own["node2"] || own["node2"] == own["node3"] || own["node1"] == own["node3"] {
		t.Fatalf("PORTIDs of the three nodes' NVMe/TCP ports are not distinct: %v", own)
	}
	// Node1's log lists all three where they are served.
	check := func(l []nvme.DiscoveryLogEntry, id, nqn string) error {
		es := tcpEntries(t, l)[nqn]
		if len(es) != 1 || entryAddr(es[0]) != tcp[id] || es[0].PortID != own[id] || es[0].TReq != nvme.TReqDisableSQFlow {
			return fmt.Errorf("node1 lists %s (on %s at %s, PORTID %d) as %d TCP entries: %+v", nqn, id, tcp[id], own[id], len(es), es)
		}
		return nil
	}
	eventually(t, 30*time.Second, "node1 lists the volumes of all three nodes", func() error {
		l, err := initiator.Discover(ctx, cfg, tcp["node1"])
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := check(l, id, nqns[id]); err != nil {
				return err
			}
		}
		return nil
	})

	// A persistent discovery controller on node1 learns of a volume
	// created on node3.
	w, err := initiator.WatchDiscovery(ctx, cfg, tcp["node1"])
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Log(ctx); err != nil { // arms the notice
		t.Fatal(err)
	}
	late := create("disc-late", "node3")
	for {
		select {
		case <-w.Changed():
		case <-w.Down():
			t.Fatal("node1's persistent discovery controller lost")
		case <-ctx.Done():
			t.Fatalf("no discovery change notice on node1 listing %s", late)
		}
		l, err := w.Log(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if check(l, "node3", late) == nil {
			break
		}
	}

	// The host connects where node1's log says and moves data.
	host, port, _ := net.SplitHostPort(tcp["node3"])
	ctrl, ns := connect(t, attachJSON{Transport: "tcp", Address: host, Port: portOf(t, net.JoinHostPort(host, port)), SubsystemNQN: late, NSID: 1})
	defer ctrl.Close()
	buf := bytes.Repeat([]byte("found through node1. "), 196)[:4096]
	if _, err := ns.WriteAt(buf, 8192); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(buf))
	if _, err := ns.ReadAt(got, 8192); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read back from %s: %v", late, err)
	}
}

package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
)

// TestNodeOrdinals: each node of a cluster gets its own ordinal (the
// bootstrapping node through its first registration, the others as they
// join, in that order), shown in GET /v1/cluster; a host's controller on
// each node has a CNTLID in that node's range (meta.CNTLIDRange), so no
// two nodes can hand a host the same one; each node's discovery log
// lists its ports with the PORTIDs 4 × ordinal + 1 (NVMe/TCP) and + 2
// (NVMe/RDMA). A restarted node keeps its ordinal and its range.
func TestNodeOrdinals(t *testing.T) {
	c := startCluster(t)
	want := map[string]int{"node1": 1, "node2": 2, "node3": 3}
	checkOrdinals := func() {
		t.Helper()
		var cl struct {
			Members []struct {
				ID      string `json:"id"`
				Ordinal int    `json:"ordinal"`
			} `json:"members"`
		}
		c.procs["node1"].must(t, "GET", "/v1/cluster", "", 200, &cl)
		got := map[string]int{}
		for _, m := range cl.Members {
			got[m.ID] = m.Ordinal
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("ordinals %v, want %v", got, want)
		}
	}
	checkOrdinals()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := initiator.Config{Transport: initiator.TransportTCP, HostNQN: hostNQN}
	leader := c.procs["node1"]
	seen := map[uint16]string{}
	// onNode connects a controller to the volume on id and checks its
	// CNTLID; the first time, also the discovery log's PORTIDs.
	onNode := func(id string, discover bool) {
		t.Helper()
		name := "v-" + id
		var v volumeJSON
		leader.must(t, "GET", "/v1/volumes/"+name, "", 200, &v)
		var a attachJSON
		leader.must(t, "POST", "/v1/volumes/"+name+"/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
		ctrl, err := initiator.Connect(ctx, cfg, a.endpoint("tcp"), v.NQN)
		if err != nil {
			t.Fatalf("connect to %s on %s: %v", name, id, err)
		}
		cntlid := ctrl.CNTLID()
		ctrl.Close()
		leader.must(t, "POST", "/v1/volumes/"+name+"/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
		lo, hi, _ := meta.CNTLIDRange(want[id])
		if cntlid < lo || cntlid > hi {
			t.Fatalf("%s (ordinal %d) gave CNTLID %d, outside %d..%d", id, want[id], cntlid, lo, hi)
		}
		if !discover {
			return // a restart: a new target, which may hand the same ID again
		}
		if other, dup := seen[cntlid]; dup {
			t.Fatalf("%s and %s both gave CNTLID %d", id, other, cntlid)
		}
		seen[cntlid] = id
		entries, err := initiator.Discover(ctx, cfg, a.endpoint("tcp"))
		if err != nil {
			t.Fatalf("discover on %s: %v", id, err)
		}
		ids := map[uint8]uint16{}
		for _, e := range entries {
			if e.SubNQN.String() == v.NQN {
				ids[e.TrType] = e.PortID
			}
		}
		tcpID, rdmaID := uint16(4*want[id]+1), uint16(4*want[id]+2)
		if len(ids) != 2 || ids[nvme.TrTypeTCP] != tcpID || ids[nvme.TrTypeRDMA] != rdmaID {
			t.Fatalf("%s lists %s on PORTIDs %v, want tcp %d and rdma %d", id, v.NQN, ids, tcpID, rdmaID)
		}
	}
	for _, id := range []string{"node1", "node2", "node3"} {
		name := "v-" + id
		leader.must(t, "POST", "/v1/volumes", `{"name": "`+name+`", "size": "1MiB", "node": "`+id+`", "replicas": 1}`, 201, nil)
		leader.must(t, "POST", "/v1/volumes/"+name+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
		onNode(id, true)
	}

	// node2 restarts: same ordinal, same range.
	c.procs["node2"].stop(t)
	c.start("node2", "--join", c.nodes["node1"].api)
	checkOrdinals()
	onNode("node2", false)
}

package main

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// TestPlacement (issue 23): on three nodes, volumes created through the
// leader and through a follower (which answers 421 naming the leader, as
// blkctl follows) are spread by free capacity, two per node, instead of
// all landing on the leader; each is served by its node over NVMe/TCP;
// "node" pins; an unknown node is 404, a malformed one 400, and a node
// that is down 409 naming its state, while unpinned volumes go around it.
// Zones registered with --zone are shown in GET /v1/cluster.
func TestPlacement(t *testing.T) {
	t.Parallel() // mostly waits for the leader to see a node down
	c := &cluster{t: t, nodes: map[string]*nodeAddrs{}, procs: map[string]*daemon{}}
	for _, id := range []string{"node1", "node2", "node3"} {
		c.nodes[id] = &nodeAddrs{t.TempDir(), freeAddr(t), freeAddr(t), freeAddr(t)}
	}
	zones := map[string]string{"node1": "rack-1", "node2": "rack-2", "node3": ""}
	c.start("node1", "--zone", "rack-1")
	c.start("node2", "--join", c.nodes["node1"].api, "--zone", "rack-2")
	c.start("node3", "--join", c.nodes["node1"].api)
	leader := c.settled(nil)
	var follower string
	for _, id := range []string{"node1", "node2", "node3"} {
		if id != leader {
			follower = id
			break
		}
	}

	// Zones and NVMe/TCP addresses as every node reports them.
	tcp := map[string]string{}
	for id, p := range c.procs {
		var cl struct {
			Members []struct {
				ID      string `json:"id"`
				Zone    string `json:"zone"`
				TCPAddr string `json:"tcp_addr"`
			} `json:"members"`
		}
		eventually(t, 10*time.Second, id+" shows every zone", func() error {
			p.must(t, "GET", "/v1/cluster", "", 200, &cl)
			for _, m := range cl.Members {
				if m.Zone != zones[m.ID] || m.TCPAddr == "" {
					return fmt.Errorf("%+v", cl.Members)
				}
				tcp[m.ID] = m.TCPAddr
			}
			return nil
		})
	}

	// With ?usage=true, any node reports every member's capacity (from
	// the registry) and its store as that member measures it.
	var cl struct {
		Members []struct {
			ID       string `json:"id"`
			Capacity uint64 `json:"capacity_bytes"`
			Disk     *struct {
				Total uint64 `json:"total_bytes"`
				Free  uint64 `json:"free_bytes"`
			} `json:"disk"`
		} `json:"members"`
	}
	c.procs[follower].must(t, "GET", "/v1/cluster?usage=true", "", 200, &cl)
	for _, m := range cl.Members {
		if m.Capacity == 0 || m.Disk == nil || m.Disk.Total == 0 || m.Disk.Free > m.Disk.Total {
			t.Fatalf("cluster usage, member %s: capacity %d, disk %+v", m.ID, m.Capacity, m.Disk)
		}
	}
	if len(cl.Members) != 3 {
		t.Fatalf("cluster usage: %d members", len(cl.Members))
	}

	// create posts through via, and on a 421 to the leader it names.
	create := func(via, body string) volumeJSON {
		t.Helper()
		var v volumeJSON
		code, msg := c.procs[via].call(t, "POST", "/v1/volumes", body, &v)
		if code == 421 {
			if !bytes.Contains([]byte(msg), []byte(c.nodes[leader].api)) {
				t.Fatalf("421 from %s does not name the leader's API %s: %s", via, c.nodes[leader].api, msg)
			}
			c.procs[leader].must(t, "POST", "/v1/volumes", body, 201, &v)
		} else if code != 201 {
			t.Fatalf("create %s through %s: %d %s", body, via, code, msg)
		}
		return v
	}
	per := map[string][]string{}
	for i := range 6 {
		via := leader
		if i%2 == 1 {
			via = follower
		}
		v := create(via, fmt.Sprintf(`{"name": "p%d", "size": "8MiB"}`, i))
		per[v.Node] = append(per[v.Node], v.Name)
	}
	for _, id := range []string{"node1", "node2", "node3"} {
		if len(per[id]) != 2 {
			t.Fatalf("placement %v: want two volumes on each node", per)
		}
	}
	t.Logf("placed %v (leader %s)", per, leader)

	// Pinned: node3 already has two; "node" puts a third there anyway.
	if v := create(follower, `{"name": "pinned", "size": "8MiB", "node": "node3"}`); v.Node != "node3" {
		t.Fatalf("pinned to node3, created on %s", v.Node)
	}
	c.procs[leader].refuse(t, "POST", "/v1/volumes", `{"name": "x", "size": "8MiB", "node": "ghost"}`, 404, `node "ghost".*unknown node`)
	c.procs[leader].refuse(t, "POST", "/v1/volumes", `{"name": "x", "size": "8MiB", "node": "a/b"}`, 400, `node "a/b" has '/'`)
	c.procs[leader].refuse(t, "POST", "/v1/volumes", `{"name": "x", "size": "3PiB"}`, 507, `node node\d may be promised the most, \d+ more bytes.*--overcommit`)

	// Three zones (a node without one is a zone of its own): the default
	// is three replicas, the pinned node primary, all in sync at epoch 1.
	c.procs[leader].refuse(t, "POST", "/v1/volumes", `{"name": "x", "size": "8MiB", "replicas": 9}`, 400, `"replicas": 9: give 1 to 5`)
	c.procs[leader].refuse(t, "POST", "/v1/volumes", `{"name": "x", "size": "8MiB", "replicas": 4}`, 409, `4 replica\(s\) need 4 nodes up and serving NVMe-oF in distinct zones; the registry has 3 such zone\(s\)`)
	var one struct {
		Node         string `json:"node"`
		Epoch        uint64 `json:"epoch"`
		WantReplicas int    `json:"want_replicas"`
		Replicas     []struct {
			Node    string `json:"node"`
			State   string `json:"state"`
			Primary bool   `json:"primary"`
		} `json:"replicas"`
	}
	c.procs[leader].must(t, "GET", "/v1/volumes/pinned", "", 200, &one)
	if one.Epoch != 1 || one.WantReplicas != 3 || len(one.Replicas) != 3 || one.Replicas[0].Node != "node3" || one.Node != "node3" || !one.Replicas[0].Primary {
		t.Fatalf("pinned volume's replicas: %+v", one)
	}
	for _, r := range one.Replicas {
		if r.State != "in-sync" || r.Primary != (r.Node == "node3") {
			t.Fatalf("pinned volume's replicas: %+v", one)
		}
	}

	// Every volume is served by its node: attach names the node's NVMe/TCP
	// address, and a block written there reads back.
	for node, names := range per {
		for _, name := range append(names, map[string]string{"node3": "pinned"}[node]) {
			if name == "" {
				continue
			}
			c.procs[leader].must(t, "POST", "/v1/volumes/"+name+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
			var a attachJSON
			c.procs[leader].must(t, "POST", "/v1/volumes/"+name+"/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
			if a.endpoint("tcp") != tcp[node] {
				t.Fatalf("%s on %s attaches at %q, want its node's NVMe/TCP %s", name, node, a.endpoint("tcp"), tcp[node])
			}
			ctrl, ns := connect(t, a.over("tcp"))
			data := bytes.Repeat([]byte(name+"@"+node+"."), 4096)[:4096]
			if _, err := ns.WriteAt(data, 8192); err != nil {
				t.Fatalf("write %s on %s: %v", name, node, err)
			}
			got := make([]byte, 4096)
			if _, err := ns.ReadAt(got, 8192); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read %s on %s: %v (equal %v)", name, node, err, bytes.Equal(got, data))
			}
			ctrl.Close()
		}
	}

	// A node killed a moment ago, still up in the registry (the leader
	// marks it down only after downAfter of silence): unpinned volumes
	// do not go to it (placement asks the node it chose first), so they
	// come online at once. Three replicas cannot be placed meanwhile,
	// and say why.
	victim := follower
	c.procs[victim].cmd.Process.Signal(syscall.SIGKILL)
	<-c.procs[victim].exited
	c.procs[leader].refuse(t, "POST", "/v1/volumes", `{"name": "x", "size": "8MiB"}`, 409, `not counting `+victim+`, which did not answer`)
	for i := range 3 {
		if v := create(leader, fmt.Sprintf(`{"name": "k%d", "size": "8MiB", "replicas": 1}`, i)); v.Node == victim || v.State != "online" {
			t.Fatalf("placed with %s killed and not yet down: %+v", victim, v)
		}
	}
	// Down: pinning to it is refused naming its state, and unpinned
	// volumes go to the nodes that are up.
	eventually(t, 25*time.Second, victim+" down", func() error {
		var cl clusterJSON
		c.procs[leader].must(t, "GET", "/v1/cluster", "", 200, &cl)
		for _, m := range cl.Members {
			if m.ID == victim && m.State != "down" {
				return fmt.Errorf("%s is %s", victim, m.State)
			}
		}
		return nil
	})
	c.procs[leader].refuse(t, "POST", "/v1/volumes", `{"name": "x", "size": "8MiB", "node": "`+victim+`"}`, 409, `node "`+victim+`" is down`)
	for i := range 2 {
		if v := create(leader, fmt.Sprintf(`{"name": "q%d", "size": "8MiB"}`, i)); v.Node == victim || v.State != "online" {
			t.Fatalf("placed with %s down: %+v", victim, v)
		}
	}
}

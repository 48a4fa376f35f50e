package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

type memberJSON struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr"`
	NVMeAddr string `json:"nvme_addr"`
	Leader   bool   `json:"leader"`
	Suffrage string `json:"suffrage"`
	State    string `json:"state"`
}

type clusterJSON struct {
	NodeID    string       `json:"node_id"`
	LeaderID  string       `json:"leader_id"`
	LeaderAPI string       `json:"leader_api"`
	Members   []memberJSON `json:"members"`
}

// eventually polls f every 100 ms until it returns nil or within passes.
func eventually(t *testing.T, within time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func volumeNames(vs []volumeJSON) []string {
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	slices.Sort(names)
	return names
}

// TestCluster runs three blkd processes: node1 bootstraps, node2 and node3
// join through node1's API; the leader is SIGKILLed, a survivor takes
// over and serves writes, and the killed node restarts on its data dir
// and catches up; finally the node that owns no volume is removed.
func TestCluster(t *testing.T) {
	c := startCluster(t)
	nodes, procs, start := c.nodes, c.procs, c.start

	// Every node eventually shows three registered members and the same leader.
	leaderOf := func(ids ...string) string {
		var leader string
		eventually(t, 30*time.Second, "cluster view", func() error {
			leader = ""
			for _, id := range ids {
				var c clusterJSON
				if code, msg := procs[id].call(t, "GET", "/v1/cluster", "", &c); code != 200 {
					return fmt.Errorf("%s: %d %s", id, code, msg)
				}
				var leaders []string
				registered := 0
				for _, m := range c.Members {
					if m.Leader {
						leaders = append(leaders, m.ID)
					}
					if m.State == "up" && m.APIAddr != "" && m.Suffrage == "voter" {
						registered++
					}
				}
				if len(c.Members) != 3 || registered != 3 || len(leaders) != 1 || (leader != "" && leaders[0] != leader) {
					return fmt.Errorf("%s sees %+v", id, c)
				}
				leader = leaders[0]
			}
			return nil
		})
		return leader
	}
	leader := leaderOf("node1", "node2", "node3")
	t.Logf("leader %s", leader)

	// Raft health on /metrics: one leader, followers hearing from it.
	for id, p := range procs {
		state := "follower"
		if id == leader {
			state = "leader"
		}
		if body := p.metricsText(t); !strings.Contains(body, "\nblk_raft_state{state=\""+state+"\"} 1\n") {
			t.Fatalf("%s /metrics lacks blk_raft_state{state=%q} 1:\n%s", id, state, body)
		}
		if n := p.metric(t, "blk_raft_peers"); n != 3 {
			t.Fatalf("%s: blk_raft_peers %v, want 3", id, n)
		}
		if id != leader {
			if n := p.metric(t, "blk_raft_last_contact_seconds"); n < 0 || n > 10 {
				t.Fatalf("%s: blk_raft_last_contact_seconds %v", id, n)
			}
		}
	}

	// Writes go to the leader; a follower refuses them with the leader's address.
	// vol1 and vol2 are pinned to the leader of the moment: the test
	// manages a volume owned by a follower, and removes a node owning none.
	procs[leader].must(t, "POST", "/v1/volumes", `{"name": "vol1", "size": "1MiB", "node": "`+leader+`", "replicas": 1}`, 201, nil)
	for id, p := range procs {
		if id == leader {
			continue
		}
		p.refuse(t, "POST", "/v1/volumes", `{"name": "volx", "size": "1MiB"}`, 421, "not the registry leader.*"+nodes[leader].api)
	}

	// Kill the leader: a survivor takes over and accepts writes.
	killed := procs[leader]
	killed.cmd.Process.Signal(syscall.SIGKILL)
	<-killed.exited
	var survivors []string
	for _, id := range []string{"node1", "node2", "node3"} {
		if id != leader {
			survivors = append(survivors, id)
		}
	}
	var newLeader string
	eventually(t, 30*time.Second, "new leader", func() error {
		for _, id := range survivors {
			var c clusterJSON
			if code, msg := procs[id].call(t, "GET", "/v1/cluster", "", &c); code != 200 {
				return fmt.Errorf("%s: %d %s", id, code, msg)
			}
			if c.LeaderID != "" && c.LeaderID != leader {
				newLeader = c.LeaderID
				return nil
			}
		}
		return fmt.Errorf("no survivor is leader yet")
	})
	t.Logf("new leader %s", newLeader)
	eventually(t, 30*time.Second, "create vol2 on the new leader", func() error {
		code, msg := procs[newLeader].call(t, "POST", "/v1/volumes", `{"name": "vol2", "size": "1MiB", "node": "`+newLeader+`", "replicas": 1}`, nil)
		if code != 201 {
			return fmt.Errorf("%d %s", code, msg)
		}
		return nil
	})
	if got := volumeNames(procs[newLeader].volumes(t)); !slices.Equal(got, []string{"vol1", "vol2"}) {
		t.Fatalf("volumes on the new leader: %v", got)
	}

	// Restart the killed node on its data dir, without --join: it catches up.
	start(leader)
	eventually(t, 30*time.Second, "restarted node catches up", func() error {
		if got := volumeNames(procs[leader].volumes(t)); !slices.Equal(got, []string{"vol1", "vol2"}) {
			return fmt.Errorf("volumes on %s: %v", leader, got)
		}
		return nil
	})
	cur := leaderOf("node1", "node2", "node3")

	// A volume owned by a follower is managed through the leader: the
	// leader applies the registry commands and has the owner do its part.
	vol := "vol1" // created on the first leader, now a follower
	if cur == leader {
		vol = "vol2"
	}
	var v volumeJSON
	procs[cur].must(t, "GET", "/v1/volumes/"+vol, "", 200, &v)
	owner := v.Node
	if owner == cur || procs[owner] == nil {
		t.Fatalf("%s is owned by %q, leader %s", vol, owner, cur)
	}
	t.Logf("managing %s, owned by follower %s, through leader %s", vol, owner, cur)
	procs[owner].refuse(t, "POST", "/v1/volumes/"+vol+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 421, "not the registry leader")
	procs[cur].must(t, "POST", "/v1/volumes/"+vol+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, &v)
	if len(v.Hosts) != 1 || v.Hosts[0] != hostNQN {
		t.Fatalf("hosts after allow: %+v", v)
	}
	procs[cur].must(t, "POST", "/v1/volumes/"+vol+"/resize", `{"size": "2MiB"}`, 200, &v)
	var a attachJSON
	procs[cur].must(t, "POST", "/v1/volumes/"+vol+"/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	if a.endpoint("rdma") != nodes[owner].nvme || a.SubsystemNQN != v.NQN {
		t.Fatalf("attach %s: %+v, want the owner's NVMe port %s", vol, a, nodes[owner].nvme)
	}
	// The owner let the host in and grew the volume.
	ctrl, ns := connect(t, a)
	if got := ns.Blocks() * uint64(ns.BlockSize()); got != 2<<20 {
		t.Fatalf("namespace of %s is %d bytes, want 2 MiB", vol, got)
	}
	data := bytes.Repeat([]byte("own!"), 1024)
	if _, err := ns.WriteAt(data, 1<<20+4096); err != nil {
		t.Fatalf("write to %s on %s: %v", vol, owner, err)
	}
	ctrl.Close()
	if body := procs[owner].metricsText(t); !strings.Contains(body, "blk_volume_writes_total{") {
		t.Fatalf("owner %s shows no store volume:\n%s", owner, body)
	}
	procs[cur].refuse(t, "DELETE", "/v1/volumes/"+vol, "", 409, "connections")
	procs[cur].must(t, "POST", "/v1/volumes/"+vol+"/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
	procs[cur].must(t, "DELETE", "/v1/volumes/"+vol+"/hosts/"+hostNQN, "", 200, nil)
	// With the owner down, a resize updates the registry and answers 502;
	// the owner grows its store volume to the registry's size on restart.
	procs[owner].cmd.Process.Signal(syscall.SIGKILL)
	<-procs[owner].exited
	procs[cur].refuse(t, "POST", "/v1/volumes/"+vol+"/resize", `{"size": "3MiB"}`, 502, "registry is updated.*"+owner)
	start(owner)
	if n := procs[owner].metric(t, "blk_volume_size_bytes"); n != 3<<20 {
		t.Fatalf("owner %s: blk_volume_size_bytes %v after restart, want 3 MiB", owner, n)
	}

	// With the owner down, a delete updates the registry and says the
	// owner did not do its part; the owner finishes locally on restart,
	// and the same delete, repeated, purges the volume.
	procs[owner].cmd.Process.Signal(syscall.SIGKILL)
	<-procs[owner].exited
	// Without force it is refused: nobody can say whether hosts are
	// connected to the volume on its owner.
	procs[cur].refuse(t, "DELETE", "/v1/volumes/"+vol, "", 502, "whether hosts are connected to it is unknown.*force")
	procs[cur].refuse(t, "DELETE", "/v1/volumes/"+vol+"?force=true", "", 502, "is deleting.*"+owner+".*restarts")
	procs[cur].must(t, "GET", "/v1/volumes/"+vol, "", 200, &v)
	if v.State != "deleting" {
		t.Fatalf("%s after a delete with its owner down: %+v", vol, v)
	}
	start(owner)
	// The repeated delete purges it, unless the leader's settle round
	// (every 10 s) already did: then it is unknown.
	if code, body := procs[cur].call(t, "DELETE", "/v1/volumes/"+vol, "", nil); code != 204 && code != 404 {
		t.Fatalf("DELETE %s after its owner restarted: %d %s, want 204 (or 404 if already purged)", vol, code, body)
	}
	procs[cur].refuse(t, "GET", "/v1/volumes/"+vol, "", 404, "unknown volume")
	eventually(t, 30*time.Second, "owner forgets "+vol, func() error {
		if code, _ := procs[owner].call(t, "GET", "/v1/volumes/"+vol, "", nil); code != 404 {
			return fmt.Errorf("GET on %s: %d", owner, code)
		}
		return nil
	})
	// The owner deleted its store volume (it owned no other).
	if body := procs[owner].metricsText(t); strings.Contains(body, "blk_volume_writes_total{") {
		t.Fatalf("owner %s still has a store volume after the delete:\n%s", owner, body)
	}

	// Remove the node that owns no volume; the leader no longer lists it.
	var spare string
	for _, id := range survivors {
		if id != newLeader {
			spare = id
		}
	}
	if cur != spare {
		procs[spare].refuse(t, "POST", "/v1/cluster/remove", `{"node_id": "`+spare+`"}`, 421, "not the registry leader")
		var rm map[string]string
		procs[cur].must(t, "POST", "/v1/cluster/remove", `{"node_id": "`+spare+`"}`, 200, &rm)
		if rm["removed"] != spare || rm["registry"] != "forgotten" {
			t.Fatalf("remove %s: %v", spare, rm)
		}
		var c clusterJSON
		procs[cur].must(t, "GET", "/v1/cluster", "", 200, &c)
		if len(c.Members) != 2 {
			t.Fatalf("after removing %s: %+v", spare, c)
		}
	}
	for _, p := range procs {
		p.stop(t)
	}
}

// cluster is three blkd processes, node1 to node3, each with its own data
// dir and addresses; every node gets the flags in common.
type cluster struct {
	t      *testing.T
	nodes  map[string]*nodeAddrs
	procs  map[string]*daemon
	common []string
}

type nodeAddrs struct{ dir, raft, nvme, api string }

// startCluster starts node1 (bootstrapping) and node2 and node3 joining
// through it, each with common's flags.
func startCluster(t *testing.T, common ...string) *cluster {
	c := &cluster{t: t, nodes: map[string]*nodeAddrs{}, procs: map[string]*daemon{}, common: common}
	for _, id := range []string{"node1", "node2", "node3"} {
		c.nodes[id] = &nodeAddrs{t.TempDir(), freeAddr(t), freeAddr(t), freeAddr(t)}
	}
	c.start("node1")
	c.start("node2", "--join", c.nodes["node1"].api)
	c.start("node3", "--join", c.nodes["node1"].api)
	return c
}

// start (re)starts node id on its data dir and addresses.
func (c *cluster) start(id string, extra ...string) {
	a := c.nodes[id]
	args := append(append([]string{"--node-id", id}, c.common...), extra...)
	c.procs[id] = startBlkdOn(c.t, a.dir, a.raft, a.nvme, a.api, args...)
}

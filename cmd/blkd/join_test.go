package main

import (
	"fmt"
	"testing"

	"github.com/blk-project/blk/pki"
)

// TestJoinOnlyAsItself (issue 21 case 6): with --tls-dir a node
// certificate may register or change only the node it names. With
// another node's certificate, a join naming the leader (new addresses,
// capacity 1) is refused 403 naming both nodes, the leader's registration
// is unchanged and creates still succeed; the same certificate re-sends
// its own node's registration (200). A raft address already a member's is
// 409 naming that member, from a node and from an admin alike, and the
// cluster is unchanged. (Before: 200 and every create then 507; the
// duplicate raft address 500.)
func TestJoinOnlyAsItself(t *testing.T) {
	ca, tlsDir, certs := nodeTLSDir(t, "node1", "node2", "node3")
	c := startCluster(t, "--tls-dir", tlsDir)
	admin := operatorTLS(t, ca, "alice", pki.RoleAdmin)
	for _, p := range c.procs {
		p.useTLS(admin)
	}
	leader := c.settled(nil)
	var other string // a node that is not the leader
	for _, id := range []string{"node1", "node2", "node3"} {
		if id != leader {
			other = id
			break
		}
	}
	registration := func(id string) memberJSON {
		t.Helper()
		var cl clusterJSON
		c.procs[leader].must(t, "GET", "/v1/cluster", "", 200, &cl)
		for _, m := range cl.Members {
			if m.ID == id {
				return m
			}
		}
		t.Fatalf("no member %s in %+v", id, cl.Members)
		return memberJSON{}
	}
	before := registration(leader)

	// As the other node, with its own certificate.
	_, nodeTLS, err := pki.MutualTLS(ca.CertPEM(), certs[other][0], certs[other][1], pki.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	as := &daemon{api: c.nodes[leader].api}
	as.useTLS(nodeTLS)
	as.refuse(t, "POST", "/v1/cluster/join", fmt.Sprintf(`{"node_id": %q, "raft_addr": %q, "api_addr": "127.0.0.1:1", "nvme_addr": "127.0.0.1:2", "capacity_bytes": 1}`,
		leader, before.RaftAddr), 403, "certificate of node "+other+" may not register or change node "+leader)
	if after := registration(leader); after != before {
		t.Fatalf("%s's registration changed by %s's certificate: %+v, was %+v", leader, other, after, before)
	}
	c.procs[leader].must(t, "POST", "/v1/volumes", `{"name": "still", "size": "8MiB"}`, 201, nil)

	// Its own registration, re-sent as it is: accepted.
	own := registration(other)
	var jr struct {
		Voter bool `json:"voter"`
	}
	as.must(t, "POST", "/v1/cluster/join", fmt.Sprintf(`{"node_id": %q, "raft_addr": %q, "api_addr": %q, "nvme_addr": %q}`,
		other, own.RaftAddr, own.APIAddr, own.NVMeAddr), 200, &jr)
	if !jr.Voter || registration(other) != own {
		t.Fatalf("%s re-sending its registration: voter %v, now %+v, was %+v", other, jr.Voter, registration(other), own)
	}

	// A raft address in use by another member: 409 naming it.
	as.refuse(t, "POST", "/v1/cluster/join", fmt.Sprintf(`{"node_id": %q, "raft_addr": %q}`, other, before.RaftAddr),
		409, "raft address "+before.RaftAddr+" is member "+leader+"'s")
	c.procs[leader].refuse(t, "POST", "/v1/cluster/join", fmt.Sprintf(`{"node_id": "node4", "raft_addr": %q}`, before.RaftAddr),
		409, "raft address "+before.RaftAddr+" is member "+leader+"'s")
	var cl clusterJSON
	c.procs[leader].must(t, "GET", "/v1/cluster", "", 200, &cl)
	if len(cl.Members) != 3 || registration(leader) != before || registration(other) != own {
		t.Fatalf("the cluster changed: %+v", cl.Members)
	}
}

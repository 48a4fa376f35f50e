package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/pki"
)

const (
	regHostA = "nqn.2014-08.org.nvmexpress:uuid:0b6c3a52-0000-4000-8000-00000000000a"
	regHostB = "nqn.2014-08.org.nvmexpress:uuid:0b6c3a52-0000-4000-8000-00000000000b"
)

// TestHostRegistry (docs/operations.md §1.9): POST /v1/hosts registers a
// host (201), again updates its name and zone and keeps its time (200);
// GET lists and reads one; an unknown host is 404 naming it (not "no
// route"); bad fields are 400 naming them; DELETE forgets it.
func TestHostRegistry(t *testing.T) {
	d := startBlkd(t, t.TempDir())
	var l api.HostList
	d.must(t, "GET", "/v1/hosts", "", 200, &l)
	if l.Hosts == nil || len(l.Hosts) != 0 {
		t.Fatalf("empty registry: %+v, want hosts: []", l)
	}
	d.refuse(t, "GET", "/v1/hosts/"+regHostA, "", 404, `^host `+regexp.QuoteMeta(regHostA)+` is not registered: .*blkctl host list`)
	for body, re := range map[string]string{
		`{"name": "w"}`:                                                                     `missing "host_nqn"`,
		`{"host_nqn": "nqn.2014-13.org.x:a"}`:                                               `host_nqn "nqn.2014-13.org.x:a" is not a valid NQN`,
		`{"host_nqn": "` + regHostA + `", "name": "a b"}`:                                   `host name "a b"`,
		`{"host_nqn": "` + regHostA + `", "zone": "-z"}`:                                    `zone "-z"`,
		`{"host_nqn": "` + regHostA + `", "secret": "x"}`:                                   `unknown field "secret"`,
		`{"host_nqn": "` + regHostA + `", "name": ` + `"` + strings.Repeat("n", 129) + `"}`: `host name`,
	} {
		d.refuse(t, "POST", "/v1/hosts", body, 400, re)
	}
	var h1, h2 api.Host
	d.must(t, "POST", "/v1/hosts", `{"host_nqn": "`+regHostA+`", "name": "worker-1", "zone": "zone-a"}`, 201, &h1)
	if h1.HostNQN != regHostA || h1.Name != "worker-1" || h1.Zone != "zone-a" || time.Since(h1.RegisteredAt) > time.Minute {
		t.Fatalf("registered: %+v", h1)
	}
	d.must(t, "POST", "/v1/hosts", `{"host_nqn": "`+regHostA+`", "name": "worker-1b"}`, 200, &h2)
	if h2.Name != "worker-1b" || h2.Zone != "" || !h2.RegisteredAt.Equal(h1.RegisteredAt) {
		t.Fatalf("registered again: %+v, want the new name, no zone, the first time %v", h2, h1.RegisteredAt)
	}
	d.must(t, "POST", "/v1/hosts", `{"host_nqn": "`+regHostB+`"}`, 201, nil)
	var got api.Host
	d.must(t, "GET", "/v1/hosts/"+regHostA, "", 200, &got)
	if got != h2 {
		t.Fatalf("GET one: %+v, want %+v", got, h2)
	}
	d.must(t, "GET", "/v1/hosts", "", 200, &l)
	if len(l.Hosts) != 2 || l.Hosts[0].HostNQN != regHostA || l.Hosts[1].HostNQN != regHostB {
		t.Fatalf("list: %+v", l)
	}
	d.refuse(t, "GET", "/v1/hosts/not-an-nqn", "", 400, `host NQN "not-an-nqn" in the path`)
	d.refuse(t, "PUT", "/v1/hosts", "", 405, `use GET, POST`)
	d.refuse(t, "POST", "/v1/hosts/"+regHostA, "", 405, `use GET, DELETE`)
	d.must(t, "DELETE", "/v1/hosts/"+regHostA, "", 200, &h1)
	if h1.Name != "worker-1b" {
		t.Fatalf("DELETE answered %+v, want the host forgotten", h1)
	}
	d.refuse(t, "DELETE", "/v1/hosts/"+regHostA, "", 404, `is not registered`)
	d.refuse(t, "GET", "/v1/hosts/"+regHostA, "", 404, `is not registered`)
	// The change is audited with the host's NQN, name and zone.
	if !regexp.MustCompile(`msg="api call received" .*method=POST path=/v1/hosts .*body.name=worker-1 body.host_nqn=` + regexp.QuoteMeta(regHostA) + ` .*body.zone=zone-a`).MatchString(d.output()) {
		t.Errorf("registration not audited:\n%s", d.output())
	}
}

// TestHostRole: under TLS a host certificate (the CSI node plugin's) may
// register a host and read one by NQN, and nothing else, each refusal a
// 403 naming it and logged with its err; a reader may not read the host
// registry; an admin reads and deletes.
func TestHostRole(t *testing.T) {
	ca, tlsDir, _ := nodeTLSDir(t, "node1")
	d := startBlkd(t, t.TempDir(), "--tls-dir", tlsDir)
	d.useTLS(operatorTLS(t, ca, "csi", pki.RoleHost))
	d.must(t, "POST", "/v1/hosts", `{"host_nqn": "`+regHostA+`", "name": "worker-1"}`, 201, nil)
	d.must(t, "POST", "/v1/hosts", `{"host_nqn": "`+regHostA+`", "name": "worker-1"}`, 200, nil)
	var h api.Host
	d.must(t, "GET", "/v1/hosts/"+regHostA, "", 200, &h)
	if h.Name != "worker-1" {
		t.Fatalf("host reads %+v", h)
	}
	d.refuse(t, "GET", "/v1/hosts/"+regHostB, "", 404, `is not registered`)
	for _, c := range [][3]string{
		{"GET", "/v1/hosts", ""},
		{"DELETE", "/v1/hosts/" + regHostA, ""},
		{"GET", "/v1/volumes", ""},
		{"POST", "/v1/volumes", `{"name": "v", "size": "8MiB"}`},
		{"POST", "/v1/volumes/v/hosts", `{"host_nqn": "` + regHostA + `"}`},
	} {
		d.refuse(t, c[0], c[1], c[2], 403, `^host:csi may not `+c[0]+` `+regexp.QuoteMeta(c[1])+`: that needs `)
	}
	if !regexp.MustCompile(`msg="api call refused" .*who=host:csi method=DELETE path=/v1/hosts/\S+ err="host:csi may not DELETE`).MatchString(d.output()) {
		t.Errorf("the role refusal is not logged with its err:\n%s", d.output())
	}
	d.useTLS(operatorTLS(t, ca, "bob", pki.RoleReader))
	d.refuse(t, "GET", "/v1/hosts", "", 403, `reader:bob may not GET /v1/hosts: that needs an admin certificate`)
	d.refuse(t, "GET", "/v1/hosts/"+regHostA, "", 403, `reader:bob may not GET`)
	d.useTLS(operatorTLS(t, ca, "alice", pki.RoleAdmin))
	var l api.HostList
	d.must(t, "GET", "/v1/hosts", "", 200, &l)
	if len(l.Hosts) != 1 || l.Hosts[0].Name != "worker-1" {
		t.Fatalf("admin's list: %+v", l)
	}
	d.must(t, "DELETE", "/v1/hosts/"+regHostA, "", 200, nil)
}

// clusterWithOlderNode3 builds a blkd with package blkd's link-time
// switch without (withoutHosts, withoutReservations…) set, as an older
// blkd would run, and starts three nodes: node1 and node2 this blkd,
// node3 the older one. It returns the cluster and the nodes' NVMe/TCP
// addresses; node3 stopped and started again runs this blkd.
func clusterWithOlderNode3(t *testing.T, without string) (*cluster, map[string]string) {
	t.Helper()
	old := filepath.Join(t.TempDir(), "blkd-old")
	build := exec.Command("go", "build", "-o", old, "-ldflags", "-X github.com/blk-project/blk/cmd/blkd/internal/blkd."+without+"=1", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the older blkd: %v\n%s", err, out)
	}
	c, _, tcp := newTCPCluster(t)
	c.start("node1", "--tcp-addr", tcp["node1"])
	c.start("node2", "--tcp-addr", tcp["node2"], "--join", c.nodes["node1"].api)
	newer := binary
	binary = old
	c.start("node3", "--tcp-addr", tcp["node3"], "--join", c.nodes["node1"].api)
	binary = newer
	return c, tcp
}

// TestHostsUpgradeGate: node3 runs a blkd that registers without the
// hosts feature (built with withoutHosts, as an older one would): a
// registration is refused, 409 naming node3, and nothing is registered;
// node3 restarted with this blkd, it is served.
func TestHostsUpgradeGate(t *testing.T) {
	c, tcp := clusterWithOlderNode3(t, "withoutHosts")
	lp := c.procs[c.settled(nil)]
	body := `{"host_nqn": "` + regHostA + `", "name": "worker-1"}`
	lp.refuse(t, "POST", "/v1/hosts", body, 409, `node node3 did not register feature "hosts".*upgrade every node`)
	var l api.HostList
	lp.must(t, "GET", "/v1/hosts", "", 200, &l)
	if len(l.Hosts) != 0 {
		t.Fatalf("registered while node3 lacks the feature: %+v", l)
	}

	c.procs["node3"].stop(t)
	c.start("node3", "--tcp-addr", tcp["node3"])
	eventually(t, 30*time.Second, "a registration once node3 has the feature", func() error {
		lp := c.procs[c.settled(nil)]
		if code, msg := lp.call(t, "POST", "/v1/hosts", body, nil); code != 201 {
			return fmt.Errorf("%d %s", code, msg)
		}
		return nil
	})
}

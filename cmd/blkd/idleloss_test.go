package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestIdleReplicaLost: a secondary's blkd killed while the host writes
// nothing is reported out of sync by the primary within seconds, from
// its lost connection alone (no write failed on it, and the replica
// connection does not reconnect to the node's next run by itself);
// restarted, it is rebuilt by a compare (its process died) and is in
// sync again.
func TestIdleReplicaLost(t *testing.T) {
	c, ids, leader := startZoned(t, 3)
	var v replicatedJSON
	a := pinnedVolume(t, c, ids, leader, "idle", "16MiB", &v)
	ctrl, ns := connect(t, a.over("tcp"))
	defer ctrl.Close()
	if _, err := ns.WriteAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	primary := v.Node
	victim := ""
	for _, id := range ids {
		if id != primary && id != leader {
			victim = id
		}
	}
	if victim == "" { // the primary's node does not lead: the other two are candidates
		for _, id := range ids {
			if id != primary {
				victim = id
			}
		}
	}
	pp := c.procs[primary]
	c.procs[victim].cmd.Process.Signal(syscall.SIGKILL)
	<-c.procs[victim].exited
	delete(c.procs, victim)
	killed := time.Now()
	eventually(t, 20*time.Second, victim+" out of sync with no write", func() error {
		v = replicatedJSON{}
		pp.must(t, "GET", "/v1/volumes/idle", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "out-of-sync" && strings.Contains(r.Reason, "connection was lost") {
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	t.Logf("%s out of sync %v after the kill, no write issued", victim, time.Since(killed).Round(time.Millisecond))
	c.start(victim, "--zone", zoneOf(victim))
	eventually(t, 60*time.Second, victim+" rebuilt", func() error {
		v = replicatedJSON{}
		pp.must(t, "GET", "/v1/volumes/idle", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "in-sync" {
				if !strings.Contains(r.Reason, "compare") {
					return fmt.Errorf("rebuilt as %q, want a compare", r.Reason)
				}
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
}

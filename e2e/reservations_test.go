//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// resvReport is what nvme-cli's resv-report --eds -o json prints: the
// Reservation Status data structure with the 128-bit host identifiers.
type resvReport struct {
	Gen    uint64 `json:"gen"`
	RType  int    `json:"rtype"`
	RegCtl int    `json:"regctl"`
	PTPLS  int    `json:"ptpls"`
	Regs   []struct {
		CntlID int    `json:"cntlid"`
		RCSTS  int    `json:"rcsts"`
		HostID string `json:"hostid"`
		// Host ID is the key of nvme-cli releases after 2.4.
		HostIDNew string `json:"Host ID"`
		RKey      uint64 `json:"rkey"`
	} `json:"regctlext"`
}

// TestKernelReservations is the reservations scenario of issue 25: two
// Linux hosts (two guests, nvme-tcp with native multipath, distinct host
// IDs) share a 3-replica volume of a 3-node blkd cluster. Through
// nvme-cli both register a key, the first acquires Write Exclusive and
// writes; the second's write gets Reservation Conflict while its read
// returns the holder's data; both hosts' reports agree. The primary's
// blkd is then killed (a failover to another replica) and later the
// whole cluster is killed and started again: after each, both reports
// are the same as before and the second host's write is still refused.
// Finally the second host preempts and aborts the first: its write
// lands, the first's is refused, and the first's registration is gone.
func TestKernelReservations(t *testing.T) {
	s := newScenario(t)
	port := ports(25100)
	nodes, order, leader := s.startCluster(port)
	// The primary is not the registry's leader, so that killing it
	// needs no election before the failover.
	pin := "node2"
	if leader == pin {
		pin = "node3"
	}
	hosts := map[string]string{
		"resv1": "e2e0a001-0000-4000-8000-000000000001",
		"resv2": "e2e0a002-0000-4000-8000-000000000002",
	}
	var v replicatedVolume
	s.blkctl(nodes[leader].api, &v, "volume", "create", "rvol", "--size", "64MiB", "--replicas", "3", "--node", pin)
	for _, id := range hosts {
		s.blkctl(nodes[leader].api, nil, "host", "allow", "rvol", "nqn.2014-08.org.nvmexpress:uuid:"+id)
	}
	s.blkctl(nodes[leader].api, &v, "volume", "show", "rvol")
	ports := []string{}
	for _, id := range order {
		ports = append(ports, strconv.Itoa(nodes[id].tcpPort))
	}
	s.setEnv("DISC", strconv.Itoa(nodes[pin].tcpPort), "PORTS", strings.Join(ports, " "), "NQN", v.NQN,
		"HOSTID_resv1", hosts["resv1"], "HOSTID_resv2", hosts["resv2"])
	s.script("reservations.sh")
	g1 := s.boot(vmConfig{name: "resv1", script: "reservations.sh", timeout: 14 * time.Minute})
	g2 := s.boot(vmConfig{name: "resv2", script: "reservations.sh", timeout: 14 * time.Minute})

	// report reads both guests' reports of a step and checks they agree
	// with each other and with what the step expects.
	report := func(step string, holder string, regs ...string) resvReport {
		var first resvReport
		for i, g := range []string{"resv1", "resv2"} {
			var r resvReport
			s.decode(fmt.Sprintf("report-%s-%s.json", g, step), &r)
			if i == 0 {
				first = r
			} else if fmt.Sprint(r) != fmt.Sprint(first) {
				t.Errorf("%s: the hosts' reports differ:\nresv1 %+v\nresv2 %+v", step, first, r)
			}
		}
		if first.RegCtl != len(regs) || len(first.Regs) != len(regs) {
			t.Fatalf("%s: report %+v, want registrants %v", step, first, regs)
		}
		for i, g := range regs {
			r := first.Regs[i]
			want := strings.ReplaceAll(hosts[g], "-", "")
			if r.HostID == "" {
				r.HostID = r.HostIDNew
			}
			if strings.ReplaceAll(r.HostID, "-", "") != want {
				t.Errorf("%s: registrant %d is %s, want %s's %s", step, i, r.HostID, g, want)
			}
			held := r.RCSTS&1 == 1
			if held != (g == holder) {
				t.Errorf("%s: registrant %s rcsts %d, holder should be %s", step, g, r.RCSTS, holder)
			}
		}
		if holder != "" && first.RType != 1 {
			t.Errorf("%s: reservation type %d, want 1 (Write Exclusive)", step, first.RType)
		}
		if first.PTPLS != 1 {
			t.Errorf("%s: PTPLS %d, want 1 (both registered with CPTPL 11b)", step, first.PTPLS)
		}
		t.Logf("%s: generation %d, type %d, registrants %v, holder %s", step, first.Gen, first.RType, regs, holder)
		return first
	}

	waitBoth := func(mark string, timeout time.Duration) {
		s.waitMark(mark+"-resv1", g1, timeout)
		s.waitMark(mark+"-resv2", g2, timeout)
	}
	waitBoth("checked-1", 8*time.Minute)
	r1 := report("1", "resv1", "resv1", "resv2")
	var shown struct {
		Reservation *struct {
			Gen uint64 `json:"gen"`
		} `json:"reservation"`
	}
	s.blkctl(nodes[leader].api, &shown, "volume", "show", "rvol")
	if shown.Reservation == nil || shown.Reservation.Gen != r1.Gen {
		t.Errorf("volume show's reservation %+v, want generation %d as the hosts report", shown.Reservation, r1.Gen)
	}

	// A failover: the primary's blkd killed, another in-sync replica made
	// primary; the reservation is the registry's, not the node's.
	nodes[pin].d.kill()
	killed := time.Now()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var rv replicatedVolume
		if err := s.blkctlErr(nodes[leader].api, &rv, "volume", "show", "rvol"); err == nil && rv.Epoch >= 2 && rv.Node != pin {
			t.Logf("failover: %s primary at epoch %d %v after the kill", rv.Node, rv.Epoch, time.Since(killed).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover from %s within 60 s", pin)
		}
	}
	nodes[pin].d.start()
	s.mark("switched")
	waitBoth("checked-2", 5*time.Minute)
	if r2 := report("2", "resv1", "resv1", "resv2"); r2.Gen != r1.Gen {
		t.Errorf("generation %d after the failover, was %d", r2.Gen, r1.Gen)
	}

	// The whole cluster killed at once and started again together.
	for _, id := range order {
		nodes[id].d.kill()
	}
	ready := make([]<-chan struct{}, len(order))
	for i, id := range order {
		ready[i] = nodes[id].d.launch()
	}
	for i, id := range order {
		nodes[id].d.waitReady(ready[i])
	}
	t.Logf("whole cluster killed with SIGKILL and started again")
	s.mark("restarted")
	waitBoth("checked-3", 5*time.Minute)
	if r3 := report("3", "resv1", "resv1", "resv2"); r3.Gen != r1.Gen {
		t.Errorf("generation %d after the whole cluster's restart, was %d", r3.Gen, r1.Gen)
	}

	// The second host preempted and aborted the first.
	waitBoth("checked-4", 5*time.Minute)
	if r4 := report("4", "resv2", "resv2"); r4.Gen <= r1.Gen {
		t.Errorf("generation %d after the preempt, want above %d", r4.Gen, r1.Gen)
	}
	s.wait(g1)
	s.wait(g2)
	var after struct {
		Reservation json.RawMessage `json:"reservation"`
	}
	s.blkctl(nodes[order[0]].api, &after, "volume", "show", "rvol")
	t.Logf("the registry's reservation at the end: %s", after.Reservation)
}

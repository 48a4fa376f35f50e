package main

import (
	"context"
	"encoding/json"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
)

// waitOutput waits up to 10 s for d's output to match re.
func (d *daemon) waitOutput(t *testing.T, re string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(10 * time.Second)
	for !rx.MatchString(d.output()) {
		if time.Now().After(deadline) {
			t.Fatalf("blkd output does not match %s within 10 s:\n%s", re, d.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jsonEvents returns the JSON event log records in d's output with
// message msg.
func (d *daemon) jsonEvents(msg string) []map[string]any {
	var out []map[string]any
	for l := range strings.SplitSeq(d.output(), "\n") {
		var m map[string]any
		if strings.HasPrefix(l, "{") && json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestEventLogText: a host's controller shows in blkd's stderr as a
// "controller created" line (the default text format), and its end as
// "controller destroyed".
func TestEventLogText(t *testing.T) {
	d := startBlkd(t, t.TempDir())
	v, a := attachNew(t, d, "ev", "1MiB")
	ctrl, _ := connect(t, a)
	d.waitOutput(t, `level=INFO msg="controller created" node=node1 kind=nvm cntlid=\d+ subsystem=`+regexp.QuoteMeta(v.NQN)+` host_nqn=`+regexp.QuoteMeta(hostNQN))
	ctrl.Close()
	d.waitOutput(t, `level=INFO msg="controller destroyed" .*host_nqn=`+regexp.QuoteMeta(hostNQN)+` .*reason=disconnect`)
	if strings.Contains(d.output(), `msg="connection accepted"`) {
		t.Errorf("debug events at the default level:\n%s", d.output())
	}
}

// TestEventLogJSON: with --log-format json, refused Connects and the
// controller's life are JSON records with their attributes; a flood of
// refusals is cut short and counted.
func TestEventLogJSON(t *testing.T) {
	d := startBlkd(t, t.TempDir(), "--log-format", "json", "--log-level", "debug")
	v, a := attachNew(t, d, "ev", "1MiB")
	// Over the NVMe/TCP port, the preferred endpoint: it logs its
	// connections as events, as the RDMA port does.
	a = a.over("tcp")

	// A host not on the volume's list hammers Connect.
	const bad = "nqn.2026-11.io.blk:not-allowed"
	addr := net.JoinHostPort(a.Address, strconv.Itoa(a.Port))
	cfg := hostConfig(t, a, bad)
	for range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := initiator.Connect(ctx, cfg, addr, v.NQN)
		cancel()
		if err == nil {
			t.Fatal("a host not allowed connected")
		}
	}
	d.waitOutput(t, `"msg":"connect refused"`)
	refused := d.jsonEvents("connect refused")
	if len(refused) != 20 {
		t.Errorf("%d connect refused records for 30 attempts, want the first 20", len(refused))
	}
	if r := refused[0]; r["level"] != "WARN" || r["host_nqn"] != bad || r["subsystem"] != v.NQN || r["reason"] != "host not allowed on the subsystem" || r["node"] != "node1" {
		t.Errorf("connect refused record %v", r)
	}

	ctrl, _ := connect(t, a)
	d.waitOutput(t, `"msg":"controller created"`)
	c := d.jsonEvents("controller created")[0]
	if c["level"] != "INFO" || c["host_nqn"] != hostNQN || c["subsystem"] != v.NQN || c["kind"] != "nvm" || c["remote_addr"] == "" || c["cntlid"] == nil {
		t.Errorf("controller created record %v", c)
	}
	d.waitOutput(t, `"msg":"connection accepted"`) // debug level
	ctrl.Close()
	d.waitOutput(t, `"msg":"controller destroyed"`)
	d.waitOutput(t, `"msg":"connection closed"`)

	// The held-back refusals are counted when blkd stops, at the latest.
	d.stop(t)
	var sum []map[string]any
	for _, r := range d.jsonEvents("suppressed similar events") {
		if r["event"] == "connect refused" {
			sum = append(sum, r)
		}
	}
	if len(sum) != 1 || sum[0]["suppressed"] != float64(10) || sum[0]["level"] != "WARN" {
		t.Fatalf("connect refused summaries %v, want one counting 10", sum)
	}
	// The admin queue of the I/O controller is logged at INFO, whatever
	// the flood of refused hosts' connections at DEBUG.
	var adminClosed bool
	for _, r := range d.jsonEvents("connection closed") {
		adminClosed = adminClosed || r["level"] == "INFO" && r["qid"] == float64(0) && r["cntlid"] == c["cntlid"]
	}
	if !adminClosed {
		t.Errorf("no INFO connection closed record for the admin queue of controller %v", c["cntlid"])
	}
}

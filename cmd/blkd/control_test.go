package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/logline"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/pki"
	"github.com/blk-project/blk/store"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
)

// TestHugeResizeRefused: `resize --size 4194305TiB` wrote 4 EiB into the
// registry, failed in the store, and blkd then refused to start. Now the
// size is checked against the store before the registry changes: 400, the
// volume unchanged, and the node restarts serving it.
func TestHugeResizeRefused(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	var v volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "rv", "size": "16MiB"}`, 201, &v)
	d.refuse(t, "POST", "/v1/volumes/rv/resize", `{"size": "4194305TiB"}`, 400, `more than the largest volume the store holds`)
	d.refuse(t, "POST", "/v1/volumes", `{"name": "big", "size": "4194305TiB"}`, 400, `more than the largest volume the store holds`)
	d.must(t, "GET", "/v1/volumes/rv", "", 200, &v)
	if v.SizeBytes != 16<<20 || v.State != "online" {
		t.Fatalf("after a refused resize: %+v, want 16 MiB online", v)
	}
	d.stop(t)
	d = startBlkd(t, dir)
	d.must(t, "GET", "/v1/volumes/rv", "", 200, &v)
	if v.State != "online" {
		t.Fatalf("after restart: %+v", v)
	}
}

// TestMissingVolumeFailsAlone: a volume whose data is gone from the store
// (here deleted behind blkd's back with the store's own API) used to stop
// the whole node at start. Now the node starts, says which volume failed
// and why, marks it failed in the registry, and serves the others; the
// failed volume can be deleted.
func TestMissingVolumeFailsAlone(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	var lost, kept volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "lost", "size": "8MiB"}`, 201, &lost)
	d.must(t, "POST", "/v1/volumes", `{"name": "kept", "size": "8MiB"}`, 201, &kept)
	d.stop(t)

	s, err := store.Open(store.Config{Dir: filepath.Join(dir, "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(store.ID(lost.ID)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	d = startBlkd(t, dir)
	if l, ok := logline.Find(d.output(), "volume failed", "volume", "lost"); !ok || !strings.Contains(l, `reason="the store has no volume`) {
		t.Errorf("start output does not name the failed volume:\n%s", d.output())
	}
	var v volumeJSON
	d.must(t, "GET", "/v1/volumes/lost", "", 200, &v)
	if v.State != "failed" || !strings.Contains(v.Reason, "the store has no volume") {
		t.Fatalf("lost: %+v, want failed with the reason", v)
	}
	d.must(t, "GET", "/v1/volumes/kept", "", 200, &v)
	if v.State != "online" {
		t.Fatalf("kept: %+v, want online", v)
	}
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/kept/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	d.must(t, "POST", "/v1/volumes/kept/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	ctrl, ns := connect(t, a)
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = byte(i)
	}
	if _, err := ns.WriteAt(buf, 0); err != nil {
		t.Fatalf("write to the kept volume: %v", err)
	}
	ctrl.Close()
	d.must(t, "DELETE", "/v1/volumes/lost", "", 204, nil)
	d.refuse(t, "GET", "/v1/volumes/lost", "", 404, "unknown volume")
}

// TestOperatorErrors: the answers the issue found wrong, each with the
// status that names the problem: a second blkd on a data dir in use
// (it blamed --raft-addr), deleting a host the volume never allowed (200),
// removing an unknown node (200, blkctl exit 0), a wrong method (404).
func TestOperatorErrors(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	out, code := runBlkd(t, "--data-dir", dir, "--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t), "--api-addr", freeAddr(t))
	if code == 0 || !strings.Contains(out, "is in use by another blkd (pid") {
		t.Errorf("second blkd on the same data dir: exit %d, output:\n%s\nwant a non-zero exit naming the data dir in use", code, out)
	}
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "8MiB"}`, 201, nil)
	d.refuse(t, "DELETE", "/v1/volumes/v/hosts/"+hostNQN, "", 404, `does not allow host`)
	d.refuse(t, "POST", "/v1/cluster/remove", `{"node_id": "nobody"}`, 404, `no node "nobody"`)
	d.refuse(t, "PUT", "/v1/volumes", `{}`, 405, `use GET, POST`)
	d.refuse(t, "GET", "/v1/volumes/v/resize", "", 405, `use POST`)
	d.refuse(t, "GET", "/v1/nothing", "", 404, `no route`)
}

// TestJoinFromAnotherCluster: a node started alone (its own registry, a
// volume created), then restarted with --join to another cluster, said
// "joined", became a voter, and the two registries disagreed forever. Now
// the data directory's cluster ID is checked and the join refused, saying
// what to do; the cluster is unchanged.
func TestJoinFromAnotherCluster(t *testing.T) {
	a := startBlkd(t, t.TempDir(), "--node-id", "a1")
	a.must(t, "POST", "/v1/volumes", `{"name": "va", "size": "8MiB"}`, 201, nil)
	bdir := t.TempDir()
	b := startBlkd(t, bdir, "--node-id", "b1")
	b.must(t, "POST", "/v1/volumes", `{"name": "vb", "size": "8MiB"}`, 201, nil)
	b.stop(t)
	out, code := runBlkd(t, "--data-dir", bdir, "--node-id", "b1", "--join", a.api,
		"--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t), "--api-addr", freeAddr(t))
	if code == 0 || !strings.Contains(out, "belongs to cluster") || strings.Contains(out, "joined the cluster") {
		t.Fatalf("join with another cluster's data dir: exit %d:\n%s\nwant a refusal naming the other cluster", code, out)
	}
	var c struct {
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
	}
	a.must(t, "GET", "/v1/cluster", "", 200, &c)
	if len(c.Members) != 1 || c.Members[0].ID != "a1" {
		t.Fatalf("members after a refused join: %+v, want a1 alone", c.Members)
	}
}

// TestJoinDeadAddress: POST /v1/cluster/join naming a raft address where
// nothing listens made a one-node cluster lose its quorum for good. Now
// the leader refuses an address that does not answer (502, cluster
// unchanged), and a new member joins as a nonvoter, so even a live
// address that never speaks raft cannot take the quorum; it can be
// removed again.
func TestJoinDeadAddress(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir, "--node-id", "n1")
	dead := freeAddr(t)
	d.refuse(t, "POST", "/v1/cluster/join", `{"node_id": "ghost", "raft_addr": "`+dead+`"}`, 502, `nothing answers on its raft address`)
	d.must(t, "POST", "/v1/volumes", `{"name": "v1", "size": "8MiB"}`, 201, nil)

	// Something answers, but it is no raft node (the API port).
	var j struct {
		Voter bool `json:"voter"`
	}
	d.must(t, "POST", "/v1/cluster/join", `{"node_id": "mute", "raft_addr": "`+d.api+`"}`, 200, &j)
	if j.Voter {
		t.Fatal("a new member votes at once; want nonvoter until it catches up")
	}
	d.must(t, "POST", "/v1/volumes", `{"name": "v2", "size": "8MiB"}`, 201, nil)
	d.must(t, "POST", "/v1/cluster/remove", `{"node_id": "mute"}`, 200, nil)
	d.stop(t)
	d = startBlkd(t, dir, "--node-id", "n1")
	d.must(t, "POST", "/v1/volumes", `{"name": "v3", "size": "8MiB"}`, 201, nil)
}

// TestDeadNodeShowsDown: a dead node stayed "up" forever and its volumes
// "online". Now the leader's probes mark it down within downAfter plus a
// probe (about 8 s; the test allows 20), its volume shows unavailable with
// the reason, attaching through it is refused, and when it is back it is
// up and its volume online again.
func TestDeadNodeShowsDown(t *testing.T) {
	t.Parallel() // mostly waits for settle rounds and probes
	c := startCluster(t)
	nodes, procs, start := c.nodes, c.procs, c.start
	procs["node1"].must(t, "POST", "/v1/volumes", `{"name": "v1", "size": "8MiB", "node": "node1", "replicas": 1}`, 201, nil)
	procs["node1"].must(t, "POST", "/v1/volumes/v1/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	// node1 leads and owns v1. Kill it: a new leader must find it down.
	var other *daemon
	view := func() (clusterJSON, error) {
		for _, id := range []string{"node2", "node3"} {
			var c clusterJSON
			if code, msg := procs[id].call(t, "GET", "/v1/cluster", "", &c); code != 200 {
				return c, fmt.Errorf("%s: %d %s", id, code, msg)
			}
			if c.LeaderID != "" && c.LeaderID != "node1" {
				other = procs[c.LeaderID]
				return c, nil
			}
		}
		return clusterJSON{}, fmt.Errorf("no new leader yet")
	}
	stateOf := func(c clusterJSON, id string) string {
		for _, m := range c.Members {
			if m.ID == id {
				return m.State
			}
		}
		return "absent"
	}
	eventually(t, 30*time.Second, "three voters up", func() error {
		var c clusterJSON
		procs["node1"].must(t, "GET", "/v1/cluster", "", 200, &c)
		up := 0
		for _, m := range c.Members {
			if m.State == "up" && m.Suffrage == "voter" {
				up++
			}
		}
		if up != 3 {
			return fmt.Errorf("%+v", c.Members)
		}
		return nil
	})
	// waitNode1 waits until the new leader shows node1 in state want.
	waitNode1 := func(want string) {
		t.Helper()
		eventually(t, 25*time.Second, "node1 "+want, func() error {
			c, err := view()
			if err != nil {
				return err
			}
			if s := stateOf(c, "node1"); s != want {
				return fmt.Errorf("node1 is %s", s)
			}
			return nil
		})
	}
	killed := time.Now()
	procs["node1"].cmd.Process.Signal(syscall.SIGKILL)
	<-procs["node1"].exited
	waitNode1("down")
	t.Logf("node1 shown down %v after SIGKILL (with a leader election)", time.Since(killed).Round(100*time.Millisecond))
	var v volumeJSON
	other.must(t, "GET", "/v1/volumes/v1", "", 200, &v)
	if v.State != "unavailable" || !strings.Contains(v.Reason, "node1 is down") {
		t.Fatalf("v1 with its node down: %+v, want unavailable naming node1", v)
	}
	other.refuse(t, "POST", "/v1/volumes/v1/attach", `{"host_nqn": "`+hostNQN+`"}`, 409, `node1.*down`)

	start("node1", "--join", nodes["node2"].api)
	waitNode1("up")
	other.must(t, "GET", "/v1/volumes/v1", "", 200, &v)
	if v.State != "online" {
		t.Fatalf("v1 with its node back: %+v", v)
	}
}

// TestDeleteRefusedWhileConnected: a plain delete destroyed a volume that a
// host connected to without `attach` was writing. Now the owner's live
// controllers count: the delete is refused naming the host, and a forced
// delete goes ahead (dropping the host).
func TestDeleteRefusedWhileConnected(t *testing.T) {
	d := startBlkd(t, t.TempDir())
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "8MiB"}`, 201, nil)
	d.must(t, "POST", "/v1/volumes/v/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/v/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	var listed volumeJSON
	d.must(t, "GET", "/v1/volumes/v", "", 200, &listed)
	if len(listed.Attachments) != 1 || listed.Attachments[0].HostNQN != hostNQN {
		t.Fatalf("attachments of v: %+v, want %s", listed.Attachments, hostNQN)
	}
	// Forget the attachment: the host stays connected, as a kernel host
	// that ran `nvme connect` without blkctl would be.
	d.must(t, "POST", "/v1/volumes/v/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
	ctrl, ns := connect(t, a)
	defer ctrl.Close()
	if _, err := ns.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	d.refuse(t, "DELETE", "/v1/volumes/v", "", 409, `hosts connected to it now: `+hostNQN)
	var v volumeJSON
	d.must(t, "GET", "/v1/volumes/v", "", 200, &v)
	if v.State != "online" {
		t.Fatalf("after a refused delete: %+v", v)
	}
	d.must(t, "DELETE", "/v1/volumes/v?force=true", "", 204, nil)
	d.refuse(t, "GET", "/v1/volumes/v", "", 404, "unknown volume")
}

// TestMetricsNameVolumes: volumes were labelled only by ID; now every
// per-volume series is labelled volume with its name, and
// blk_volume_info{volume, id, nqn} gives its store ID and NQN; the build,
// Go runtime, process and pebble health series are there.
func TestMetricsNameVolumes(t *testing.T) {
	d := startBlkd(t, t.TempDir())
	var v volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "named", "size": "8MiB"}`, 201, &v)
	body := d.metricsText(t)
	for _, want := range []string{
		fmt.Sprintf(`blk_volume_info{id="%d",nqn="%s",volume="named"} 1`, v.ID, v.NQN),
		`blk_volume_size_bytes{volume="named"} 8.388608e+06`,
		"blk_build_info{", "go_goroutines ", "process_resident_memory_bytes ",
		"blk_volume_store_l0_files ", "blk_volume_store_compaction_debt_bytes ", "blk_volume_store_write_stalls_total ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "blk_volume_allocated_bytes") {
		t.Error("/metrics still walks keys for blk_volume_allocated_bytes")
	}
}

// TestThinVolumesBounded: a 4 EiB volume on an 80 GB disk was accepted.
// Now a node promises at most its disk times --overcommit (default 1):
// 507 naming the capacity, nothing registered; with --overcommit 3 a
// volume of twice the disk is accepted.
func TestThinVolumesBounded(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	fs := d.metric(t, "blk_volume_store_fs_bytes")
	if fs <= 0 {
		t.Fatalf("blk_volume_store_fs_bytes %v", fs)
	}
	// 4 PiB: the largest volume the store holds, far more than the disk.
	d.refuse(t, "POST", "/v1/volumes", `{"name": "huge", "size": "4PiB"}`, 507, `may be promised.*overcommit`)
	twice := uint64(2*fs) / 4096 * 4096
	body := fmt.Sprintf(`{"name": "twice", "size": %d}`, twice)
	d.refuse(t, "POST", "/v1/volumes", body, 507, `may be promised`)
	if vs := d.volumes(t); len(vs) != 0 {
		t.Fatalf("volumes after refusals: %+v", vs)
	}
	d.stop(t)
	d = startBlkd(t, dir, "--overcommit", "3")
	d.must(t, "POST", "/v1/volumes", body, 201, nil)
}

// TestDiskFull: on a real filesystem that fills (a 600 MiB tmpfs; the
// test needs root to mount it), writes fail with Capacity Exceeded while
// reads go on, the store stays healthy, and writes resume by themselves
// once space is freed — no restart. Before, pebble's fatal error failed
// every read as well until a restart. Meanwhile a new volume is refused
// (placement leaves a full node out), and made once space is back.
func TestDiskFull(t *testing.T) {
	t.Parallel() // mostly waits for settle rounds and probes
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=600m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	data := filepath.Join(dir, "blk")
	d := startBlkd(t, data)
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "128MiB"}`, 201, nil)
	d.must(t, "POST", "/v1/volumes/v/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/v/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	ctrl, ns := connect(t, a)
	defer ctrl.Close()
	block := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := ns.WriteAt(block, 0); err != nil {
		t.Fatal(err)
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}

	// Fill the filesystem to ~64 MiB free: under the 128 MiB reserve.
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := st.Bavail * uint64(st.Bsize)
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for left := int64(free) - 64<<20; left > 0; left -= int64(len(chunk)) {
		if _, err := f.Write(chunk); err != nil {
			t.Fatalf("fill: %v", err)
		}
	}
	f.Close()
	eventually(t, 10*time.Second, "store full", func() error {
		if v := d.metric(t, "blk_volume_store_full"); v != 1 {
			return fmt.Errorf("blk_volume_store_full %v", v)
		}
		return nil
	})
	// A new volume is not placed on a node whose disk is full, although
	// the registry promises it room (snapshots and the filler hold space
	// the promise does not count): 507 naming the reason, nothing made.
	d.refuse(t, "POST", "/v1/volumes", `{"name": "w", "size": "8MiB"}`, 507, `whose disk is full`)
	if vs := d.volumes(t); len(vs) != 1 {
		t.Fatalf("volumes after the refusal: %+v", vs)
	}
	// cluster status shows it: promised the volume's 128 MiB, the disk full.
	var cl struct {
		Members []struct {
			Promised uint64 `json:"promised_bytes"`
			Disk     struct {
				Full string `json:"full"`
			} `json:"disk"`
		} `json:"members"`
	}
	d.must(t, "GET", "/v1/cluster?usage=true", "", 200, &cl)
	if len(cl.Members) != 1 || cl.Members[0].Promised != 128<<20 || !strings.Contains(cl.Members[0].Disk.Full, "disk is full") {
		t.Fatalf("cluster usage on a full disk: %+v", cl.Members)
	}
	// A write that needs a new cluster (here 1 MiB in: the volume's
	// clusters are 64 KiB) is refused; an overwrite within the cluster
	// already written goes on, as do reads (docs/store.md: the data area
	// is preallocated, overwrites need no space).
	const fresh = 1 << 20
	_, err = ns.WriteAt(block, fresh)
	var se *initiator.StatusError
	if !errors.As(err, &se) || se.Status.Code() != nvme.StatusCapacityExceeded {
		t.Fatalf("write on a full disk: %v, want Capacity Exceeded", err)
	}
	if _, err := ns.WriteAt(block, 4096); err != nil {
		t.Fatalf("overwrite of an allocated cluster on a full disk: %v", err)
	}
	got := make([]byte, 4096)
	for _, off := range []int64{0, 4096} {
		if _, err := ns.ReadAt(got, off); err != nil || !bytes.Equal(got, block) {
			t.Fatalf("read at %d on a full disk: %v (equal %v)", off, err, bytes.Equal(got, block))
		}
	}
	if _, err := ns.ReadAt(got, fresh); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatalf("read of the refused write's block: %v (zeros %v)", err, bytes.Equal(got, make([]byte, 4096)))
	}
	if v := d.metric(t, "blk_volume_store_healthy"); v != 1 {
		t.Fatalf("store unhealthy on a full disk: %v", v)
	}
	// The leader's settle round (every 10 s) records it.
	var vj volumeJSON
	eventually(t, 25*time.Second, "volume degraded", func() error {
		d.must(t, "GET", "/v1/volumes/v", "", 200, &vj)
		if vj.State != "degraded" || !strings.Contains(vj.Reason, "disk is full") {
			return fmt.Errorf("%s %q", vj.State, vj.Reason)
		}
		return nil
	})

	os.Remove(filler)
	eventually(t, 10*time.Second, "store writable again", func() error {
		if v := d.metric(t, "blk_volume_store_full"); v != 0 {
			return fmt.Errorf("blk_volume_store_full %v", v)
		}
		return nil
	})
	if _, err := ns.WriteAt(block, fresh); err != nil {
		t.Fatalf("write once space is back: %v", err)
	}
	d.must(t, "POST", "/v1/volumes", `{"name": "w", "size": "8MiB"}`, 201, nil)
	if _, err := ns.ReadAt(got, fresh); err != nil || !bytes.Equal(got, block) {
		t.Fatalf("read back: %v", err)
	}
	eventually(t, 25*time.Second, "volume online again", func() error {
		d.must(t, "GET", "/v1/volumes/v", "", 200, &vj)
		if vj.State != "online" {
			return fmt.Errorf("%s %q", vj.State, vj.Reason)
		}
		return nil
	})
}

// TestStaleAttachmentRemoved: attachments were never cleaned up. Now one
// whose host never connects (or left for good) is removed by the leader's
// settle round after --detach-after; one whose host is connected stays.
func TestStaleAttachmentRemoved(t *testing.T) {
	t.Parallel() // mostly waits for settle rounds and probes
	d := startBlkd(t, t.TempDir(), "--detach-after", "1s")
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "8MiB"}`, 201, nil)
	const other = "nqn.2014-08.org.nvmexpress:uuid:gone"
	for _, h := range []string{hostNQN, other} {
		d.must(t, "POST", "/v1/volumes/v/hosts", `{"host_nqn": "`+h+`"}`, 200, nil)
	}
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/v/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	d.must(t, "POST", "/v1/volumes/v/attach", `{"host_nqn": "`+other+`"}`, 200, nil)
	ctrl, _ := connect(t, a)
	defer ctrl.Close()
	var v volumeJSON
	eventually(t, 40*time.Second, "the stale attachment removed", func() error {
		d.must(t, "GET", "/v1/volumes/v", "", 200, &v)
		if len(v.Attachments) != 1 {
			return fmt.Errorf("attachments %+v", v.Attachments)
		}
		return nil
	})
	if v.Attachments[0].HostNQN != hostNQN {
		t.Fatalf("kept %+v, want the connected host %s", v.Attachments, hostNQN)
	}
}

// TestRaftOverMutualTLS: three nodes started with --tls-dir (node
// certificates of one CA, made with package pki as blkctl cert does) form
// a cluster whose raft runs over mutual TLS; management works through it,
// and after the leader is killed the others elect a new one. A node whose
// --tls-dir lacks its certificate exits saying what to issue.
func TestRaftOverMutualTLS(t *testing.T) {
	ca, tlsDir, _ := nodeTLSDir(t, "node1", "node2", "node3")
	c := startCluster(t, "--tls-dir", tlsDir)
	nodes, procs := c.nodes, c.procs
	admin := operatorTLS(t, ca, "alice", pki.RoleAdmin)
	for _, p := range procs {
		p.useTLS(admin)
	}
	if _, ok := logline.Find(procs["node1"].output(), "listening", "port", "raft", "tls", "mutual"); !ok {
		t.Fatalf("node1 does not say raft runs over TLS:\n%s", procs["node1"].output())
	}
	procs["node1"].must(t, "POST", "/v1/volumes", `{"name": "v", "size": "8MiB", "node": "node1"}`, 201, nil)
	procs["node1"].cmd.Process.Signal(syscall.SIGKILL)
	<-procs["node1"].exited
	eventually(t, 30*time.Second, "a new leader over TLS", func() error {
		var c clusterJSON
		if code, msg := procs["node2"].call(t, "GET", "/v1/cluster", "", &c); code != 200 {
			return fmt.Errorf("%d %s", code, msg)
		}
		if c.LeaderID == "" || c.LeaderID == "node1" {
			return fmt.Errorf("leader %q", c.LeaderID)
		}
		return nil
	})

	// A node with a node certificate of another CA (and that CA's ca.crt)
	// cannot join: the handshake fails and it exits at once, saying why.
	other, _ := pki.NewCA("blk other", 0)
	otherDir := filepath.Join(t.TempDir(), "other")
	if err := other.Save(otherDir); err != nil {
		t.Fatal(err)
	}
	oc, ok, _ := other.Issue(pki.Request{Name: "node4", Role: pki.RoleNode, Hosts: []string{"127.0.0.1"}})
	if err := pki.WritePair(otherDir, "node4", oc, ok); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	out, code := runBlkd(t, "--data-dir", t.TempDir(), "--node-id", "node4", "--tls-dir", otherDir, "--join", nodes["node2"].api,
		"--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t), "--api-addr", freeAddr(t))
	if code == 0 || !strings.Contains(out, "TLS handshake failed on a certificate") {
		t.Fatalf("a node of another CA joining: exit %d:\n%s", code, out)
	}
	t.Logf("a node of another CA refused in %v", time.Since(began).Round(100*time.Millisecond))
	var cl clusterJSON
	procs["node2"].must(t, "GET", "/v1/cluster", "", 200, &cl)
	for _, m := range cl.Members {
		if m.ID == "node4" {
			t.Fatalf("node4 became a member: %+v", cl.Members)
		}
	}

	out, code = runBlkd(t, "--data-dir", t.TempDir(), "--node-id", "node9", "--tls-dir", tlsDir,
		"--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t), "--api-addr", freeAddr(t))
	if code == 0 || !strings.Contains(out, "blkctl cert issue node9 --role node") {
		t.Fatalf("a node without its certificate: exit %d:\n%s", code, out)
	}
}

// operatorTLS issues an operator certificate of ca and returns a client
// configuration presenting it.
func operatorTLS(t *testing.T, ca *pki.CA, name, role string) *tls.Config {
	t.Helper()
	c, k, err := ca.Issue(pki.Request{Name: name, Role: role})
	if err != nil {
		t.Fatal(err)
	}
	_, cli, err := pki.MutualTLS(ca.CertPEM(), c, k, pki.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

// TestAPIMutualTLS: with --tls-dir the API is HTTPS with mutual TLS and
// roles: an admin manages, a reader reads and is refused a change (403
// naming it), a node certificate may not manage either; a client without
// a certificate, or with one of another CA, does not get past the
// handshake. Every change is logged with who made it. Without --tls-dir,
// an API beyond loopback is refused unless --insecure.
func TestAPIMutualTLS(t *testing.T) {
	ca, tlsDir, _ := nodeTLSDir(t, "node1")
	other, _ := pki.NewCA("blk other", 0)
	d := startBlkd(t, t.TempDir(), "--tls-dir", tlsDir)
	d.useTLS(operatorTLS(t, ca, "alice", pki.RoleAdmin))
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "8MiB"}`, 201, nil)
	// Logged once the answer is written, so shortly after the client has it.
	eventually(t, 5*time.Second, "the change logged with its caller", func() error {
		if !strings.Contains(d.output(), `who=admin:alice method=POST path=/v1/volumes status=201`) {
			return fmt.Errorf("not in:\n%s", d.output())
		}
		return nil
	})

	d.must(t, "POST", "/v1/volumes/v/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	var vs listJSON
	d.must(t, "GET", "/v1/volumes", "", 200, &vs)
	if len(vs.Volumes) != 1 || len(vs.Volumes[0].Hosts) != 1 {
		t.Fatalf("admin's list: %+v", vs)
	}

	d.useTLS(operatorTLS(t, ca, "bob", pki.RoleReader))
	var rs listJSON
	d.must(t, "GET", "/v1/volumes", "", 200, &rs)
	if len(rs.Volumes) != 1 || len(rs.Volumes[0].Hosts) != 0 {
		t.Fatalf("reader's list: %+v, want the volume without its host NQNs", rs)
	}
	d.refuse(t, "DELETE", "/v1/volumes/v", "", 403, `reader:bob may not DELETE /v1/volumes/v`)
	// An export reads a volume's data: not a reader's.
	d.refuse(t, "GET", "/v1/volumes/v/snapshots/s/export", "", 403, `reader:bob may not GET /v1/volumes/v/snapshots/s/export`)
	if d.metric(t, "blk_volume_size_bytes") <= 0 {
		t.Fatal("reader cannot scrape /metrics")
	}
	d.useTLS(operatorTLS(t, ca, "node7", pki.RoleNode))
	d.refuse(t, "POST", "/v1/volumes", `{"name": "w", "size": "8MiB"}`, 403, `node:node7 may not POST`)

	// mallory trusts the cluster's CA but presents another CA's admin
	// certificate: the server must refuse it (and count it).
	mc, mk, _ := other.Issue(pki.Request{Name: "mallory", Role: pki.RoleAdmin})
	_, foreign, err := pki.MutualTLS(ca.CertPEM(), mc, mk, pki.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	// Sent although the server names another CA (Go's client would
	// otherwise send none: a certificate-less call, answered 401 above).
	mallory := foreign.Certificates[0]
	foreign.Certificates = nil
	foreign.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &mallory, nil }
	ec, ek, _ := ca.Issue(pki.Request{Name: "old", Role: pki.RoleAdmin, NotBefore: time.Now().Add(-48 * time.Hour), Validity: 24 * time.Hour})
	_, expired, err := pki.MutualTLS(ca.CertPEM(), ec, ek, pki.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	// No certificate at all: the handshake passes (for the platform's
	// probes), the call does not (health_test.go walks every route).
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}, Timeout: 10 * time.Second}
	if resp, err := anon.Get("https://" + d.api + "/v1/volumes"); err != nil {
		t.Errorf("no certificate: %v, want a 401", err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no certificate: GET /v1/volumes answered %s, want 401", resp.Status)
	}
	for what, cfg := range map[string]*tls.Config{
		"another CA's admin": foreign,
		"an expired admin":   expired,
	} {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
		resp, err := hc.Get("https://" + d.api + "/v1/volumes")
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: GET /v1/volumes answered %s, want a failed handshake", what, resp.Status)
		}
	}
	d.useTLS(operatorTLS(t, ca, "carol", pki.RoleReader))
	if n := sampleOf(d.metricsText(t), `blk_api_refused_total{reason="certificate"}`); n < 3 {
		t.Errorf("refused handshakes counted %v, want at least 3 (no certificate, another CA, expired)", n)
	}
	if n := sampleOf(d.metricsText(t), `blk_api_refused_total{reason="role"}`); n < 2 {
		t.Errorf("role refusals counted %v, want at least 2", n)
	}
	if !strings.Contains(d.output(), `msg="api handshake refused"`) {
		t.Errorf("refused handshakes are not logged:\n%s", d.output())
	}
	if resp, err := http.Get("http://" + d.api + "/v1/volumes"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the TLS API: %s", resp.Status)
		}
	}

	out, code := runBlkd(t, "--data-dir", t.TempDir(), "--api-addr", "0.0.0.0:"+strings.Split(freeAddr(t), ":")[1],
		"--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t))
	if code == 0 || !strings.Contains(out, "reachable beyond this machine") || !strings.Contains(out, "--insecure") {
		t.Fatalf("an API on 0.0.0.0 without TLS: exit %d:\n%s", code, out)
	}
}

// sampleOf returns the value of the sample line starting with series in
// Prometheus text m (-1 if absent).
func sampleOf(m, series string) float64 {
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// nodeTLSDir makes a CA and a --tls-dir holding it and a node
// certificate (for 127.0.0.1) for each of ids, as blkctl cert does; it
// returns the CA and the directory, and each node's certificate and key.
func nodeTLSDir(t *testing.T, ids ...string) (*pki.CA, string, map[string][2][]byte) {
	t.Helper()
	ca, err := pki.NewCA("blk test", 0)
	if err != nil {
		t.Fatal(err)
	}
	tlsDir := filepath.Join(t.TempDir(), "tls")
	if err := ca.Save(tlsDir); err != nil {
		t.Fatal(err)
	}
	certs := map[string][2][]byte{}
	for _, id := range ids {
		c, k, err := ca.Issue(pki.Request{Name: id, Role: pki.RoleNode, Hosts: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := pki.WritePair(tlsDir, id, c, k); err != nil {
			t.Fatal(err)
		}
		certs[id] = [2][]byte{c, k}
	}
	return ca, tlsDir, certs
}

// TestPollSpinFlag: --poll-spin 0 (poll groups sleep at once, for nodes
// sharing their cores) starts and serves; above the port's bound it is
// refused before anything starts, naming the bound.
func TestPollSpinFlag(t *testing.T) {
	out, code := runBlkd(t, "--data-dir", t.TempDir(), "--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t), "--api-addr", freeAddr(t), "--poll-spin", "1s")
	if code == 0 || !strings.Contains(out, "--poll-spin 1s: at most 10ms") {
		t.Fatalf("--poll-spin 1s: exit %d\n%s", code, out)
	}
	d := startBlkd(t, t.TempDir(), "--poll-spin", "0")
	_, a := attachNew(t, d, "nospin", "8MiB")
	ctrl, ns := connect(t, a.over("tcp"))
	defer ctrl.Close()
	buf := bytes.Repeat([]byte("nospin.."), 512)
	if _, err := ns.WriteAt(buf, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(buf))
	if _, err := ns.ReadAt(got, 4096); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read back: %v", err)
	}
}

// TestTCPMaxTransferFlag: --tcp-max-transfer sets the NVMe/TCP port's
// MDTS (docs/reservations.md §4.4): a host connected with 1 MiB sees
// 1 MiB and moves 1 MiB in one command, data read back equal; a size that
// is no power of two, or above 1 MiB, or no size, is refused before
// anything starts, naming the flag.
func TestTCPMaxTransferFlag(t *testing.T) {
	for _, bad := range []struct{ v, want string }{
		{"2MiB", "--tcp-max-transfer 2097152 bytes: the largest transfer of one NVMe/TCP command must be a power of two from 4KiB to 1MiB"},
		{"96KiB", "--tcp-max-transfer 98304 bytes"},
		{"lots", `--tcp-max-transfer: size "lots"`},
	} {
		out, code := runBlkd(t, "--data-dir", t.TempDir(), "--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t), "--api-addr", freeAddr(t), "--tcp-max-transfer", bad.v)
		if code == 0 || !strings.Contains(out, bad.want) {
			t.Fatalf("--tcp-max-transfer %s: exit %d\n%s", bad.v, code, out)
		}
	}
	d := startBlkd(t, t.TempDir(), "--tcp-max-transfer", "1MiB")
	_, a := attachNew(t, d, "big", "8MiB")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := a.over("tcp")
	cfg := hostConfig(t, at, hostNQN)
	cfg.Queues, cfg.MaxTransfer = 1, 1<<20
	ctrl, err := initiator.Connect(ctx, cfg, net.JoinHostPort(at.Address, strconv.Itoa(at.Port)), at.SubsystemNQN)
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Close()
	if got := ctrl.Info().MaxTransfer; got != 1<<20 {
		t.Fatalf("max transfer over NVMe/TCP %d, want 1 MiB", got)
	}
	ns := ctrl.Namespace(at.NSID)
	buf := bytes.Repeat([]byte("1MiB in one command. "), (1<<20)/21+1)[:1<<20]
	if _, err := ns.WriteAt(buf, 1<<20); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(buf))
	if _, err := ns.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read back: %v (equal %v)", err, bytes.Equal(got, buf))
	}
}

package main

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestReplicationIncremental: a 3-replica 64 MiB volume written in full,
// then a secondary stopped with SIGSTOP (a node cut off: its process
// keeps everything it acknowledged) while the host writes to its
// first 4 MiB, and 2 MiB more written at 32 MiB while it is away. The
// primary keeps a dirty-region log of what it missed (the metric says
// how much, a few MiB); resumed (the same run of blkd, boot.go), the
// victim is rebuilt incrementally
// while the host keeps writing: the primary logs "rebuild done" with
// mode=incremental, the bytes it copied are at most the dirty regions'
// size and far below the volume's, no full copy ran, volume verify
// finds nothing, and the three stores hold exactly what the host wrote.
func TestReplicationIncremental(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 7))

	c, ids, leader := startZoned(t, 3)
	lp := c.procs[leader]
	// The primary and the victim are the two nodes that do not lead the
	// registry: the loss is recorded without an election.
	var primary, victim string
	for _, id := range ids {
		switch {
		case id == leader:
		case primary == "":
			primary = id
		default:
			victim = id
		}
	}
	const size = 64 << 20
	var v replicatedJSON
	lp.must(t, "POST", "/v1/volumes", `{"name": "r", "size": "64MiB", "node": "`+primary+`"}`, 201, &v)
	if len(v.Replicas) != 3 || v.Node != primary {
		t.Fatalf("created %+v: want 3 replicas, primary %s", v, primary)
	}
	pp := c.procs[primary]
	lp.must(t, "POST", "/v1/volumes/r/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	var a attachJSON
	lp.must(t, "POST", "/v1/volumes/r/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	ctrl, ns := connect(t, a.over("tcp"))
	defer ctrl.Close()

	model := make([]byte, size)
	var mu sync.Mutex // writers of distinct blocks: the model's order is the host's
	writeAt := func(off int, buf []byte) error {
		if err := pathRetry(func() error { _, err := ns.WriteAt(buf, int64(off)); return err }); err != nil {
			return fmt.Errorf("write %d bytes at %d: %w", len(buf), off, err)
		}
		mu.Lock()
		copy(model[off:], buf)
		mu.Unlock()
		return nil
	}
	random := func(r *rand.Rand, n int) []byte {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		return buf
	}
	// Every byte allocated: a full copy would copy 64 MiB.
	for off := 0; off < size; off += 1 << 20 {
		if err := writeAt(off, random(rng, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	// writers: two writers of 1..8 blocks, each in its own 2 MiB of the
	// first 4 MiB, until stop, which returns the first error.
	writers := func(base uint64) (stop func() error) {
		return runWriters(2, seed, base, nil, func(r *rand.Rand, w int) error {
			n := 1 + r.IntN(8)
			blk := w*512 + r.IntN(512-n+1)
			return writeAt(blk*4096, random(r, n*4096))
		})
	}

	stop := writers(10)
	time.Sleep(200 * time.Millisecond)
	c.procs[victim].cmd.Process.Signal(syscall.SIGSTOP)
	eventually(t, 20*time.Second, victim+" recorded out of sync", func() error {
		pp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "out-of-sync" {
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	for off := 32 << 20; off < 34<<20; off += 256 << 10 { // 2 MiB while it is away
		if err := writeAt(off, random(rng, 256<<10)); err != nil {
			t.Fatal(err)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("a host write failed while a secondary died: %v", err)
	}
	dirtySeries := `blk_replica_dirty_bytes{node="` + victim + `",volume="r"}`
	dirty := sampleOf(pp.metricsText(t), dirtySeries)
	if dirty < 2<<20 || dirty > 6<<20 {
		t.Fatalf("%s = %v: want the 2 MiB written away, at most 6 MiB", dirtySeries, dirty)
	}
	t.Logf("%s missed %v bytes of dirty regions", victim, dirty)

	c.procs[victim].cmd.Process.Signal(syscall.SIGCONT)
	stop = writers(20)
	eventually(t, 40*time.Second, victim+" rebuilt in sync", func() error {
		v = replicatedJSON{}
		pp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "in-sync" {
				return nil
			}
			if r.Node == victim && r.Rebuild != nil && (r.Rebuild.Total > 6<<20 || r.Rebuild.Done > r.Rebuild.Total) {
				t.Errorf("rebuild progress %+v: more than the 6 MiB written while away", *r.Rebuild)
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	time.Sleep(200 * time.Millisecond) // writes to the rebuilt replica
	if err := stop(); err != nil {
		t.Fatalf("a host write failed while %s was rebuilt: %v", victim, err)
	}

	// What the rebuild passed is the log's dirty regions when it started:
	// those above and the writers' (in the same first 4 MiB) since.
	m := pp.metricsText(t)
	copied := sampleOf(m, `blk_replica_rebuild_copied_bytes_total{mode="incremental",node="`+victim+`",volume="r"}`)
	passed := sampleOf(m, `blk_replica_rebuild_bytes_total{node="`+victim+`",volume="r"}`)
	remaining := sampleOf(m, `blk_replica_rebuild_remaining_bytes{node="`+victim+`",volume="r"}`)
	if copied <= 0 || copied > passed || passed > 6<<20 || remaining != 0 {
		t.Fatalf("incremental rebuild copied %v bytes of %v dirty (%v left): want some, at most the dirty regions, at most 6 MiB of %d", copied, passed, remaining, size)
	}
	if strings.Contains(m, `blk_replica_rebuild_copied_bytes_total{mode="full"`) {
		t.Fatal("a full copy ran")
	}
	if got := sampleOf(m, dirtySeries); got != -1 { // absent: no log
		t.Fatalf("%s = %v once in sync: the log outlived the rebuild", dirtySeries, got)
	}
	var done string
	for _, line := range strings.Split(pp.output(), "\n") {
		if strings.Contains(line, `msg="rebuild done"`) && strings.Contains(line, "node="+victim) {
			done = line
		}
	}
	if !strings.Contains(done, "mode=incremental") || !strings.Contains(done, fmt.Sprintf("copied_bytes=%d", int64(copied))) {
		t.Fatalf("the primary's rebuild log line: %q", done)
	}
	t.Logf("%s", done)
	var cl clusterJSON
	pp.must(t, "GET", "/v1/cluster", "", 200, &cl)
	var res verifyJSON
	c.procs[cl.LeaderID].must(t, "POST", "/v1/volumes/r/verify", "", 200, &res)
	if len(res.Compared) != 3 || len(res.Mismatches) != 0 {
		t.Fatalf("verify after the rebuild: %+v", res)
	}
	ctrl.Close()
	c.stopAll(syscall.SIGTERM)
	for _, id := range ids {
		if err := storeEquals(filepath.Join(c.nodes[id].dir, "volumes"), v.ID, model); err != nil {
			t.Errorf("replica on %s: %v", id, err)
		}
	}
}

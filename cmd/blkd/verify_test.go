package main

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestVerifyUnderWrites: volume verify while a host writes without pause
// into every region of a small 3-replica volume (e2e TestClusterFailover
// ran it under fio and, once, it reported a region of an in-sync replica
// that differed: the stores were equal byte for byte afterwards, the
// region had been hashed on the primary and the replica at different
// moments). Two volumes: one whose primary leads the registry (the
// leader holds its own writes) and one whose primary does not (it is
// asked to, through its checksum route). Every verify compares the three
// copies and finds nothing; the primaries held the host writes to a
// differing region while its copies were hashed again; afterwards the
// three stores hold exactly what the host wrote. With the old retries
// (the copies hashed one after the other) it reported in-sync regions
// that differ in nearly every round.
func TestVerifyUnderWrites(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	c, ids, leader := startZoned(t, 3)
	lp := c.procs[leader]
	other := ids[0]
	if other == leader {
		other = ids[1]
	}
	const bs, blocks, writers = 4096, 4 << 20 / 4096, 8
	type vol struct {
		name  string
		id    uint64
		model []byte
	}
	var vols []*vol
	var stops []func() error
	var writes atomic.Int64
	for i, pin := range []string{leader, other} {
		name := fmt.Sprintf("v%d", i)
		var v replicatedJSON
		lp.must(t, "POST", "/v1/volumes", `{"name": "`+name+`", "size": "4MiB", "node": "`+pin+`"}`, 201, &v)
		if len(v.Replicas) != 3 || v.Node != pin {
			t.Fatalf("created %+v: want 3 replicas, the primary on %s", v, pin)
		}
		lp.must(t, "POST", "/v1/volumes/"+name+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
		var a attachJSON
		lp.must(t, "POST", "/v1/volumes/"+name+"/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
		ctrl, ns := connect(t, a.over("tcp"))
		defer ctrl.Close()
		vl := &vol{name: name, id: v.ID, model: make([]byte, blocks*bs)}
		vols = append(vols, vl)
		// Writer w writes runs of 1–16 blocks in its eighth of the
		// volume (two writers per 1 MiB region): none overlaps another,
		// so the model's order is the host's.
		const span = blocks / writers
		write := func(r *rand.Rand, w int) error {
			lba, n, buf := randomRun(r, w*span, span, bs)
			if _, err := ns.WriteAt(buf, int64(lba*bs)); err != nil {
				return fmt.Errorf("%s: write %d blocks at %d: %w", name, n, lba, err)
			}
			copy(vl.model[lba*bs:], buf)
			return nil
		}
		stops = append(stops, runWriters(writers, seed, uint64(10*i), &writes, write))
	}

	rounds := 8
	if testing.Short() {
		rounds = 3
	}
	for round := range rounds {
		for _, vl := range vols {
			before := writes.Load()
			var res verifyJSON
			lp.must(t, "POST", "/v1/volumes/"+vl.name+"/verify", "", 200, &res)
			if len(res.Compared) != 3 || len(res.Mismatches) != 0 || len(res.Unreachable) != 0 {
				t.Errorf("round %d: verify %s while the host writes: %+v", round, vl.name, res)
			}
			if writes.Load() == before {
				t.Errorf("round %d: no host write completed during the verify of %s", round, vl.name)
			}
		}
	}
	for _, stop := range stops {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d host writes", writes.Load())
	for _, vl := range vols {
		var res verifyJSON
		lp.must(t, "POST", "/v1/volumes/"+vl.name+"/verify", "", 200, &res)
		if len(res.Compared) != 3 || len(res.Mismatches) != 0 {
			t.Errorf("verify %s after the writes: %+v", vl.name, res)
		}
	}
	// The leader's log: each verify's regions hashed again at one
	// instant (none apart: every primary held its writes).
	atOnce := 0
	for _, m := range regexp.MustCompile(`msg="volume verify" .* regions_hashed_again_at_one_instant=(\d+) regions_hashed_again_apart=(\d+) `).FindAllStringSubmatch(lp.output(), -1) {
		n, _ := strconv.Atoi(m[1])
		atOnce += n
		if m[2] != "0" {
			t.Errorf("a verify hashed %s regions again apart, not at one instant", m[2])
		}
	}
	c.stopAll(syscall.SIGTERM)
	for _, vl := range vols {
		for _, id := range ids {
			if err := storeEquals(filepath.Join(c.nodes[id].dir, "volumes"), vl.id, vl.model); err != nil {
				t.Errorf("%s's copy on %s: %v", vl.name, id, err)
			}
		}
	}
	if atOnce == 0 {
		t.Errorf("no verify hashed a region again at one instant: the host writes never made a region differ at the first hashes")
	}
	t.Logf("%d regions hashed again at one instant", atOnce)
}

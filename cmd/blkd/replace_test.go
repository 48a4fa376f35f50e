package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// replaceReplicaJSON is one replica with the replacement's fields.
type replaceReplicaJSON struct {
	replicaJSON
	ReplacedBy string `json:"replaced_by"`
	Replaces   string `json:"replaces"`
}

type replaceVolumeJSON struct {
	volumeJSON
	Epoch    uint64               `json:"epoch"`
	Replicas []replaceReplicaJSON `json:"replicas"`
}

func (v replaceVolumeJSON) nodes() []string {
	var out []string
	for _, r := range v.Replicas {
		out = append(out, r.Node)
	}
	return out
}

// TestReplaceAndMove (docs/replication.md §6; issue 23's e2e scenario 4
// with blk's initiator as the host): five blkd processes in five zones,
// a 3-replica volume, a host connected to every replica node's path and
// writing all along. (1) volume move of the primary: placement puts the
// new replica in a free zone, it is copied in full while the host
// writes, the host connects its path, the leader hands the volume over
// and removes the old one, whose node deletes its copy; no write fails.
// (2) A secondary's node killed and never restarted, replaced at once
// with replace-replica; (3) another, replaced by the leader itself after
// --replace-after 3s (a node up outside the set each time; the dead
// node's copy is left to it, logged). The replica set ends as three in
// sync, volume verify is clean, and every store of the set holds what
// the host wrote.
func TestReplaceAndMove(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 31))

	c, ids, leader := startZoned(t, 5, "--replace-after", "3s")
	lp := c.procs[leader]
	var v replaceVolumeJSON
	a := pinnedVolume(t, c, ids, leader, "m", "16MiB", &v)
	pin := v.Node
	tcpAddrs := tcpAddrsOf(t, lp)
	host := &multipathHost{}
	defer host.close()
	connect := func(id string) error { return host.connect(id, tcpAddrs[id], a.SubsystemNQN) }
	host.pref = v.Node
	for _, id := range v.nodes() {
		if err := connect(id); err != nil {
			t.Fatalf("connect to %s: %v", id, err)
		}
	}
	outside := ""
	for _, id := range ids {
		if !slices.Contains(v.nodes(), id) {
			outside = id
		}
	}

	const bs, blocks = 4096, 16 << 20 / 4096
	const quarter = blocks / 4
	var modelMu sync.Mutex
	model := make([]byte, blocks*bs)
	var writes atomic.Int64
	randWrite := func(r *rand.Rand, q int) error {
		lba, _, buf := randomRun(r, q*quarter, quarter, bs)
		if _, err := host.write(buf, int64(lba*bs), 30*time.Second); err != nil {
			return err
		}
		modelMu.Lock()
		copy(model[lba*bs:], buf)
		modelMu.Unlock()
		writes.Add(1)
		return nil
	}
	for i := range 200 {
		if err := randWrite(rng, i%4); err != nil {
			t.Fatal(err)
		}
	}
	// Four writers, one per quarter of the volume (so the model's order
	// per block is the host's).
	done := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	var werr atomic.Value // the first write error, for the waits below
	for w := range 4 {
		wg.Add(1)
		r := rand.New(rand.NewPCG(uint64(seed), uint64(100+w)))
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := randWrite(r, w); err != nil {
					werr.CompareAndSwap(nil, err)
					errc <- err
					return
				}
			}
		}()
	}
	stopWriters := func() {
		t.Helper()
		close(done)
		wg.Wait()
		close(errc)
		if err := <-errc; err != nil {
			t.Fatalf("a host write failed: %v", err)
		}
	}
	defer func() {
		select {
		case <-done:
		default:
			close(done)
			wg.Wait()
		}
	}()

	// Refusals: a body without "node", a node holding no replica, the
	// new node already holding one.
	for _, bad := range []struct {
		body string
		code int
		msg  string
	}{
		{`{}`, 400, `missing "node"`},
		{`{"node": "` + outside + `"}`, 404, "no replica on node"},
		{`{"node": "` + pin + `", "to": "` + v.nodes()[1] + `"}`, 400, "holds a replica already"},
		{`{"node": "` + pin + `", "to": "` + pin + `"}`, 400, "replaced by itself"},
	} {
		if code, msg := lp.call(t, "POST", "/v1/volumes/m/replicas/replace", bad.body, nil); code != bad.code || !strings.Contains(msg, bad.msg) {
			t.Errorf("replace %s: %d %s, want %d %q", bad.body, code, msg, bad.code, bad.msg)
		}
	}

	// (1) Move the primary where placement says (one of the two free
	// zones).
	before := writes.Load()
	lp.must(t, "POST", "/v1/volumes/m/replicas/replace", `{"node": "`+pin+`"}`, 202, &v)
	free := v.Replicas[slices.Index(v.nodes(), pin)].ReplacedBy
	if free == "" || slices.Index(v.nodes(), free) != slices.Index(v.nodes(), pin)+1 {
		t.Fatalf("after the move's start: %+v", v.Replicas)
	}
	// The host finds the new path (discovery lists it once the node
	// serves the volume) and connects it.
	eventually(t, 30*time.Second, "the host connected to "+free, func() error { return connect(free) })
	eventually(t, 60*time.Second, "the volume moved to "+free, func() error {
		v = replaceVolumeJSON{}
		lp.must(t, "GET", "/v1/volumes/m", "", 200, &v)
		if v.Node == free && !slices.Contains(v.nodes(), pin) && len(v.Replicas) == 3 {
			return nil
		}
		return fmt.Errorf("primary %s, replicas %+v", v.Node, v.Replicas)
	})
	if v.Epoch != 2 || v.Replicas[0].Node != free {
		t.Errorf("after the move: epoch %d, replicas %+v (want epoch 2, %s first)", v.Epoch, v.Replicas, free)
	}
	eventually(t, 10*time.Second, pin+" deleted its copy", func() error {
		if strings.Contains(c.procs[pin].output(), `msg="store volume of a removed replica deleted"`) {
			return nil
		}
		return errors.New("not logged")
	})
	moved := writes.Load()
	eventually(t, 30*time.Second, "writes through "+free, func() error {
		if err := werr.Load(); err != nil {
			t.Fatalf("a host write failed: %v", err)
		}
		if writes.Load() > moved+50 {
			return nil
		}
		return fmt.Errorf("%d writes since the move", writes.Load()-moved)
	})
	if writes.Load() == before {
		t.Fatal("no write completed during the move")
	}

	// (2) and (3): kill a secondary that does not lead the registry and
	// never restart it; (2) replace it at once with replace-replica, (3)
	// let --replace-after replace it. Each time the new replica goes to
	// a node up outside the set, copied while the host writes; the dead
	// node's copy is logged as kept.
	for _, manual := range []bool{true, false} {
		victim := ""
		for _, n := range v.nodes() {
			if n != v.Node && n != leader {
				victim = n
				break
			}
		}
		c.procs[victim].cmd.Process.Signal(syscall.SIGKILL)
		<-c.procs[victim].exited
		delete(c.procs, victim)
		killed := time.Now()
		if manual {
			lp.must(t, "POST", "/v1/volumes/m/replicas/replace", `{"node": "`+victim+`"}`, 202, &v)
		}
		to := ""
		eventually(t, 60*time.Second, victim+"'s replica replaced", func() error {
			v = replaceVolumeJSON{}
			lp.must(t, "GET", "/v1/volumes/m", "", 200, &v)
			for _, r := range v.Replicas {
				if r.Replaces == victim {
					to = r.Node
				}
			}
			if slices.Contains(v.nodes(), victim) || len(v.Replicas) != 3 {
				return fmt.Errorf("replicas %+v", v.Replicas)
			}
			for _, r := range v.Replicas {
				if r.State != "in-sync" {
					return fmt.Errorf("replicas %+v", v.Replicas)
				}
			}
			return nil
		})
		t.Logf("manual %v: %v from the kill to the replacement on %s in sync", manual, time.Since(killed).Round(100*time.Millisecond), to)
		if to == "" || to == victim {
			t.Fatalf("never saw the replacement of %s", victim)
		}
		if auto := regexp.MustCompile(`msg="automatic replacement started" .*volume=m node=` + victim + ` to=` + to + ` down=`).MatchString(lp.output()); auto == manual {
			t.Errorf("manual %v: the leader logged an automatic replacement: %v", manual, auto)
		}
		kept := regexp.MustCompile(`msg="replaced replica's store volume kept on its node \(not served, not counted\): it did not delete it" .*volume=m node=` + victim)
		eventually(t, 10*time.Second, "the dead node's copy logged as kept", func() error {
			if kept.MatchString(lp.output()) {
				return nil
			}
			return errors.New("not logged")
		})
	}
	time.Sleep(300 * time.Millisecond)
	stopWriters()

	var res verifyJSON
	lp.must(t, "POST", "/v1/volumes/m/verify", "", 200, &res)
	if len(res.Compared) != 3 || len(res.Mismatches) != 0 {
		t.Fatalf("verify after the move and the replacement: %+v", res)
	}
	got := make([]byte, len(model))
	for off := 0; off < len(got); off += 64 << 10 {
		if _, err := host.paths[v.Node].ReadAt(got[off:off+64<<10], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("the primary %s reads other bytes than the host wrote, first at block %d", v.Node, i/bs)
	}
	final := v.nodes()
	host.close()
	host.ctrls = nil
	c.stopAll(syscall.SIGTERM)
	for _, id := range final {
		if err := storeEquals(filepath.Join(c.nodes[id].dir, "volumes"), v.ID, model); err != nil {
			t.Errorf("replica on %s: %v", id, err)
		}
	}
}

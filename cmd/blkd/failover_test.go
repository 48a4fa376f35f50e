package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
)

// TestFailover: a 3-replica volume on three blkd processes, a host
// connected to every replica's node (as a Linux host with native
// multipath is) and writing through whichever path serves. SIGKILL of
// the primary's blkd: the leader makes another in-sync replica primary
// at the next epoch, its path serves, the host's writes go on there and
// none acknowledged is lost; the old primary, restarted, is a secondary,
// rebuilt in sync, and, in sync for --failback-after, made primary again
// by a planned handover under the host's writes (failback); the three
// stores hold what the host wrote.
func TestFailover(t *testing.T) { testFailover(t, syscall.SIGKILL) }

// TestFailoverFencing: as TestFailover, the primary stopped with SIGSTOP
// while the host's writes are in flight on it, and resumed once another
// is primary: none of the writes it had taken lands after the new
// primary served (the host rewrites the same blocks through the new
// primary, and must read its own last writes back from every replica),
// and its path no longer serves.
func TestFailoverFencing(t *testing.T) { testFailover(t, syscall.SIGSTOP) }

func testFailover(t *testing.T, sig syscall.Signal) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 29))

	common := []string{"--failback-after", "3s"}
	if sig == syscall.SIGSTOP {
		common = nil // the default, 5 minutes: no failback here
	}
	c, ids, leader := startZoned(t, 3, common...)
	lp := c.procs[leader]
	// The primary does not lead the registry: the failover needs no
	// election (TestClusterLeaderLoss in e2e covers a lost leader).
	var v replicatedJSON
	a := pinnedVolume(t, c, ids, leader, "f", "16MiB", &v)
	primary := v.Node

	// One controller per node, as multipath connects every path.
	host := &multipathHost{}
	defer host.close()
	tcpAddrs := tcpAddrsOf(t, lp)
	for id, addr := range tcpAddrs {
		if err := host.connect(id, addr, a.SubsystemNQN); err != nil {
			t.Fatal(err)
		}
	}

	const bs, blocks = 4096, 16 << 20 / 4096
	const quarter = blocks / 4
	model := make([]byte, blocks*bs)
	// served counts the writes each node's path completed.
	var servedMu sync.Mutex
	served := map[string]int{}
	lastServed := map[string]time.Time{}
	// write writes buf at lba as a multipath host does (multipathHost):
	// every path tried until within passes, a path error or a command
	// aborted by a planned handover's teardown (no DNR, which Linux
	// retries) moving on to the next.
	write := func(buf []byte, lba int, within time.Duration) error {
		id, err := host.write(buf, int64(lba*bs), within)
		if err != nil {
			return fmt.Errorf("write of %d blocks at %d: %w", len(buf)/bs, lba, err)
		}
		servedMu.Lock()
		served[id]++
		lastServed[id] = time.Now()
		servedMu.Unlock()
		return nil
	}
	// touched: the 64 KiB regions the writers wrote (from the kill's
	// eve on), all that may differ on the old primary when it returns.
	var touchedMu sync.Mutex
	touched := map[int]bool{}
	span := quarter // of each quarter, the blocks written
	randWrite := func(r *rand.Rand, q int) error {
		lba, n, buf := randomRun(r, q*quarter, span, bs)
		touchedMu.Lock()
		for b := lba; b < lba+n; b++ {
			touched[b*bs/(64<<10)] = true
		}
		touchedMu.Unlock()
		if err := write(buf, lba, 30*time.Second); err != nil {
			return err
		}
		copy(model[lba*bs:], buf)
		return nil
	}
	for i := range 100 {
		if err := randWrite(rng, i%4); err != nil {
			t.Fatal(err)
		}
	}
	if served[primary] != 100 {
		t.Fatalf("paths served %v: only the primary %s should", served, primary)
	}

	// From now on the writers keep to the first eighth of each quarter,
	// so that what a returning primary lacks is a part of the volume.
	span = quarter / 8
	touchedMu.Lock()
	clear(touched)
	touchedMu.Unlock()
	var writes atomic.Int64
	writers := func(base uint64) (stop func() error) { return runWriters(4, seed, base, &writes, randWrite) }

	stop := writers(0)
	time.Sleep(300 * time.Millisecond) // writes in flight on the primary
	victim := c.procs[primary]
	killed := time.Now()
	victim.cmd.Process.Signal(sig)
	if sig == syscall.SIGKILL {
		<-victim.exited
		delete(c.procs, primary)
	}
	var newPrimary string
	eventually(t, 30*time.Second, "another replica primary", func() error {
		for id, p := range c.procs {
			if id == primary {
				continue
			}
			v = replicatedJSON{}
			if code, _ := p.call(t, "GET", "/v1/volumes/f", "", &v); code == 200 && v.Node != primary && v.Epoch == 2 {
				newPrimary = v.Node
				return nil
			}
		}
		return fmt.Errorf("%+v", v)
	})
	t.Logf("%v of %s to %s primary at epoch 2 (polled every 100 ms)", time.Since(killed).Round(time.Millisecond), sig, newPrimary)
	eventually(t, 30*time.Second, "writes through "+newPrimary, func() error {
		servedMu.Lock()
		defer servedMu.Unlock()
		if lastServed[newPrimary].After(killed) {
			return nil
		}
		return fmt.Errorf("served %v", served)
	})
	servedMu.Lock()
	t.Logf("%v of %s to the first write through %s (epoch %d): %+v", lastServed[newPrimary].Sub(killed).Round(time.Millisecond), sig, newPrimary, v.Epoch, v.Replicas)
	servedMu.Unlock()
	for _, r := range v.Replicas {
		if r.Node == primary && (r.State != "out-of-sync" || !strings.Contains(r.Reason, "primary")) {
			t.Errorf("old primary's replica %+v, want out-of-sync, primary lost", r)
		}
	}
	before := writes.Load()
	time.Sleep(500 * time.Millisecond)

	if sig == syscall.SIGSTOP {
		// Resumed: whatever it had taken must not land anywhere that
		// serves, and its path refuses.
		victim.cmd.Process.Signal(syscall.SIGCONT)
		time.Sleep(3 * time.Second) // its goroutines run, its legs find their connections gone
		// A host connecting to it again finds a path that refuses I/O.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ctrl, err := initiator.Connect(ctx, multipathConfig, tcpAddrs[primary], a.SubsystemNQN)
		cancel()
		if err != nil {
			t.Fatalf("connect to the resumed old primary: %v", err)
		}
		_, err = ctrl.Namespace(1).WriteAt(make([]byte, bs), 0)
		ctrl.Close()
		var se *initiator.StatusError
		if !errors.As(err, &se) || se.Status.SCT() != nvme.SCTPath {
			t.Errorf("a write through the resumed old primary: %v, want a path status", err)
		}
		if !strings.Contains(victim.output(), `msg="primary term ended" node=`+primary+` volume=f epoch=1`) {
			t.Errorf("the resumed primary did not log the end of its term at epoch 1:\n%s", victim.output())
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("a host write failed across the failover: %v", err)
	}
	if writes.Load() == before {
		t.Errorf("no write completed after the failover")
	}

	// Every acknowledged write reads back through the new primary.
	got := make([]byte, len(model))
	for off := 0; off < len(got); off += 64 << 10 {
		if _, err := host.ns(newPrimary).ReadAt(got[off:off+64<<10], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("the new primary %s reads other bytes than the host wrote, first at block %d", newPrimary, i/bs)
	}

	// The old primary, back (restarted, or resumed), is rebuilt in sync.
	if sig == syscall.SIGKILL {
		c.start(primary, "--zone", zoneOf(primary))
		// The host's path to it was given up: connect it again, at the
		// address it registered now.
		old := tcpAddrs[primary]
		eventually(t, 30*time.Second, primary+" registered again", func() error {
			now := tcpAddrsOf(t, c.procs[newPrimary])
			if addr := now[primary]; addr != "" && addr != old {
				tcpAddrs[primary] = addr
				return nil
			}
			return fmt.Errorf("%+v", now)
		})
		if err := host.connect(primary, tcpAddrs[primary], a.SubsystemNQN); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, primary+" rebuilt in sync", func() error {
		v = replicatedJSON{}
		c.procs[newPrimary].must(t, "GET", "/v1/volumes/f", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == primary && r.State == "in-sync" {
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	if sig == syscall.SIGKILL {
		// The returning primary was compared, not copied whole: the
		// new primary copied at most the regions written since the
		// writers started (the new primary's writes, and the old one's
		// in flight at the kill).
		m := c.procs[newPrimary].metricsText(t)
		copied := sampleOf(m, `blk_replica_rebuild_copied_bytes_total{mode="compare",node="`+primary+`",volume="f"}`)
		touchedMu.Lock()
		bound := float64(len(touched) * 64 << 10)
		touchedMu.Unlock()
		if copied < 0 || copied > bound || bound > float64(len(model)/4) {
			t.Fatalf("the returning primary's compare rebuild copied %v bytes, want at most the %v bytes of the regions written since the writers started:\n%s", copied, bound, m)
		}
		var done string
		for _, line := range strings.Split(c.procs[newPrimary].output(), "\n") {
			if strings.Contains(line, `msg="rebuild done"`) && strings.Contains(line, "node="+primary) {
				done = line
			}
		}
		if !strings.Contains(done, "mode=compare") {
			t.Fatalf("the new primary's rebuild log line: %q", done)
		}
		t.Logf("%s (the writers touched %v bytes of %d)", done, bound, len(model))
		// Failback: placement's primary, in sync for 3 s, is handed the
		// volume back while the host writes.
		stop = writers(200)
		handed := time.Now()
		eventually(t, 30*time.Second, "failback to "+primary, func() error {
			v = replicatedJSON{}
			c.procs[newPrimary].must(t, "GET", "/v1/volumes/f", "", 200, &v)
			if v.Node == primary && v.Epoch == 3 {
				return nil
			}
			return fmt.Errorf("primary %s at epoch %d", v.Node, v.Epoch)
		})
		eventually(t, 30*time.Second, "writes through "+primary+" again", func() error {
			servedMu.Lock()
			defer servedMu.Unlock()
			if lastServed[primary].After(handed) {
				return nil
			}
			return fmt.Errorf("served %v", served)
		})
		time.Sleep(300 * time.Millisecond)
		if err := stop(); err != nil {
			t.Fatalf("a host write failed across the failback: %v", err)
		}
		for _, r := range v.Replicas {
			if r.State != "in-sync" {
				t.Errorf("after the failback: replica %+v, want every one in sync (a planned handover loses none)", r)
			}
		}
		if !strings.Contains(c.procs[leader].output(), "failback") {
			t.Errorf("the leader did not log the failback")
		}
		newPrimary = primary
		for off := 0; off < len(got); off += 64 << 10 {
			if _, err := host.ns(primary).ReadAt(got[off:off+64<<10], int64(off)); err != nil {
				t.Fatal(err)
			}
		}
		if i := firstDiff(got, model); i >= 0 {
			t.Fatalf("after the failback %s reads other bytes than the host wrote, first at block %d", primary, i/bs)
		}
	}
	var res verifyJSON
	var cls clusterJSON
	c.procs[newPrimary].must(t, "GET", "/v1/cluster", "", 200, &cls)
	c.procs[cls.LeaderID].must(t, "POST", "/v1/volumes/f/verify", "", 200, &res)
	if len(res.Compared) != 3 || len(res.Mismatches) != 0 {
		t.Fatalf("verify after the failover and the rebuild: %+v", res)
	}
	if sig == syscall.SIGSTOP {
		// The fence, as the replicas logged it.
		for id, p := range c.procs {
			if id != primary && id != newPrimary && !strings.Contains(p.output(), "fence raised") {
				t.Errorf("%s did not log its fence raised for epoch 2", id)
			}
		}
	}
	c.stopAll(syscall.SIGTERM)
	for _, id := range ids {
		if err := storeEquals(filepath.Join(c.nodes[id].dir, "volumes"), v.ID, model); err != nil {
			t.Errorf("replica on %s: %v", id, err)
		}
	}
}

// pathRetry runs io until it does not fail with a path status (SCT 3h),
// for at most 10 s, as a multipath host does: a replicated volume's
// primary answers Asymmetric Access Inaccessible until its lease is
// granted, moments after it starts.
func pathRetry(io func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := io()
		var se *initiator.StatusError
		if err == nil || !errors.As(err, &se) || se.Status.SCT() != nvme.SCTPath || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// firstDiff returns the first offset where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

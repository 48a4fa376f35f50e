package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/testseed"
	"github.com/blk-project/blk/store"
)

// TestImportReplicated: a whole image imported into a new volume of 3
// replicas on 3 nodes, then a diff onto it, through blkctl: every
// node's store reads exactly the image's data afterwards (the live
// volume and its two snapshots, read from the three data directories
// once the nodes stop), the verify API finds the copies equal, and the
// host reads the diff's snapshot. While the diff's import runs (the
// image held back before its end), a host's Connect to the volume on its
// primary is refused and the primary's log names the import; once it
// ended, the host connects.
func TestImportReplicated(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./cmd/blkd/"), 24))
	const mib = 1 << 20
	const size = 16 * mib
	c, ids, leader := startZoned(t, 3)
	lp := c.procs[leader]

	// The source: a volume of one copy, written, snapshotted twice.
	lp.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "16MiB", "replicas": 1}`, 201, nil)
	vctrl, vns := attachNS(t, lp, "v")
	model := make([]byte, size)
	write := func(off, n int) {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		mustWrite(t, vns, int64(off), p)
		copy(model[off:], p)
	}
	write(0, 3*mib+4096) // more than one write of the import (1 MiB each)
	for range 8 {
		write(rng.IntN(size/4096-4)*4096, 4096*(1+rng.IntN(4)))
	}
	write(size-64<<10, 64<<10)
	lp.must(t, "POST", "/v1/volumes/v/snapshots", `{"name": "s1"}`, 201, nil)
	s1 := bytes.Clone(model)
	for range 8 {
		write(rng.IntN(size/4096-4)*4096, 4096*(1+rng.IntN(4)))
	}
	if err := vns.WriteZeroes(mib/4096, 256<<10/4096); err != nil { // a zero record in the diff
		t.Fatal(err)
	}
	clear(model[mib : mib+256<<10])
	lp.must(t, "POST", "/v1/volumes/v/snapshots", `{"name": "s2"}`, 201, nil)
	s2 := bytes.Clone(model)
	vctrl.Close()

	out := t.TempDir()
	full, diff := filepath.Join(out, "s1.img"), filepath.Join(out, "s2.img")
	mustBlkctl(t, lp, "volume", "export", "v@s1", full)
	mustBlkctl(t, lp, "volume", "export", "v@s2", diff, "--since", "v@s1")

	// The whole image into w, of 3 replicas: blkctl creates it, then
	// streams to its primary.
	if o := mustBlkctl(t, lp, "volume", "import", full, "w", "--replicas", "3"); !strings.Contains(o, "snapshot w@s1") {
		t.Fatalf("import: %s", o)
	}
	var w replicatedJSON
	lp.must(t, "GET", "/v1/volumes/w", "", 200, &w)
	if len(w.Replicas) != 3 {
		t.Fatalf("w: %+v, want 3 replicas", w)
	}
	verifyClean(t, lp, "w", 1)

	// The diff, held back before its end while a host tries to connect.
	lp.must(t, "POST", "/v1/volumes/w/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	var a attachJSON
	lp.must(t, "POST", "/v1/volumes/w/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	a = a.over("tcp")
	// Detached (a revert, which the diff's import makes, refuses an
	// attached host), the host stays allowed: its Connect is admitted
	// but for the import.
	lp.must(t, "POST", "/v1/volumes/w/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
	img, err := os.ReadFile(diff)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(blkctlBinary(t), "--api", lp.api, "volume", "import", "-", "w", "--base", "s1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var cout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &cout, &cout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	held := len(img) - 64 // the end record and the checksum
	if _, err := stdin.Write(img[:held]); err != nil {
		t.Fatal(err)
	}
	lp.must(t, "GET", "/v1/volumes/w", "", 200, &w)
	pp := c.procs[w.Node]
	pp.waitOutput(t, `import: hosts refused until it ends.*volume=w snapshot=v@s2`) // not the whole image's, v@s1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cfg := hostConfig(t, a, hostNQN)
	cfg.Queues = 1
	addr := net.JoinHostPort(a.Address, strconv.Itoa(a.Port))
	if ctrl, err := initiator.Connect(ctx, cfg, addr, a.SubsystemNQN); err == nil {
		ctrl.Close()
		cancel()
		t.Fatalf("a host connected to w at %s during its import", addr)
	}
	cancel()
	pp.waitOutput(t, `refused: an import into volume .*w.* is running on node `+w.Node)
	if _, err := stdin.Write(img[held:]); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("blkctl volume import - w --base s1: %v: %s", err, cout.String())
	}
	if !strings.Contains(cout.String(), "snapshot w@s2") {
		t.Fatalf("import of the diff: %s", cout.String())
	}
	ctrl, ns := connect(t, a)
	sameBytes(t, "w after the diff, read by the host", readAll(t, ns, size), s2)
	ctrl.Close()
	verifyClean(t, lp, "w", 2)

	// Every node's store holds the image's data.
	var ws1, ws2 snapshotJSON
	lp.must(t, "GET", "/v1/volumes/w/snapshots/s1", "", 200, &ws1)
	lp.must(t, "GET", "/v1/volumes/w/snapshots/s2", "", 200, &ws2)
	if len(ws1.Nodes) != 3 || len(ws2.Nodes) != 3 {
		t.Fatalf("w's snapshots: s1 on %v, s2 on %v, want 3 nodes each", ws1.Nodes, ws2.Nodes)
	}
	c.stopAll(syscall.SIGTERM)
	for _, id := range ids {
		s, err := store.Open(store.Config{Dir: filepath.Join(c.nodes[id].dir, "volumes")})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []struct {
			what string
			id   uint64
			want []byte
		}{{"w", w.ID, s2}, {"w@s1", ws1.ID, s1}, {"w@s2", ws2.ID, s2}} {
			vol, err := s.Volume(store.ID(o.id))
			if err != nil {
				t.Fatalf("node %s: %s: %v", id, o.what, err)
			}
			got := make([]byte, size)
			for off := 0; off < size; off += mib {
				if err := vol.Read(uint64(off/4096), got[off:off+mib]); err != nil {
					t.Fatalf("node %s: read %s: %v", id, o.what, err)
				}
			}
			sameBytes(t, "node "+id+"'s "+o.what, got, o.want)
		}
		s.Close()
	}
}

// verifyClean has the verify API compare name's copies and its
// snapshots': no mismatch, snaps snapshots compared.
func verifyClean(t *testing.T, d *daemon, name string, snaps int) {
	t.Helper()
	var res struct {
		Mismatches []any    `json:"mismatches"`
		Snapshots  []string `json:"snapshots"`
	}
	d.must(t, "POST", "/v1/volumes/"+name+"/verify?snapshots=true", "", 200, &res)
	if len(res.Mismatches) != 0 || len(res.Snapshots) != snaps {
		t.Fatalf("verify %s: %+v, want %d snapshots compared, no mismatch", name, res, snaps)
	}
}

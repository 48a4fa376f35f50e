//go:build linux

package store

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStoreSurvivesSIGKILL runs the store in a real process on a real
// directory (pebble on disk, the data area a file opened O_DIRECT) and
// kills it with SIGKILL at a random point. Each seeded round: the parent
// creates the store and its volumes (both block sizes) and closes it; a
// child process (this test binary, re-executed) reopens it and runs a
// plan that is a function of the seed: plain and FUA writes (one, a few
// or 64 KiB of blocks, some from unaligned buffers), write-zeroes (some
// FUA), deallocates, flushes, reads it checks itself, and idle pauses
// (with the background syncer on, it waits until the syncer has covered
// every mutation); it prints one line per operation it completed. The
// parent kills it on the k-th line, reads every line the child wrote
// before it died, reopens the store, runs Check and checks docs/store.md's
// contract on every block of every volume:
//
//   - a block written (or zeroed, or deallocated) before a completed
//     Flush, an idle pause the syncer covered, or by a FUA request reads
//     exactly what was acknowledged last;
//   - a block written since reads its durable value or one of the values
//     written since (per block: multi-block writes are atomic per block
//     only; the syncer may have made more durable than promised; the one
//     operation in flight at the kill counts as written since);
//   - never a torn block, another volume's, another LBA's, or bytes of a
//     block never written there (an unwritten block reads zeros);
//
// and then that every free or ready cluster reads zeros (scrub).
//
// A SIGKILL loses what the process held (pebble's unsynced WAL tail,
// anything between two steps of the write path) but not the kernel's
// page cache: TestCrashRecovery covers power loss on crashable fakes.
func TestStoreSurvivesSIGKILL(t *testing.T) {
	if dir := os.Getenv("BLK_STORE_SIGKILL_DIR"); dir != "" {
		seed, _ := strconv.ParseUint(os.Getenv("BLK_STORE_SIGKILL_SEED"), 10, 64)
		sigkillChild(dir, seed, os.Getenv("BLK_STORE_SIGKILL_512") == "1") // never returns
	}
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	seed := testSeed(t)
	for it := range iterations(t, 24, 3, 1) {
		s := seed + uint64(it)
		if err := sigkillRound(t, s); err != nil {
			t.Fatalf("round %d: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, err, s)
		}
	}
}

// sigkillConfig is the store of a round, the same in parent and child:
// small clusters and ready pool and a small area that grows, so that a
// few hundred operations cross clusters, refill the pool, recycle limbo
// and grow the area.
func sigkillConfig(dir string, seed uint64) Config {
	return Config{
		Dir:           filepath.Join(dir, "meta"),
		AreaBytes:     1 << 20,
		AreaMaxBytes:  16 << 20,
		ClusterBytes:  16 << 10,
		ReadyClusters: 8,
		MemTableBytes: 1 << 20,
		CacheBytes:    1 << 20,
		// The syncer at its default, fast, or off (durable only at
		// Flush and FUA).
		SyncInterval:       []time.Duration{DefaultSyncInterval, time.Millisecond, -1}[seed%3],
		SpaceCheckInterval: time.Second,
		Logger:             quietLogger{},
	}
}

type skOp struct {
	kind     byte // 'w' write, 'z' write-zeroes, 'd' deallocate, 'f' flush, 'r' read, 'i' idle
	vol      int
	lba, n   uint64
	fua      bool
	unalign  bool // write from a buffer not aligned for O_DIRECT (the bounce path)
	idleWait time.Duration
}

type skPlan struct {
	vols []*cvol // shapes; blocks all zeros
	ops  []skOp
	kill int // kill on the line of this op (len(ops): once the child is done)
}

// makeSKPlan is the round's work, a function of the seed (and of whether
// the area takes 512-byte blocks), so that the parent knows what each
// line the child printed acknowledged.
func makeSKPlan(seed uint64, allow512 bool) skPlan {
	rng := rand.New(rand.NewPCG(seed, 0x51c))
	var p skPlan
	for id := ID(1); id <= 3; id++ {
		bs := []uint32{BlockSize4K, BlockSize512}[rng.IntN(2)]
		if !allow512 {
			bs = BlockSize4K
		}
		blocks := uint64(64+rng.IntN(192)) * uint64(BlockSize4K/bs)
		p.vols = append(p.vols, &cvol{id: id, bs: bs, blocks: make([]cblock, blocks)})
	}
	for range 150 + rng.IntN(250) {
		o := skOp{kind: 'w', vol: rng.IntN(len(p.vols))}
		m := p.vols[o.vol]
		blocks, B := uint64(len(m.blocks)), uint64(m.bs)
		switch rng.IntN(3) {
		case 0:
			o.n = 1
		case 1:
			o.n = 1 + rng.Uint64N(8)
		default:
			o.n = 1 + rng.Uint64N(min(blocks, (64<<10)/B))
		}
		switch r := rng.IntN(100); {
		case r < 8:
			o.fua = true
		case r < 14:
			o.kind, o.fua = 'z', r < 10
		case r < 22:
			o.kind = 'd'
			o.n = 1 + rng.Uint64N(blocks) // often whole clusters: limbo
		case r < 30:
			o.kind = 'f'
		case r < 35:
			o.kind = 'r'
		case r < 37:
			o.kind = 'i'
			o.idleWait = time.Duration(1+rng.IntN(20)) * time.Millisecond
		}
		o.lba = rng.Uint64N(blocks - o.n + 1)
		o.unalign = o.kind == 'w' && rng.IntN(8) == 0
		p.ops = append(p.ops, o)
	}
	p.kill = rng.IntN(len(p.ops) + 1)
	return p
}

// tag is what op k writes: k+1 (0 means zeros).
func skTag(k int) uint64 { return uint64(k + 1) }

// sigkillChild runs the plan on the store in dir, printing "sk: done k"
// when op k completed (and "sk: all done" at the end), then idles until
// killed. Any failure prints "sk: error ..." and exits.
func sigkillChild(dir string, seed uint64, allow512 bool) {
	fail := func(format string, args ...any) {
		fmt.Printf("sk: error: "+format+"\n", args...)
		os.Exit(2)
	}
	p := makeSKPlan(seed, allow512)
	s, err := Open(sigkillConfig(dir, seed))
	if err != nil {
		fail("open: %v", err)
	}
	vols := make([]*Volume, len(p.vols))
	for i, m := range p.vols {
		if vols[i], err = s.Volume(m.id); err != nil {
			fail("%v", err)
		}
	}
	buf := alignedBuf(64<<10+4096, 4096)
	for k, o := range p.ops {
		v, m := vols[o.vol], p.vols[o.vol]
		B := uint64(m.bs)
		var data []byte // for reads and writes, at most 64 KiB
		if o.kind == 'w' || o.kind == 'r' {
			data = buf[:o.n*B]
			if o.unalign {
				data = buf[1 : 1+o.n*B]
			}
		}
		var fl WriteFlags
		if o.fua {
			fl = FUA
		}
		switch o.kind {
		case 'w':
			for i := range o.n {
				fillTagged(data[i*B:(i+1)*B], m.id, o.lba+i, skTag(k))
			}
			err = v.Write(o.lba, data, fl)
			m.set(o.lba, o.n, skTag(k))
		case 'z':
			err = v.WriteZeroes(o.lba, o.n, fl)
			m.set(o.lba, o.n, 0)
		case 'd':
			err = v.Deallocate(o.lba, o.n)
			m.set(o.lba, o.n, 0)
		case 'f':
			err = v.Flush()
		case 'r':
			if err = v.Read(o.lba, data); err != nil {
				break
			}
			for i := range o.n {
				got, terr := readTag(data[i*B:(i+1)*B], m.id, o.lba+i)
				if want := m.blocks[o.lba+i].cur; terr != nil || got != want {
					fail("op %d: live read of volume %d block %d: tag %d (%v), want %d", k, m.id, o.lba+i, got, terr, want)
				}
			}
		case 'i':
			time.Sleep(o.idleWait)
			if s.cfg.SyncInterval > 0 {
				deadline := time.Now().Add(20 * time.Second)
				for s.flushedSeq.Load() < s.seq.Load() {
					if time.Now().After(deadline) {
						fail("op %d: the syncer did not sync: seq %d, flushed %d", k, s.seq.Load(), s.flushedSeq.Load())
					}
					time.Sleep(100 * time.Microsecond)
				}
			}
		}
		if err != nil {
			fail("op %d (%c): %v", k, o.kind, err)
		}
		fmt.Printf("sk: done %d\n", k) // one write(2): the parent reads every line written before the kill
	}
	fmt.Println("sk: all done")
	select {} // idle until killed
}

func sigkillRound(t *testing.T, seed uint64) error {
	dir := t.TempDir()
	cfg := sigkillConfig(dir, seed)
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	allow512 := s.align <= BlockSize512
	p := makeSKPlan(seed, allow512)
	for _, m := range p.vols {
		if _, err := s.Create(m.id, CreateOptions{SizeBytes: uint64(len(m.blocks)) * uint64(m.bs), BlockSize: m.bs}); err != nil {
			_ = s.Close()
			return err
		}
	}
	if err := s.Close(); err != nil {
		return err
	}

	acked, err := runSKChild(dir, seed, allow512, p.kill)
	if err != nil {
		return err
	}
	// The model: every op acknowledged, in order, then the one in flight
	// (if any) as written-since only.
	syncer := cfg.SyncInterval > 0
	everything := func() {
		for _, m := range p.vols {
			m.durable(0, uint64(len(m.blocks)))
		}
	}
	apply := func(k int, ack bool) {
		o := p.ops[k]
		m := p.vols[o.vol]
		switch o.kind {
		case 'w':
			m.set(o.lba, o.n, skTag(k))
		case 'z', 'd':
			m.set(o.lba, o.n, 0)
		case 'f':
			if ack {
				everything()
			}
		case 'i':
			if ack && syncer {
				everything()
			}
		}
		if ack && o.fua {
			m.durable(o.lba, o.n)
		}
	}
	for k := range acked {
		apply(k, true)
	}
	if acked < len(p.ops) {
		apply(acked, false)
	}

	s, err = Open(cfg)
	if err != nil {
		return fmt.Errorf("reopen after SIGKILL (%d of %d ops acknowledged): %w", acked, len(p.ops), err)
	}
	defer func() { _ = s.Close() }()
	want := cmodel{}
	for _, m := range p.vols {
		want[m.id] = m
	}
	where := fmt.Sprintf("killed after %d of %d ops (syncer %v), reopen zeroed %d clusters", acked, len(p.ops), cfg.SyncInterval, s.Stats().ZeroedAtOpen)
	if err := verifyCrash(s, want); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := scrub(s); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	exact, blocks := 0, 0
	for _, m := range p.vols {
		for _, b := range m.blocks {
			blocks++
			if len(b.later) == 0 {
				exact++
			}
		}
	}
	t.Logf("seed %d: %s: every block as allowed (%d of %d had to read exactly their durable value)", seed, where, exact, blocks)
	return nil
}

// runSKChild starts the child, SIGKILLs it once it printed the line of
// op kill (or "all done"), and returns how many ops it acknowledged: it
// ran them in order, so they are ops [0, acked), and op acked was in
// flight unless it is past the end.
func runSKChild(dir string, seed uint64, allow512 bool, kill int) (int, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestStoreSurvivesSIGKILL$")
	cmd.Env = append(os.Environ(), "BLK_STORE_SIGKILL_DIR="+dir,
		"BLK_STORE_SIGKILL_SEED="+strconv.FormatUint(seed, 10),
		"BLK_STORE_SIGKILL_512="+map[bool]string{true: "1", false: "0"}[allow512])
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	acked, killed := 0, false
	var childErr error
	deadline := time.After(60 * time.Second)
read:
	for {
		var l string
		select {
		case line, ok := <-lines:
			if !ok { // the child is gone and every line it wrote was read
				break read
			}
			l = line
		case <-deadline:
			deadline = nil
			childErr = fmt.Errorf("the child did not finish within 60 s (%d ops acknowledged)", acked)
		}
		switch {
		case strings.HasPrefix(l, "sk: error"):
			childErr = errors.New(l)
		case strings.HasPrefix(l, "sk: done "):
			if k, err := strconv.Atoi(strings.TrimPrefix(l, "sk: done ")); err != nil || k != acked {
				childErr = fmt.Errorf("child line %q: want op %d", l, acked)
			} else {
				acked++
			}
		}
		if !killed && (childErr != nil || acked > kill || l == "sk: all done") {
			_ = cmd.Process.Kill() // SIGKILL
			killed = true
		}
	}
	werr := cmd.Wait()
	switch {
	case childErr != nil:
		return 0, childErr
	case !killed:
		return 0, fmt.Errorf("the child exited before it was killed: %v", werr)
	case werr == nil:
		return 0, errors.New("the child exited cleanly: it was not killed")
	}
	return acked, nil
}

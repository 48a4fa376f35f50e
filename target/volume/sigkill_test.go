//go:build unix

package volume

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

// TestPlainWritesSurviveSIGKILL is issue 21 case 4 with a real process and
// a real directory: a child process (this test binary, re-executed) opens
// a store with the default Config, runs seeded plain writes, FUA writes,
// write-zeroes, deallocates and flushes, and then idles until its store
// reports that the background syncer has synced them ("phase 1 synced");
// then it runs more plain writes and, depending on the seed, idles again
// until they are synced too ("phase 2 synced"). The parent SIGKILLs it on
// the line the seed names, reopens the directory and checks: killed at
// "phase 2 synced", every acknowledged write is there; killed at "phase 1
// synced" (while phase 2 runs), every phase 1 write is there and phase 2
// shows a prefix of its writes; nothing is torn. On main the last writes
// before an idle period stayed in the WAL writer's memory however long
// the child idled, and the kill lost them.
func TestPlainWritesSurviveSIGKILL(t *testing.T) {
	if dir := os.Getenv("BLK_SIGKILL_DIR"); dir != "" {
		seed, _ := strconv.ParseUint(os.Getenv("BLK_SIGKILL_SEED"), 10, 64)
		sigkillChild(dir, seed) // never returns
	}
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	seed := testSeed(t)
	for it := range iterations(t, 4, 2, 4) {
		s := seed + uint64(it)
		if err := sigkillOnce(t, s); err != nil {
			t.Fatalf("iteration %d: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, err, s)
		}
	}
}

// sigkillPlan is the child's work, a function of the seed only, so that
// the parent knows what the child acknowledged without being told.
type sigkillPlan struct {
	vols     []crashVol // the volumes, their tags all zero
	phase1   []sigkillOp
	phase2   []sigkillOp // plain writes only
	killIdle bool        // kill once phase 2 is synced, not while it runs
}

type sigkillOp struct {
	kind   byte // 'w' write, 'z' write-zeroes, 'd' deallocate, 'f' flush
	vol    int
	lba, n uint64
	fua    bool
	// pause: the child idles 20 ms first, so that pebble's WAL flush loop
	// is waiting again and this write stays in its buffer (the case of
	// issue 21; on main such a write was lost, the syncer must save it).
	pause bool
}

func makeSigkillPlan(seed uint64) sigkillPlan {
	rng := rand.New(rand.NewPCG(seed, 0x9c11))
	p := sigkillPlan{killIdle: rng.IntN(2) == 0}
	for i, bs := range []uint32{BlockSize4K, BlockSize512} {
		p.vols = append(p.vols, crashVol{ID(i + 1), bs, make([]uint64, 64+rng.IntN(192))})
	}
	op := func(plainWrites bool) sigkillOp {
		o := sigkillOp{kind: 'w', vol: rng.IntN(len(p.vols)), n: 1 + rng.Uint64N(16)}
		o.lba = rng.Uint64N(uint64(len(p.vols[o.vol].tags)) - o.n + 1)
		if plainWrites {
			return o
		}
		switch r := rng.IntN(20); {
		case r < 2:
			o.fua = true
		case r < 4:
			o.kind = 'z'
			o.fua = r == 3
		case r < 5:
			o.kind = 'd'
		case r < 6:
			o.kind = 'f'
		}
		return o
	}
	// Each phase ends with a few single-block plain writes: small
	// records that stay in the WAL writer's partial block (issue 21 lost
	// exactly those), rather than large ones whose filling of a block
	// wakes pebble's flush loop.
	small := func() []sigkillOp {
		var out []sigkillOp
		for i := range 1 + rng.IntN(3) {
			o := op(true)
			o.n, o.pause = 1, i == 0
			out = append(out, o)
		}
		return out
	}
	for range 50 + rng.IntN(250) {
		p.phase1 = append(p.phase1, op(false))
	}
	p.phase1 = append(p.phase1, small()...)
	for range 1 + rng.IntN(100) {
		p.phase2 = append(p.phase2, op(true))
	}
	p.phase2 = append(p.phase2, small()...)
	return p
}

// apply applies op number k (its tag is k+1) to the model.
func (o sigkillOp) apply(m crashState, k int) {
	tags := m[o.vol].tags
	for i := range o.n {
		switch o.kind {
		case 'w':
			tags[o.lba+i] = uint64(k + 1)
		case 'z', 'd':
			tags[o.lba+i] = 0
		}
	}
}

// sigkillChild runs the plan in dir, telling the parent on stdout when
// each phase is synced, and then waits to be killed.
func sigkillChild(dir string, seed uint64) {
	fail := func(err error) {
		fmt.Printf("sigkill-child: error: %v\n", err)
		os.Exit(2)
	}
	p := makeSigkillPlan(seed)
	s, err := Open(Config{Dir: dir, Logger: quietLogger{}, CacheBytes: 8 << 20})
	if err != nil {
		fail(err)
	}
	var vols []*Volume
	for _, m := range p.vols {
		v, err := s.Create(m.id, CreateOptions{SizeBytes: uint64(len(m.tags)) * uint64(m.bs), BlockSize: m.bs})
		if err != nil {
			fail(err)
		}
		vols = append(vols, v)
	}
	buf := make([]byte, 16*BlockSize4K)
	run := func(o sigkillOp, k int) error {
		if o.pause {
			time.Sleep(20 * time.Millisecond)
		}
		v, m := vols[o.vol], p.vols[o.vol]
		var fl WriteFlags
		if o.fua {
			fl = FUA
		}
		switch o.kind {
		case 'w':
			B := uint64(m.bs)
			for i := range o.n {
				fillTagged(buf[i*B:(i+1)*B], m.id, o.lba+i, uint64(k+1))
			}
			return v.Write(o.lba, buf[:o.n*B], fl)
		case 'z':
			return v.WriteZeroes(o.lba, o.n, fl)
		case 'd':
			return v.Deallocate(o.lba, o.n)
		default:
			return v.Flush()
		}
	}
	for k, o := range p.phase1 {
		if err := run(o, k); err != nil {
			fail(err)
		}
	}
	if err := waitSynced(s); err != nil {
		fail(err)
	}
	fmt.Println("sigkill-child: phase 1 synced")
	for k, o := range p.phase2 {
		if err := run(o, len(p.phase1)+k); err != nil {
			fail(err)
		}
	}
	if err := waitSynced(s); err != nil {
		fail(err)
	}
	fmt.Println("sigkill-child: phase 2 synced")
	select {} // idle until killed
}

func sigkillOnce(t *testing.T, seed uint64) error {
	dir := filepath.Join(t.TempDir(), "store")
	p := makeSigkillPlan(seed)
	cmd := exec.Command(os.Args[0], "-test.run=^TestPlainWritesSurviveSIGKILL$")
	cmd.Env = append(os.Environ(), "BLK_SIGKILL_DIR="+dir, "BLK_SIGKILL_SEED="+strconv.FormatUint(seed, 10))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	want := "sigkill-child: phase 1 synced"
	if p.killIdle {
		want = "sigkill-child: phase 2 synced"
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(60 * time.Second)
	for done := false; !done; {
		select {
		case l, ok := <-lines:
			switch {
			case !ok:
				return errors.New("the child exited before it was killed")
			case strings.HasPrefix(l, "sigkill-child: error"):
				return errors.New(l)
			case l == want:
				done = true
			}
		case <-deadline:
			return fmt.Errorf("no %q from the child within 60 s", want)
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		return err
	}
	killed = true
	go func() {
		for range lines { // drain, so the reader goroutine ends
		}
	}()
	if err := cmd.Wait(); err == nil {
		return errors.New("the child exited cleanly: it was not killed")
	}

	s, err := Open(Config{Dir: dir, Logger: quietLogger{}, CacheBytes: 8 << 20})
	if err != nil {
		return fmt.Errorf("reopen after SIGKILL: %w", err)
	}
	defer func() { _ = s.Close() }()
	got := crashState{}
	for _, m := range p.vols {
		v, err := s.Volume(m.id)
		if err != nil {
			return fmt.Errorf("after SIGKILL: %w", err)
		}
		g := crashVol{m.id, m.bs, make([]uint64, len(m.tags))}
		one := make([]byte, m.bs)
		for lba := range g.tags {
			if err := v.Read(uint64(lba), one); err != nil {
				return fmt.Errorf("after SIGKILL: %w", err)
			}
			if g.tags[lba], err = readTag(one, m.id, uint64(lba)); err != nil {
				return fmt.Errorf("after SIGKILL: volume %d block %d: %w", m.id, lba, err)
			}
		}
		got = append(got, g)
	}
	model := crashState(p.vols).clone()
	for k, o := range p.phase1 {
		o.apply(model, k)
	}
	when := map[bool]string{true: "idle, phase 2 synced", false: "during phase 2"}[p.killIdle]
	// Killed while phase 2 ran: any prefix of it. Killed idle: all of it.
	first := 0
	if p.killIdle {
		for k, o := range p.phase2 {
			o.apply(model, len(p.phase1)+k)
		}
		first = len(p.phase2)
	}
	for k := first; ; k++ {
		if model.equal(got) {
			t.Logf("seed %d (killed %s): phase 1 (%d ops) whole, %d of %d phase 2 plain writes survived the SIGKILL",
				seed, when, len(p.phase1), k, len(p.phase2))
			return nil
		}
		if k == len(p.phase2) {
			break
		}
		p.phase2[k].apply(model, len(p.phase1)+k)
	}
	return fmt.Errorf("after SIGKILL (killed %s): the store matches no allowed state (phase 1: %d ops, phase 2: %d): acknowledged writes that the store had reported synced were lost",
		when, len(p.phase1), len(p.phase2))
}

package rdma_test

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/target/volume"
	"github.com/blk-project/blk/transport/soft"
)

// The test binary doubles as a target process: with BLK_TEST_TARGET_DIR
// set it serves a pebble store in that directory (volume 1, 256 MiB, as
// namespace 1 of testSubNQN, any host allowed) on BLK_TEST_TARGET_ADDR,
// prints "LISTEN <addr>" and runs until SIGTERM, when it shuts down
// cleanly. Tests start it with startChildTarget.
func TestMain(m *testing.M) {
	if dir := os.Getenv("BLK_TEST_TARGET_DIR"); dir != "" {
		if err := runChildTarget(dir, os.Getenv("BLK_TEST_TARGET_ADDR")); err != nil {
			fmt.Fprintln(os.Stderr, "child target:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const childVolumeSize = 256 << 20

func runChildTarget(dir, addr string) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	a, err := soft.New(soft.Config{})
	if err != nil {
		return err
	}
	defer a.Close()
	cfg := rdma.Config{Addr: addr}
	lim, err := rdma.Limits(a.Info(), cfg)
	if err != nil {
		return err
	}
	store, err := volume.Open(volume.Config{Dir: dir})
	if err != nil {
		return err
	}
	defer store.Close()
	vol, err := store.Volume(1)
	if errors.Is(err, volume.ErrNotFound) {
		vol, err = store.Create(1, volume.CreateOptions{SizeBytes: childVolumeSize})
	}
	if err != nil {
		return err
	}
	t, err := target.New(target.Config{Limits: lim})
	if err != nil {
		return err
	}
	defer t.Close()
	sub, err := t.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-child", Model: "blk child target", AllowAnyHost: true})
	if err != nil {
		return err
	}
	if err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: target.VolumeBackend(vol)}); err != nil {
		return err
	}
	port, err := rdma.Listen(t, a, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", port.Addr())
	<-sig
	return port.Close()
}

type childTarget struct {
	cmd  *exec.Cmd
	addr string
}

// startChildTarget runs the test binary as a target process on dir and
// addr ("127.0.0.1:0" for any port) and waits until it listens.
func startChildTarget(tb testing.TB, dir, addr string) *childTarget {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BLK_TEST_TARGET_DIR="+dir, "BLK_TEST_TARGET_ADDR="+addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &childTarget{cmd: cmd}
	tb.Cleanup(func() { c.kill() })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "LISTEN ") {
				lines <- strings.TrimPrefix(l, "LISTEN ")
			}
		}
	}()
	select {
	case c.addr = <-lines:
	case <-time.After(30 * time.Second):
		tb.Fatal("child target did not start listening within 30 s")
	}
	return c
}

// kill ends the child abruptly (a crash: nothing is flushed).
func (c *childTarget) kill() {
	if c.cmd.ProcessState == nil {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	}
}

// stop ends the child with SIGTERM (clean shutdown) and checks it exited 0.
func (c *childTarget) stop(tb testing.TB) {
	tb.Helper()
	c.cmd.Process.Signal(syscall.SIGTERM)
	if err := c.cmd.Wait(); err != nil {
		tb.Fatalf("child target exit: %v", err)
	}
}

// cpu returns the child's user+system CPU time so far, from /proc.
func (c *childTarget) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15 of the whole line, in clock ticks (100 Hz).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// TestTwoProcesses: the target runs in another process on a real
// directory. The initiator writes (flushed, FUA and plain writes), the
// target process is killed (a crash) and restarted on the same address;
// the initiator reconnects by itself and what was flushed or written with
// FUA reads back. Then a clean stop (SIGTERM) and restart: everything
// acknowledged before the clean stop reads back too.
func TestTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts target processes")
	}
	seed := testSeed(t)
	rng := rand.New(rand.NewSource(seed))
	dir := t.TempDir()
	child := startChildTarget(t, dir, "127.0.0.1:0")
	c := connectHost(t, child.addr, initiator.Config{
		Queues: 2, QueueDepth: 16, KATO: 2 * time.Second,
		CtrlLossTimeout: 60 * time.Second, ReconnectDelay: 100 * time.Millisecond, MaxReconnectDelay: time.Second,
	})
	ns := c.Namespace(1)
	if ns == nil || ns.Size() != childVolumeSize {
		t.Fatalf("namespace 1 missing or wrong size")
	}
	fill := func(n int) []byte {
		b := make([]byte, n)
		rng.Read(b)
		return b
	}
	flushed := fill(1 << 20) // at 0, then Flush
	fua := fill(256 << 10)   // at 4 MiB, FUA
	if _, err := ns.WriteAt(flushed, 0); err != nil {
		t.Fatal(err)
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.WriteAtFlags(fua, 4<<20, initiator.FUA); err != nil {
		t.Fatal(err)
	}
	check := func(what string, off int64, want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		if _, err := ns.ReadAt(got, off); err != nil {
			t.Fatalf("%s: read: %v", what, err)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("%s: differs at byte %d", what, i)
		}
	}
	check("before crash", 0, flushed)
	cntlid := c.CNTLID()

	child.kill()
	child = startChildTarget(t, dir, child.addr)
	// ReadAt waits for the reconnect (bounded by CtrlLossTimeout).
	check("flushed write after crash", 0, flushed)
	check("FUA write after crash", 4<<20, fua)
	if st := c.Stats(); st.Associations < 2 || st.Failures < 1 {
		t.Errorf("no reconnect recorded (CNTLID %d → %d, stats %+v)", cntlid, c.CNTLID(), st)
	}

	plain := fill(512 << 10) // at 8 MiB, neither flushed nor FUA
	if _, err := ns.WriteAt(plain, 8<<20); err != nil {
		t.Fatal(err)
	}
	child.stop(t) // SIGTERM: the target closes the store cleanly
	child = startChildTarget(t, dir, child.addr)
	check("plain write after a clean restart", 8<<20, plain)
	check("flushed write after a clean restart", 0, flushed)
}

package rdma_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/benchbook"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/target/tcp"
)

// The test binary doubles as a server process, in one of two modes:
//
//   - with BLK_TEST_TARGET_DIR set it serves an extent store in that
//     directory (volume 1, 256 MiB, as namespace 1 of testSubNQN, any host
//     allowed, through a StoreIO as blkd does) on BLK_TEST_TARGET_ADDR, with the port's Cores, QPsPerCore
//     and QueueEntries from BLK_TEST_TARGET_CORES, _QPS_PER_CORE and
//     _QUEUE_ENTRIES where set (the defaults otherwise); with
//     BLK_TEST_TARGET_TRANSPORT=tcp it serves the same through an
//     NVMe/TCP port (target/tcp, its Cores from BLK_TEST_TARGET_CORES)
//     instead;
//   - with BLK_TEST_BARE_SERVER=1 it runs the bare transport baseline's
//     server (bare_test.go) on BLK_TEST_TARGET_ADDR.
//
// Either prints "LISTEN <addr>" and runs until SIGTERM, when it shuts down
// cleanly. With BLK_TEST_CHILD_CONTROL=1 (set by startChild) it also
// reads commands on stdin: "stats" prints one line "STATS k=v ...", and
// end of file — the parent closed it, or exited however it died — shuts
// it down cleanly, so a child never outlives the test binary that started
// it. With BLK_TEST_CHILD_MEMPROFILE=<path> it writes an allocation
// profile of every allocation (MemProfileRate 1) to <path>.<pid> at exit.
// With BLK_TEST_CHILD_CPUPROFILE=<path> it writes a CPU profile of its
// run to <path>.<pid> (see bench_test.go). It opens its adapter of the
// provider BLK_TEST_CHILD_PROVIDER names on BLK_TEST_CHILD_DEVICE (soft
// by default; benchenv_test.go). Tests start it with
// startChildTarget or startChildBare; the benchmarks with startChild and
// benchChildEnv.
func TestMain(m *testing.M) {
	addr := os.Getenv("BLK_TEST_TARGET_ADDR")
	if os.Getenv("BLK_TEST_BARE_SERVER") != "" {
		if err := runChildBare(addr); err != nil {
			fmt.Fprintln(os.Stderr, "child bare server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if dir := os.Getenv("BLK_TEST_TARGET_DIR"); dir != "" {
		if err := runChildTarget(dir, addr); err != nil {
			fmt.Fprintln(os.Stderr, "child target:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const childVolumeSize = 256 << 20

// The child target's port sizes (runChildTarget).
const (
	childTransportEnv    = "BLK_TEST_TARGET_TRANSPORT"
	childCoresEnv        = "BLK_TEST_TARGET_CORES"
	childQPsPerCoreEnv   = "BLK_TEST_TARGET_QPS_PER_CORE"
	childQueueEntriesEnv = "BLK_TEST_TARGET_QUEUE_ENTRIES"
	// childSyncDiskEnv (any value) serves the RDMA port with its cores'
	// poller hook off (rdma.WithSyncDisk): every I/O inline on the core,
	// BenchmarkStoreDisk's baseline.
	childSyncDiskEnv = "BLK_TEST_TARGET_SYNC_DISK"
	// childDiskSpinEnv (a duration; 0: none) sets the cores' disk spin
	// (rdma.WithDiskSpin).
	childDiskSpinEnv = "BLK_TEST_TARGET_DISK_SPIN"
)

func runChildTarget(dir, addr string) error {
	a, err := childAdapter()
	if err != nil {
		return err
	}
	defer a.Close()
	cfg := rdma.Config{Addr: addr}
	for _, f := range []struct {
		env string
		set func(uint32)
	}{
		{childCoresEnv, func(v uint32) { cfg.Cores = int(v) }},
		{childQPsPerCoreEnv, func(v uint32) { cfg.QPsPerCore = v }},
		{childQueueEntriesEnv, func(v uint32) { cfg.QueueEntries = v }},
	} {
		if s := os.Getenv(f.env); s != "" {
			v, err := strconv.ParseUint(s, 10, 32)
			if err != nil {
				return fmt.Errorf("%s=%q: %w", f.env, s, err)
			}
			f.set(uint32(v))
		}
	}
	if os.Getenv(childSyncDiskEnv) != "" {
		cfg = rdma.WithSyncDisk(cfg)
	}
	if s := os.Getenv(childDiskSpinEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%s: %w", childDiskSpinEnv, err)
		}
		cfg = rdma.WithDiskSpin(cfg, d)
	}
	if os.Getenv("BLK_TEST_TARGET_LOG") != "" {
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "child target: "+format+"\n", args...) }
	}
	// The store as blkd opens it (defaults: a data area file beside dir,
	// 64 KiB clusters), served through a StoreIO as blkd serves it.
	st, err := store.Open(store.Config{Dir: dir, AreaBytes: childVolumeSize, Logger: quietLogger{}})
	if err != nil {
		return err
	}
	defer st.Close()
	vol, err := st.Volume(1)
	if errors.Is(err, store.ErrNotFound) {
		vol, err = st.Create(1, store.CreateOptions{SizeBytes: childVolumeSize})
	}
	if err != nil {
		return err
	}
	sio, err := target.NewStoreIO(st, target.StoreIOConfig{})
	if err != nil {
		return err
	}
	defer sio.Close() // after the target (deferred later, closed first)
	t, err := target.New(target.Config{})
	if err != nil {
		return err
	}
	defer t.Close()
	sub, err := t.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-child", Model: "blk child target", AllowAnyHost: true})
	if err != nil {
		return err
	}
	if err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: sio.Backend(vol)}); err != nil {
		return err
	}
	if os.Getenv(childTransportEnv) == "tcp" {
		return serveChildTCP(t, st, tcp.Config{Addr: addr, Cores: cfg.Cores, Logf: cfg.Logf})
	}
	port, err := rdma.Listen(t, a, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", port.Addr())
	// The port's sizes, as it computed them (Port.Sizing): what the
	// scale benchmark's memory figures come from.
	sz := port.Sizing()
	sizes := fmt.Sprintf(" cores=%d srqbuffers=%d recvbufsize=%d queueentries=%d adminentries=%d adminbufsize=%d",
		len(port.Engine().Cores()), sz.Engine.Buffers, sz.Engine.BufferSize, sz.Limits.MaxQueueEntries, sz.Limits.AdminQueueEntries, sz.AdminBufferSize)
	childServe(func() string {
		s := port.Stats()
		line := fmt.Sprintf("commands=%d incapsule=%d rdmareads=%d rdmawrites=%d waits=%d completions=%d notifications=%d groupedwrites=%d groupcommits=%d accepts=%d rejects=%d",
			s.Commands, s.InCapsuleWrites, s.RDMAReads, s.RDMAWrites, s.DataWaits, s.Engine.Completions, s.Engine.Notifications, s.GroupedWrites, s.GroupCommits, s.Accepts, s.Rejects)
		line += fmt.Sprintf(" diskpeak=%d pollwakes=%d capsulecopies=%d", s.DiskInFlightPeak, s.Engine.PollWakes, s.CapsuleCopies)
		ss := sio.Stats()
		line += fmt.Sprintf(" storedirect=%d storedeferred=%d", ss.Direct, ss.Deferred)
		return line + sizes + storeCounters(st)
	})
	return port.Close()
}

// serveChildTCP serves t through an NVMe/TCP port until childServe
// returns.
func serveChildTCP(t *target.Target, st *store.Store, cfg tcp.Config) error {
	port, err := tcp.Listen(t, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", port.Addr())
	childServe(func() string {
		s := port.Stats()
		line := fmt.Sprintf("commands=%d incapsule=%d r2ts=%d c2h=%d copies=%d waits=%d groupedwrites=%d groupcommits=%d accepts=%d",
			s.Commands, s.InCapsule, s.R2Ts, s.C2HData, s.Copies, s.DataWaits, s.GroupedWrites, s.GroupCommits, s.Accepts)
		return line + storeCounters(st)
	})
	return port.Close()
}

// storeCounters are the store's copies for the stats line: requests whose
// buffer the store copied through a bounce buffer (not aligned for
// O_DIRECT), and the requests of volume 1 (bench_test.go: vol-bounces/op).
func storeCounters(s *store.Store) string {
	line := fmt.Sprintf(" volbounces=%d", s.Stats().BounceCopies)
	if v, err := s.Volume(1); err == nil {
		vs := v.Stats()
		line += fmt.Sprintf(" volrequests=%d", vs.Reads+vs.Writes)
	}
	return line
}

// quietLogger drops the store's and pebble's informational messages
// (they would land in the middle of benchmark output) and keeps errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any) {}
func (quietLogger) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "child target: pebble: "+format+"\n", args...)
}

func runChildBare(addr string) error {
	a, err := childAdapter()
	if err != nil {
		return err
	}
	defer a.Close()
	s, err := newBareServer(a, addr)
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", s.ln.Addr())
	childServe(s.stats)
	return s.Close()
}

// childServe runs a child server until SIGTERM or SIGINT, or (under
// BLK_TEST_CHILD_CONTROL) until its stdin ends, answering "stats" on stdin
// with "STATS " + stats() + the process's allocation count.
func childServe(stats func() string) {
	if path := os.Getenv("BLK_TEST_CHILD_MEMPROFILE"); path != "" {
		// Every allocation, written at exit: where the server's
		// tgt-allocs/op come from.
		runtime.MemProfileRate = 1
		defer func() {
			f, err := os.Create(fmt.Sprintf("%s.%d", path, os.Getpid()))
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "child: memory profile:", err)
			}
		}()
	}
	if path := os.Getenv("BLK_TEST_CHILD_CPUPROFILE"); path != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", path, os.Getpid()))
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "child: cpu profile:", err)
		} else {
			defer func() {
				pprof.StopCPUProfile()
				f.Close()
			}()
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	stop := make(chan struct{})
	if os.Getenv("BLK_TEST_CHILD_CONTROL") != "" {
		go func() {
			defer close(stop)
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				if sc.Text() == "stats" {
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					fmt.Printf("STATS %s mallocs=%d\n", stats(), ms.Mallocs)
				}
			}
		}()
	}
	select {
	case <-sig:
	case <-stop:
	}
}

// childTarget is a child server process (either mode).
type childTarget struct {
	cmd    *exec.Cmd
	addr   string
	stdin  io.WriteCloser
	stats  chan string   // "STATS" lines
	exited chan struct{} // closed once the process is reaped
	err    error         // its exit status, once exited is closed
}

// startChildTarget runs the test binary as a target process on dir and
// addr ("127.0.0.1:0" for any port) and waits until it listens.
func startChildTarget(tb testing.TB, dir, addr string) *childTarget {
	tb.Helper()
	return startChild(tb, "BLK_TEST_TARGET_DIR="+dir, "BLK_TEST_TARGET_ADDR="+addr)
}

// startChildBare runs the test binary as the bare baseline's server on
// addr and waits until it listens.
func startChildBare(tb testing.TB, addr string) *childTarget {
	tb.Helper()
	return startChild(tb, "BLK_TEST_BARE_SERVER=1", "BLK_TEST_TARGET_ADDR="+addr)
}

func startChild(tb testing.TB, env ...string) *childTarget {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(append(os.Environ(), "BLK_TEST_CHILD_CONTROL=1"), env...)
	cmd.Stderr = os.Stderr
	// Plain pipes (not StdoutPipe), so that reaping the process in the
	// background never races with reading its output.
	out, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout = w
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		out.Close()
		tb.Fatal(err)
	}
	w.Close()
	c := &childTarget{cmd: cmd, stdin: stdin, stats: make(chan string, 1), exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	tb.Cleanup(func() { c.close() })
	lines := make(chan string, 1)
	go func() {
		defer out.Close()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			switch l := sc.Text(); {
			case strings.HasPrefix(l, "LISTEN "):
				lines <- strings.TrimPrefix(l, "LISTEN ")
			case strings.HasPrefix(l, "STATS "):
				c.stats <- strings.TrimPrefix(l, "STATS ")
			}
		}
	}()
	select {
	case c.addr = <-lines:
	case <-c.exited:
		tb.Fatalf("child exited before listening: %v", c.err)
	case <-time.After(30 * time.Second):
		tb.Fatal("child did not start listening within 30 s")
	}
	return c
}

// close ends the child cleanly by closing its stdin, and kills it if it
// has not exited within 10 s.
func (c *childTarget) close() {
	c.stdin.Close()
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.kill()
	}
}

// kill ends the child abruptly (a crash: nothing is flushed).
func (c *childTarget) kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	c.cmd.Process.Kill()
	<-c.exited
}

// stop ends the child with SIGTERM (clean shutdown) and checks it exited 0.
func (c *childTarget) stop(tb testing.TB) {
	tb.Helper()
	c.cmd.Process.Signal(syscall.SIGTERM)
	<-c.exited
	if c.err != nil {
		tb.Fatalf("child exit: %v", c.err)
	}
}

// counters asks the child for its counters ("stats" on stdin) and returns
// them by name.
func (c *childTarget) counters(tb testing.TB) map[string]uint64 {
	tb.Helper()
	if _, err := io.WriteString(c.stdin, "stats\n"); err != nil {
		tb.Fatalf("ask child for stats: %v", err)
	}
	var line string
	select {
	case line = <-c.stats:
	case <-c.exited:
		tb.Fatalf("child exited: %v", c.err)
	case <-time.After(30 * time.Second):
		tb.Fatal("child did not answer stats within 30 s")
	}
	m := make(map[string]uint64)
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			tb.Fatalf("child stats %q: %v", f, err)
		}
		m[k] = n
	}
	return m
}

// cpu returns the child's user+system CPU time so far, from /proc.
func (c *childTarget) cpu() time.Duration { return benchbook.ProcCPU(c.cmd.Process.Pid) }

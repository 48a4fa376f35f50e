//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// slogStore gives the store's messages to a slog.Logger.
type slogStore struct{ l *slog.Logger }

func (s slogStore) Infof(format string, args ...any)  { s.l.Info(fmt.Sprintf(format, args...)) }
func (s slogStore) Errorf(format string, args ...any) { s.l.Error(fmt.Sprintf(format, args...)) }

// mpGap is how long TestKernelMultipathANA leaves the host with no
// usable path, between fencing A and promoting B.
const mpGap = time.Second

// mpPath is one path of TestKernelMultipathANA: a target of its own with
// its own NVMe/TCP port, serving the shared subsystem.
type mpPath struct {
	name  string
	start func(state nvme.ANAState) // a target, its subsystem and port
	tgt   *target.Target
	port  *tcp.Port
	sub   *target.Subsystem
}

// stop closes the path's port and target, as a node going down does.
func (p *mpPath) stop() {
	if p.port != nil {
		p.port.Close()
		p.port = nil
	}
	if p.tgt != nil {
		p.tgt.Close()
		p.tgt = nil
	}
}

// mpIO are a path's counters: the namespace's served reads and writes,
// and the commands the path answered Asymmetric Access Inaccessible.
type mpIO struct{ reads, writes, refused uint64 }

func (c mpIO) served() uint64 { return c.reads + c.writes }

func (p *mpPath) io(nqn string) mpIO {
	st := p.tgt.Stats()
	c := mpIO{refused: st.Commands[nvme.StatusANAInaccessible]}
	for _, ns := range st.Namespaces {
		if ns.Subsystem == nqn && ns.NSID == 1 {
			c.reads, c.writes = ns.Reads, ns.Writes
		}
	}
	return c
}

// TestKernelMultipathANA is the multipath scenario: the Linux nvme-tcp
// host with native multipath (guest) against two blk targets run by this
// test process — two target.Target, each with its own NVMe/TCP port, the
// same subsystem NQN with ANA, disjoint CNTLID ranges, namespace 1 of
// each on one volume of one extent store — path A optimized, path B
// inaccessible. The host connects both through A's discovery log (which
// lists B as a remote path): one subsystem, two controllers, one
// namespace head, each path's ANA state as the targets say, I/O on the
// optimized path only. Twice under fio the test fences the optimized
// path, leaves the host with no usable path for a second, and promotes
// the other: first with A's ANA change notices off (the host must fail
// over on the status of the I/O A refuses), then back with every notice
// on. The host follows, fio passes its crc32c verify, the fenced path
// serves nothing more, and the bytes written through one path read back
// through the other and from the store. Last, B's target is restarted
// under fio on A: the host reconnects to it and keeps it inaccessible.
func TestKernelMultipathANA(t *testing.T) {
	s := newScenario(t)
	port := ports(24700)
	portA, portB := port(), port()
	const (
		nqn     = "nqn.2026-11.io.blk:e2e:multipath"
		hostNQN = "nqn.2014-08.org.nvmexpress:uuid:e2e00000-0000-4000-8000-000000000017"
		block   = 4096
		blocks  = 16384 // 64 MiB
	)
	logf, err := os.Create(s.path("targets.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	logger := slog.New(slog.NewTextHandler(logf, nil))

	// The shared backing store: one volume of an extent store, served
	// to both targets' namespaces through one StoreIO (an engine per
	// poll group), as blkd serves its volumes. Closed after the targets
	// (cleanups run last first).
	st, err := store.Open(store.Config{Dir: t.TempDir(), AreaBytes: 128 << 20, Logger: slogStore{logger.With("store", 1)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	vol, err := st.Create(1, store.CreateOptions{SizeBytes: blocks * block, BlockSize: block})
	if err != nil {
		t.Fatal(err)
	}
	sio, err := target.NewStoreIO(st, target.StoreIOConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sio.Close)

	// newPath is a path serving the subsystem on 127.0.0.1:listen (the
	// guest's 10.0.2.2:listen), controller IDs in [lo, hi], with the
	// other path listed in its discovery log; start starts it.
	newPath := func(name string, listen, other int, lo, hi uint16) *mpPath {
		p := &mpPath{name: name}
		p.start = func(state nvme.ANAState) {
			cfg := tcp.Config{Addr: addr(listen), AdvertiseAddr: "10.0.2.2", Cores: 1, Logger: logger.With("path", name)}
			lim, err := tcp.Limits(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if p.tgt, err = target.New(target.Config{Limits: lim, CNTLIDMin: lo, CNTLIDMax: hi, Logger: logger.With("path", name)}); err != nil {
				t.Fatal(err)
			}
			if p.sub, err = p.tgt.AddSubsystem(target.SubsystemConfig{NQN: nqn, Serial: "blk-e2e-multipath", Model: "blk e2e multipath",
				Hosts: []string{hostNQN}, ANA: true, ANAState: state,
				Paths: []target.Port{{ID: 2, TrType: nvme.TrTypeTCP, AdrFam: nvme.AdrFamIPv4, TrAddr: "10.0.2.2", TrSvcID: strconv.Itoa(other)}},
			}); err != nil {
				t.Fatal(err)
			}
			if err := p.sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: sio.Backend(vol)}); err != nil {
				t.Fatal(err)
			}
			if p.port, err = tcp.Listen(p.tgt, cfg); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(p.stop)
		return p
	}
	a := newPath("A", portA, portB, 1, 0x7fff)
	b := newPath("B", portB, portA, 0x8000, 0xffef)
	a.start(nvme.ANAOptimized)
	b.start(nvme.ANAInaccessible)

	seed := time.Now().UnixNano() % 1000000
	t.Logf("fio seed %d", seed)
	s.setEnv("PORTA", strconv.Itoa(portA), "PORTB", strconv.Itoa(portB), "NQN", nqn, "HOSTNQN", hostNQN, "HOSTID", "e2e00000-0000-4000-8000-000000000017", "SEED", fmt.Sprint(seed))
	s.script("kernel_multipath.sh")
	g := s.boot(vmConfig{name: "mphost", script: "kernel_multipath.sh", timeout: 8 * time.Minute})

	// flip moves the host from one path to the other under fio, as a
	// failover does: when the guest says fio runs (mark
	// fio-running-STEP), the old path is fenced (inaccessible), the host
	// is left with no usable path for mpGap — it must hold its I/O, not
	// fail it — and the new path is promoted (optimized); once the new
	// path serves, the guest is told (flipped-STEP). It checks that only
	// the old path served since the last flip and returns its counters
	// right after its fencing.
	last := map[*mpPath]mpIO{a: {}, b: {}}
	flip := func(step int, from, to *mpPath) (fenced mpIO) {
		s.waitMark(fmt.Sprintf("fio-running-%d", step), g, 6*time.Minute)
		f0, t0 := from.io(nqn), to.io(nqn)
		t.Logf("flip %d: %s served %d reads %d writes, %s %d reads %d writes", step, from.name, f0.reads, f0.writes, to.name, t0.reads, t0.writes)
		if f0.writes == last[from].writes {
			t.Errorf("flip %d: the optimized path %s served %+v, before %+v: fio's writes did not go there", step, from.name, f0, last[from])
		}
		if f0.refused != last[from].refused {
			t.Errorf("flip %d: the optimized path %s refused %d commands as inaccessible", step, from.name, f0.refused-last[from].refused)
		}
		if t0 != last[to] {
			t.Errorf("flip %d: the inaccessible path %s was sent I/O: %+v, before %+v", step, to.name, t0, last[to])
		}
		if err := from.sub.SetANAState(nvme.ANAInaccessible); err != nil {
			t.Fatal(err)
		}
		// From here every command reaching the old path is refused; what
		// it still serves had passed its ANA check: at most fio's 8 in
		// flight.
		fenced = from.io(nqn)
		time.Sleep(mpGap)
		if c := to.io(nqn); c != t0 {
			t.Errorf("flip %d: %s served or refused I/O while inaccessible: %+v, before %+v", step, to.name, c, t0)
		}
		promote := time.Now()
		if err := to.sub.SetANAState(nvme.ANAOptimized); err != nil {
			t.Fatal(err)
		}
		for to.io(nqn).served() == t0.served() {
			if time.Since(promote) > 30*time.Second {
				t.Fatalf("flip %d: no I/O reached %s within 30 s of its promotion", step, to.name)
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Logf("flip %d: %s optimized to its first served I/O: %v (%s fenced %v before)", step, to.name,
			time.Since(promote).Round(time.Millisecond), from.name, mpGap)
		s.mark(fmt.Sprintf("flipped-%d", step))
		return fenced
	}
	// afterFlip checks the fenced path served nothing beyond what was in
	// flight at its fencing and that the other path took over.
	afterFlip := func(step int, from, to *mpPath, fenced mpIO) {
		f, c := from.io(nqn), to.io(nqn)
		t.Logf("after flip %d: %s served %+v (%+v at its fencing); %s served %+v", step, from.name, f, fenced, to.name, c)
		if d := f.served() - fenced.served(); d > 8 {
			t.Errorf("flip %d: %s served %d reads and writes after it was fenced, want at most fio's queue depth (8)", step, from.name, d)
		}
		if c.reads == last[to].reads || c.writes == last[to].writes {
			t.Errorf("flip %d: %s served %+v, before %+v: the host's I/O did not move there", step, to.name, c, last[to])
		}
		if c.refused != last[to].refused {
			t.Errorf("flip %d: the optimized path %s refused %d commands as inaccessible", step, to.name, c.refused-last[to].refused)
		}
		last[from], last[to] = f, c
	}

	// Flip 1, A to B. The guest turned A's ANA change notices off: the
	// host learns of A's fencing only from the status of the I/O A
	// refuses, and fails it over itself.
	fenced := flip(1, a, b)
	s.waitMark("flip-1-done", g, 6*time.Minute)
	refusedA := a.io(nqn).refused
	afterFlip(1, a, b, fenced)
	if refusedA == 0 {
		t.Errorf("flip 1: A refused no command after its fencing, yet its ANA notices were off")
	}
	// Flip 2, back from B to A, every notice on: the host follows them.
	fenced = flip(2, b, a)
	s.waitMark("flip-2-done", g, 6*time.Minute)
	afterFlip(2, b, a, fenced)
	t.Logf("commands refused as inaccessible: by A after its fencing (notices off) %d, by B after its fencing (notices on) %d",
		refusedA, b.io(nqn).refused)

	// B restarted, as a node coming back, under fio on A: the host
	// reconnects to it by itself, reads its log (inaccessible) and
	// sends it nothing, while A serves on.
	s.waitMark("fio-running-3", g, 6*time.Minute)
	a3 := a.io(nqn)
	b.stop()
	b.start(nvme.ANAInaccessible)
	s.mark("flipped-3")
	s.wait(g)
	if c := b.io(nqn); c != (mpIO{}) {
		t.Errorf("the restarted, inaccessible path B was sent I/O: %+v", c)
	}
	if st := b.tgt.Stats(); st.ControllersCreated == 0 {
		t.Errorf("the host did not connect to the restarted B: %d controllers created", st.ControllersCreated)
	}
	if c := a.io(nqn); c.writes == a3.writes || c.refused != a3.refused {
		t.Errorf("while B restarted A served %+v, before %+v: want more writes, no refusal", c, a3)
	}

	for _, f := range []struct{ name, a, b string }{
		{"paths-before.txt", "optimized", "inaccessible"},
		{"paths-flip.txt", "inaccessible", "optimized"},
		{"paths-failback.txt", "optimized", "inaccessible"},
		{"paths-restart.txt", "optimized", "inaccessible"},
	} {
		got := string(s.readShare(f.name))
		t.Logf("%s:\n%s", f.name, strings.TrimSpace(got))
		mustContain(t, f.name, got, fmt.Sprintf("trsvcid=%d cntlid=", portA), fmt.Sprintf("trsvcid=%d cntlid=", portB),
			"ana_state="+f.a, "ana_state="+f.b)
		for _, l := range strings.Split(strings.TrimSpace(got), "\n") {
			want := f.b
			if strings.Contains(l, fmt.Sprintf("trsvcid=%d ", portA)) {
				want = f.a
			}
			if !strings.HasSuffix(l, "ana_state="+want) || !strings.Contains(l, "state=live") {
				t.Errorf("%s: path %q, want live and %s", f.name, l, want)
			}
		}
	}
	// Controller IDs from the disjoint ranges.
	for _, l := range strings.Split(string(s.readShare("paths-before.txt")), "\n") {
		i := strings.Index(l, "cntlid=")
		if i < 0 {
			continue
		}
		id, _ := strconv.Atoi(strings.Fields(l[i+len("cntlid="):])[0])
		if onB := strings.Contains(l, fmt.Sprintf("trsvcid=%d ", portB)); onB != (id >= 0x8000) {
			t.Errorf("path %q: CNTLID %d outside its target's range", l, id)
		}
	}

	var disc struct {
		Records []struct{ Trtype, Subnqn, Trsvcid, Traddr string }
	}
	s.decode("discover.json", &disc)
	var listed []string
	for _, r := range disc.Records {
		if r.Subnqn == nqn {
			listed = append(listed, r.Trtype+" "+r.Traddr+":"+r.Trsvcid)
		}
	}
	if want := []string{fmt.Sprintf("tcp 10.0.2.2:%d", portA), fmt.Sprintf("tcp 10.0.2.2:%d", portB)}; strings.Join(listed, ",") != strings.Join(want, ",") {
		t.Errorf("A's discovery log lists %v, want %v (its own port, then path B)", listed, want)
	}

	// The host's view of the change: multipath.c's ANA lines, per path.
	dmesg := string(s.readShare("dmesg-mphost.txt"))
	for _, l := range strings.Split(dmesg, "\n") {
		if strings.Contains(l, "ANA") || strings.Contains(l, "nvme") && (strings.Contains(l, "error") || strings.Contains(l, "failover")) {
			t.Logf("dmesg: %s", strings.TrimSpace(l))
		}
	}
	// Each controller's states as the host read them from its log (at
	// connect, on a notice, on a refused command), repeats dropped.
	ctrlOf := map[int]string{}
	for _, l := range strings.Split(string(s.readShare("paths-before.txt")), "\n") {
		for _, port := range []int{portA, portB} {
			if f := strings.Fields(l); len(f) > 1 && f[1] == fmt.Sprintf("trsvcid=%d", port) {
				ctrlOf[port] = f[0]
			}
		}
	}
	for _, w := range []struct {
		port int
		want string
	}{{portA, "optimized inaccessible optimized"}, {portB, "inaccessible optimized inaccessible"}} {
		var seq []string
		for _, l := range strings.Split(dmesg, "\n") {
			if i := strings.Index(l, " "+ctrlOf[w.port]+": ANA group 1: "); ctrlOf[w.port] != "" && i >= 0 {
				st := strings.TrimSuffix(strings.TrimSpace(l[i+len(ctrlOf[w.port])+len(": ANA group 1: ")+1:]), ".")
				if len(seq) == 0 || seq[len(seq)-1] != st {
					seq = append(seq, st)
				}
			}
		}
		if got := strings.Join(seq, " "); got != w.want {
			t.Errorf("dmesg: the host read the states %q for controller %q (port %d), want %q", got, ctrlOf[w.port], w.port, w.want)
		}
	}
	// The head held its I/O through the gaps: the block layer's note.
	mustContain(t, "dmesg", dmesg, "no usable path - requeuing I/O", ctrlOf[portB]+": Successfully reconnected")
	for _, bad := range []string{"Invalid MNAN", "ANA log page", "Duplicate cntlid", "IDs don't match", "does not support multiple controllers", "I/O error"} {
		if strings.Contains(dmesg, bad) {
			t.Errorf("dmesg has %q", bad)
		}
	}

	for _, f := range []string{"fio-before.json", "fio-flip.json", "fio-before-again.json", "fio-failback.json", "fio-flip-again.json", "fio-restart.json"} {
		s.fioResult(f)
	}
	// The pattern the guest wrote through path A at 8 MiB is in the store.
	pat := s.readShare("pattern.bin")
	got := make([]byte, len(pat))
	for off := 0; off < len(got); off += 1 << 20 { // the store's largest transfer
		if err := vol.Read(uint64(8<<20+off)/block, got[off:min(off+1<<20, len(got))]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, pat) {
		t.Errorf("the backing store at 8 MiB does not hold the pattern the guest wrote")
	}
	t.Logf("store I/O: %+v", sio.Stats())
}

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
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// mpGap is how long TestKernelMultipathANA leaves the host with no
// usable path, between fencing A and promoting B.
const mpGap = time.Second

// mpPath is one path of TestKernelMultipathANA: a target of its own with
// its own NVMe/TCP port, serving the shared subsystem.
type mpPath struct {
	name string
	tgt  *target.Target
	port *tcp.Port
	sub  *target.Subsystem
}

// io is the namespace's served reads and writes, and the commands this
// path answered Asymmetric Access Inaccessible.
func (p *mpPath) io(nqn string) (reads, writes, refused uint64) {
	st := p.tgt.Stats()
	for _, ns := range st.Namespaces {
		if ns.Subsystem == nqn && ns.NSID == 1 {
			reads, writes = ns.Reads, ns.Writes
		}
	}
	return reads, writes, st.Commands[nvme.StatusANAInaccessible]
}

// TestKernelMultipathANA is the multipath scenario: the Linux nvme-tcp
// host with native multipath (guest) against two blk targets run by this
// test process — two target.Target, each with its own NVMe/TCP port, the
// same subsystem NQN with ANA, disjoint CNTLID ranges, namespace 1 on
// each over one shared backing store — path A optimized, path B
// inaccessible. The host connects both through A's discovery log (which
// lists B as a remote path): one subsystem, two controllers, one
// namespace head, each path's ANA state as the targets say. I/O goes to A
// only; the test flips the states under fio (A inaccessible, B
// optimized): the host follows the ANA change notices, fio passes its
// crc32c verify, I/O moves to B, and the bytes written through A read
// back through B and from the backing store.
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
	mem, err := target.NewMemBackend(block, blocks)
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(s.path("targets.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	logger := slog.New(slog.NewTextHandler(logf, nil))

	// newPath serves the subsystem on 127.0.0.1:listen (the guest's
	// 10.0.2.2:listen), controller IDs in [lo, hi], with the other path
	// listed in its discovery log.
	newPath := func(name string, listen, other int, lo, hi uint16, state nvme.ANAState) *mpPath {
		cfg := tcp.Config{Addr: addr(listen), AdvertiseAddr: "10.0.2.2", Cores: 1, Logger: logger.With("path", name)}
		lim, err := tcp.Limits(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p := &mpPath{name: name}
		if p.tgt, err = target.New(target.Config{Limits: lim, CNTLIDMin: lo, CNTLIDMax: hi, Logger: logger.With("path", name)}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.tgt.Close() })
		if p.sub, err = p.tgt.AddSubsystem(target.SubsystemConfig{NQN: nqn, Serial: "blk-e2e-multipath", Model: "blk e2e multipath",
			Hosts: []string{hostNQN}, ANA: true, ANAState: state,
			Paths: []target.Port{{ID: 2, TrType: nvme.TrTypeTCP, AdrFam: nvme.AdrFamIPv4, TrAddr: "10.0.2.2", TrSvcID: strconv.Itoa(other)}},
		}); err != nil {
			t.Fatal(err)
		}
		if err := p.sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: mem}); err != nil {
			t.Fatal(err)
		}
		if p.port, err = tcp.Listen(p.tgt, cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.port.Close() })
		return p
	}
	a := newPath("A", portA, portB, 1, 0x7fff, nvme.ANAOptimized)
	b := newPath("B", portB, portA, 0x8000, 0xffef, nvme.ANAInaccessible)

	seed := time.Now().UnixNano() % 1000000
	t.Logf("fio seed %d", seed)
	s.setEnv("PORTA", strconv.Itoa(portA), "PORTB", strconv.Itoa(portB), "NQN", nqn, "HOSTNQN", hostNQN, "HOSTID", "e2e00000-0000-4000-8000-000000000017", "SEED", fmt.Sprint(seed))
	s.script("kernel_multipath.sh")
	g := s.boot(vmConfig{name: "mphost", script: "kernel_multipath.sh", timeout: 8 * time.Minute})

	s.waitMark("fio-running", g, 6*time.Minute)
	ar, aw, arefused := a.io(nqn)
	br, bw, brefused := b.io(nqn)
	t.Logf("before the flip: A served %d reads %d writes, B %d reads %d writes", ar, aw, br, bw)
	if aw == 0 || ar == 0 {
		t.Errorf("before the flip path A (optimized) served %d reads %d writes: the host's I/O did not go there", ar, aw)
	}
	if br+bw+brefused != 0 {
		t.Errorf("before the flip path B (inaccessible) was sent I/O: %d reads %d writes served, %d refused", br, bw, brefused)
	}
	if arefused != 0 {
		t.Errorf("before the flip path A refused %d commands as inaccessible", arefused)
	}

	// The flip, as a failover does it: the old path fenced first (A
	// inaccessible), then, after a gap with no usable path — the host
	// must hold its I/O, not fail it — the new one promoted (B
	// optimized).
	if err := a.sub.SetANAState(nvme.ANAInaccessible); err != nil {
		t.Fatal(err)
	}
	// From here every command reaching A is refused; what it still
	// serves had passed its ANA check: at most fio's 8 in flight.
	atFlipR, atFlipW, _ := a.io(nqn)
	time.Sleep(mpGap)
	if br, bw, _ := b.io(nqn); br+bw != 0 {
		t.Errorf("path B served %d reads %d writes while inaccessible", br, bw)
	}
	promote := time.Now()
	if err := b.sub.SetANAState(nvme.ANAOptimized); err != nil {
		t.Fatal(err)
	}
	for {
		if br, bw, _ := b.io(nqn); br+bw != 0 {
			break
		}
		if time.Since(promote) > 30*time.Second {
			t.Fatalf("no I/O reached path B within 30 s of its promotion")
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("B made optimized to its first served I/O: %v (A fenced %v before)", time.Since(promote).Round(time.Millisecond), mpGap)
	s.mark("flipped")
	s.wait(g)

	ar2, aw2, arefused2 := a.io(nqn)
	br2, bw2, brefused2 := b.io(nqn)
	t.Logf("after: A served %d reads %d writes (%d at the flip), refused %d as inaccessible; B served %d reads %d writes, refused %d",
		ar2, aw2, atFlipW, arefused2, br2, bw2, brefused2)
	if d := ar2 + aw2 - atFlipR - atFlipW; d > 8 {
		t.Errorf("path A served %d reads and writes after it was made inaccessible, want at most fio's queue depth (8)", d)
	}
	if bw2 == 0 || br2 == 0 {
		t.Errorf("after the flip path B served %d reads %d writes: the host's I/O did not move there", br2, bw2)
	}
	// A's notices were off: the host failed over on the status of the
	// I/O A refused.
	if arefused2 == 0 {
		t.Errorf("path A refused no command after its fencing: the host learned of it otherwise (its ANA notices were off)")
	}
	if brefused2 != 0 {
		t.Errorf("path B refused %d commands as inaccessible", brefused2)
	}

	for _, f := range []struct{ name, a, b string }{
		{"paths-before.txt", "optimized", "inaccessible"},
		{"paths-after.txt", "inaccessible", "optimized"},
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
	mustContain(t, "dmesg", dmesg, "ANA group 1: optimized.", "ANA group 1: inaccessible.")
	for _, bad := range []string{"Invalid MNAN", "ANA log page", "Duplicate cntlid", "IDs don't match", "does not support multiple controllers", "I/O error"} {
		if strings.Contains(dmesg, bad) {
			t.Errorf("dmesg has %q", bad)
		}
	}

	for _, f := range []string{"fio-before.json", "fio-flip.json", "fio-before-again.json"} {
		s.fioResult(f)
	}
	// The pattern the guest wrote through path A at 8 MiB is in the store.
	pat := s.readShare("pattern.bin")
	got := make([]byte, len(pat))
	if err := mem.Read(8<<20/block, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, pat) {
		t.Errorf("the backing store at 8 MiB does not hold the pattern the guest wrote")
	}
}

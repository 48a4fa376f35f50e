//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestVerbsConformance runs the rdma-core provider's own tests
// (transport/verbs: the conformance suite of transport/transporttest and
// its allocation guards) inside guests on the kernel's RDMA devices: Soft-RoCE
// (rxe) and Soft-iWARP (siw), each on the guest's eth0, both ends of
// every connection in the guest. The test binary is built on the host with
// cgo against Debian's libibverbs and librdmacm (the same libraries the
// guest has). BLK_E2E_VERBS_RUN narrows it (-test.run of the binary);
// BLK_E2E_VERBS_RACE=1 builds it with the race detector.
//
// siw 6.1 lacks three things the suite asks of a full adapter
// (transport/verbs' doc): solicited-only arms, telling the initiator why the
// peer refused its RDMA access, and refusing a read of a region registered
// without the remote-read right. The adapter says so in its flags and the
// suite checks the answers those flags promise instead (ErrNotSupported
// for the arm, a flushed request and the peer's ErrAccessViolation for the
// refusal; the unenforced read is skipped, with the reason).
func TestVerbsConformance(t *testing.T) {
	if env.skip != "" {
		t.Skip(env.skip)
	}
	if _, err := os.Stat("../transport/verbs"); err != nil {
		t.Skip("transport/verbs does not exist yet")
	}
	aptInstall(t, "libibverbs-dev", "librdmacm-dev", "pkg-config")
	bin := filepath.Join(env.bin, "verbs.test")
	cargs := []string{"test", "-c", "-tags", "verbs", "-o", bin}
	if os.Getenv("BLK_E2E_VERBS_RACE") == "1" {
		cargs = append(cargs, "-race") // the race detector in the guest (slower)
	}
	build := exec.Command("go", append(cargs, "../transport/verbs/")...)
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the verbs provider's tests with cgo: %v\n%s", err, out)
	}
	args := ""
	if r := os.Getenv("BLK_E2E_VERBS_RUN"); r != "" {
		args = "-test.run=" + r
	}
	for _, kind := range []string{"rxe", "siw"} {
		t.Run(kind, func(t *testing.T) {
			s := newScenario(t)
			s.copy(bin, "verbs.test")
			s.setEnv("KIND", kind, "ARGS", args)
			s.script("verbs.sh")
			g := s.boot(vmConfig{name: kind, script: "verbs.sh", timeout: 20 * time.Minute})
			<-g.done
			summarizeGoTest(t, string(s.readShareOr("verbs-"+kind+".txt")))
			s.wait(g)
		})
	}
}

var goTestResult = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)

// summarizeGoTest logs the go test verdicts of out, one line per kind.
func summarizeGoTest(t *testing.T, out string) {
	t.Helper()
	byKind := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if m := goTestResult.FindStringSubmatch(line); m != nil {
			byKind[m[1]] = append(byKind[m[1]], m[2])
		}
	}
	for _, k := range []string{"PASS", "SKIP", "FAIL"} {
		if len(byKind[k]) > 0 {
			t.Logf("%s (%d): %s", k, len(byKind[k]), strings.Join(byKind[k], " "))
		}
	}
}

// readShareOr reads a file the guest may have written; nil if it did not.
func (s *scenario) readShareOr(name string) []byte {
	b, _ := os.ReadFile(s.path(name))
	return b
}

// aptInstall installs Debian packages on the host when they are missing.
func aptInstall(t *testing.T, pkgs ...string) {
	t.Helper()
	var missing []string
	for _, p := range pkgs {
		if exec.Command("dpkg", "-s", p).Run() != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return
	}
	t.Logf("apt-get install %s", strings.Join(missing, " "))
	inst := func() ([]byte, error) {
		c := exec.Command("apt-get", append([]string{"install", "-y", "-q"}, missing...)...)
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return c.CombinedOutput()
	}
	if _, err := inst(); err == nil {
		return
	}
	if out, err := exec.Command("apt-get", "update", "-q").CombinedOutput(); err != nil {
		t.Fatalf("apt-get update: %v\n%s", err, out)
	}
	if out, err := inst(); err != nil {
		t.Fatalf("apt-get install %s: %v\n%s", strings.Join(missing, " "), err, out)
	}
}

// TestVerbsBenchmarks runs target/rdma's end-to-end benchmarks (the bare
// transport baseline and the NVMe target, each in a child process) on the
// verbs provider over Soft-RoCE in one guest, both ends there, and logs
// their lines: the x-bare column is the ratio issue 10 asks to report on
// a verbs device. Emulated figures are for the record only. It runs only
// with BLK_E2E_VERBS_BENCH=1 (a few minutes CI need not spend);
// BLK_E2E_VERBS_BENCHTIME sets -test.benchtime (default 200x).
func TestVerbsBenchmarks(t *testing.T) {
	if os.Getenv("BLK_E2E_VERBS_BENCH") != "1" {
		t.Skip("BLK_E2E_VERBS_BENCH=1 runs target/rdma's benchmarks on verbs/rxe")
	}
	if env.skip != "" {
		t.Skip(env.skip)
	}
	aptInstall(t, "libibverbs-dev", "librdmacm-dev", "pkg-config")
	bin := filepath.Join(env.bin, "rdma-bench.test")
	build := exec.Command("go", "test", "-c", "-tags", "verbs", "-o", bin, "../target/rdma/")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building target/rdma's tests with the verbs provider: %v\n%s", err, out)
	}
	benchtime := os.Getenv("BLK_E2E_VERBS_BENCHTIME")
	if benchtime == "" {
		benchtime = "200x"
	}
	s := newScenario(t)
	s.copy(bin, "rdma-bench.test")
	s.setEnv("ARGS", "-test.benchtime="+benchtime)
	s.script("bench.sh")
	g := s.boot(vmConfig{name: "bench", script: "bench.sh", memMiB: 2048, timeout: 20 * time.Minute})
	<-g.done
	for _, line := range strings.Split(string(s.readShareOr("bench.txt")), "\n") {
		if strings.HasPrefix(line, "Benchmark") {
			t.Log(line)
		}
	}
	s.wait(g)
}

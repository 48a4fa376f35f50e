//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCompareAndWriteRace is issue 25's Compare and Write scenario: two
// host guests run blkcaw (blk's initiator over NVMe/TCP) against one
// block of a blkd volume, each advancing a counter held in the block
// with fused Compare and Write for 400 rounds. Exactly one host wins
// each round (the rounds the two won are 1..400, each once), every block
// read is whole, and the loser of a round gets Compare Failure.
func TestCompareAndWriteRace(t *testing.T) {
	if env.skip != "" {
		t.Skip(env.skip)
	}
	bin := filepath.Join(env.bin, "blkcaw")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./blkcaw")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building blkcaw: %v\n%s", err, out)
	}
	s := newScenario(t)
	s.copy(bin, "blkcaw")
	port := ports(25200)
	tcpPort, rdmaPort, api := port(), port(), addr(port())
	s.startDaemon("blkd", api, "--raft-addr", addr(port()), "--tcp-addr", addr(tcpPort), "--nvme-addr", addr(rdmaPort))
	const rounds = 400
	var v replicatedVolume
	s.blkctl(api, &v, "volume", "create", "cawvol", "--size", "16MiB")
	for _, g := range []string{"caw1", "caw2"} {
		s.blkctl(api, nil, "host", "allow", "cawvol", "nqn.2026-11.io.blk:e2e-"+g)
	}
	s.blkctl(api, &v, "volume", "show", "cawvol")
	s.setEnv("TCPPORT", strconv.Itoa(tcpPort), "NQN", v.NQN, "ROUNDS", strconv.Itoa(rounds))
	s.script("caw.sh")
	g1 := s.boot(vmConfig{name: "caw1", script: "caw.sh", timeout: 10 * time.Minute})
	g2 := s.boot(vmConfig{name: "caw2", script: "caw.sh", timeout: 10 * time.Minute})
	s.wait(g1)
	s.wait(g2)

	owner := map[int]string{}
	miscompares := 0
	for _, g := range []string{"caw1", "caw2"} {
		var tries, won, lost int
		if _, err := fmt.Sscan(string(s.readShare("won-"+g+".txt.stats")), &tries, &won, &lost); err != nil {
			t.Fatalf("%s's stats: %v", g, err)
		}
		miscompares += lost
		n := 0
		for _, l := range strings.Fields(string(s.readShare("won-" + g + ".txt"))) {
			r, err := strconv.Atoi(l)
			if err != nil || r < 1 || r > rounds {
				t.Fatalf("%s won round %q: not a round of 1..%d", g, l, rounds)
			}
			if prev, ok := owner[r]; ok {
				t.Errorf("round %d won by both %s and %s: Compare and Write is not atomic", r, prev, g)
			}
			owner[r] = g
			n++
		}
		t.Logf("%s won %d rounds", g, n)
	}
	// A race that never happened proves nothing: the hosts must have
	// collided (a round's loser gets Compare Failure).
	if miscompares == 0 {
		t.Errorf("no Compare Failure in %d rounds: the two hosts never raced", rounds)
	}
	t.Logf("%d Compare Failures over %d rounds", miscompares, rounds)
	for r := 1; r <= rounds; r++ {
		if _, ok := owner[r]; !ok {
			t.Errorf("round %d won by nobody", r)
		}
	}
	t.Logf("fused pairs through blkd: %v", s.metric(api, "blk_target_fused_total"))
}

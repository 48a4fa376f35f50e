// Package testseed gives a seeded randomized test its seed: the time, or
// the value of BLK_SEED to replay a run. The seed is logged at the start
// and, if the test fails, again with the command that replays it.
package testseed

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Env is the environment variable that replays a seed.
const Env = "BLK_SEED"

// Seed returns t's seed and logs it; pkg ("./target/tcp/") completes
// the replay command logged on failure.
func Seed(t testing.TB, pkg string) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(Env); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", Env, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (%s=%d replays it)", seed, Env, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("failed with seed %d: %s=%d go test -run '%s' %s", seed, Env, seed, t.Name(), pkg)
		}
	})
	return seed
}

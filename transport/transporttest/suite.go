package transporttest

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
)

// Harness describes a provider under test.
type Harness struct {
	// NewAdapter opens a fresh adapter; the suite closes it (t.Cleanup).
	NewAdapter func(t testing.TB) transport.Adapter
	// ListenAddr is where listeners bind, e.g. "127.0.0.1:0".
	ListenAddr string
}

// SeedEnv names the environment variable that replays a run: BLK_SEED=<n>.
const SeedEnv = "BLK_SEED"

// Deadlines. Generous: they bound a hung provider, they are not
// performance claims.
const (
	// waitTimeout bounds every wait for a completion, a notification or a
	// connection.
	waitTimeout = 10 * time.Second
	// quiet is how long the suite watches for something that must not
	// happen (a notification without an arm, a completion past the last).
	quiet = 100 * time.Millisecond
)

// testCase is one registered subtest.
type testCase struct {
	name string
	fn   func(t *T)
}

// cases lists the subtests in the order they run: the numbered rules, then
// the behaviour the API promises on top of them.
var cases = []testCase{
	{"C1", testC1}, {"C2", testC2}, {"C3", testC3}, {"C4", testC4},
	{"C5", testC5}, {"C6", testC6}, {"C7", testC7},
	{"Q1", testQ1}, {"Q2", testQ2}, {"Q3", testQ3}, {"Q4", testQ4},
	{"Q5", testQ5}, {"Q6", testQ6}, {"Q7", testQ7},
	{"S1", testS1}, {"S2", testS2}, {"S3", testS3}, {"S4", testS4},
	{"S5", testS5},
	{"M1", testM1}, {"M2", testM2}, {"M3", testM3}, {"M4", testM4},
	{"M5", testM5}, {"M6", testM6}, {"M7", testM7}, {"M8", testM8},
	{"M9", testM9}, {"M10", testM10}, {"M11", testM11}, {"M12", testM12},
	{"M13", testM13},
	{"SendReceiveIntegrity", testSendReceiveIntegrity},
	{"WriteIntegrity", testWriteIntegrity},
	{"ReadIntegrity", testReadIntegrity},
	{"ReadSinkLocal", testReadSinkLocal},
	{"SendInvalidate", testSendInvalidate},
	{"FastRegisterAndInvalidate", testFastRegisterAndInvalidate},
	{"InlineSend", testInlineSend},
	{"QueueFull", testQueueFull},
	{"DeferredPost", testDeferredPost},
	{"SendWithoutReceive", testSendWithoutReceive},
	{"AccessViolation", testAccessViolation},
	{"DisconnectInFlight", testDisconnectInFlight},
	{"ManyQPsOneSRQ", testManyQPsOneSRQ},
	{"RejectWithPrivateData", testRejectWithPrivateData},
	{"PrivateDataLimits", testPrivateDataLimits},
	{"MemoryWindows", testMemoryWindows},
	{"SRQThresholdRefill", testSRQThresholdRefill},
	{"SRQReceiverWait", testSRQReceiverWait},
	{"SRQSplitReceive", testSRQSplitReceive},
	{"AllocateMemory", testAllocateMemory},
}

// Run runs the conformance suite against the provider h describes. Each
// subtest opens its own adapters, so subtests are independent and any one
// can be run alone with -run 'TestConformance/<name>'.
func Run(t *testing.T, h Harness) {
	if h.NewAdapter == nil {
		t.Fatal("transporttest: Harness.NewAdapter is nil")
	}
	if h.ListenAddr == "" {
		h.ListenAddr = "127.0.0.1:0"
	}
	seed := seedFromEnv(t)
	t.Logf("transporttest: seed %d (replay with %s=%d)", seed, SeedEnv, seed)
	for _, c := range cases {
		t.Run(c.name, func(tt *testing.T) {
			c.fn(newT(tt, h, seed))
		})
	}
}

func seedFromEnv(t *testing.T) uint64 {
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("transporttest: %s=%q is not an unsigned integer: %v", SeedEnv, s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// T is the suite's view of a subtest: the testing.T, the harness, and a
// random source derived from the run's seed and the subtest's name (so one
// subtest replays alone with the same data). Its Fatalf and Errorf append
// the seed to every failure message.
type T struct {
	*testing.T
	h    Harness
	seed uint64
	rng  *rand.Rand
}

func newT(tt *testing.T, h Harness, seed uint64) *T {
	f := fnv.New64a()
	f.Write([]byte(tt.Name()))
	return &T{T: tt, h: h, seed: seed, rng: rand.New(rand.NewPCG(seed, f.Sum64()))}
}

// Run runs f as a subtest of t with its own T.
func (t *T) Run(name string, f func(t *T)) bool {
	return t.T.Run(name, func(tt *testing.T) { f(newT(tt, t.h, t.seed)) })
}

func (t *T) seedNote() string {
	return fmt.Sprintf(" [seed %d; replay with %s=%d]", t.seed, SeedEnv, t.seed)
}

// Fatalf fails the subtest with the seed appended. Call it only from the
// subtest's goroutine.
func (t *T) Fatalf(format string, args ...any) {
	t.Helper()
	t.T.Fatal(fmt.Sprintf(format, args...) + t.seedNote())
}

// Fatal is Fatalf without formatting.
func (t *T) Fatal(args ...any) {
	t.Helper()
	t.T.Fatal(fmt.Sprint(args...) + t.seedNote())
}

// Errorf marks the subtest failed with the seed appended; safe from any
// goroutine.
func (t *T) Errorf(format string, args ...any) {
	t.Helper()
	t.T.Error(fmt.Sprintf(format, args...) + t.seedNote())
}

// Error is Errorf without formatting.
func (t *T) Error(args ...any) {
	t.Helper()
	t.T.Error(fmt.Sprint(args...) + t.seedNote())
}

// info returns the limits of a fresh adapter.
func (t *T) info() transport.AdapterInfo {
	t.Helper()
	return t.adapter().Info()
}

// adapter opens a fresh adapter and closes it when the subtest ends (after
// everything created on it, since cleanups run last-in first-out).
func (t *T) adapter() transport.Adapter {
	t.Helper()
	a := t.h.NewAdapter(t.T)
	if a == nil {
		t.Fatal("Harness.NewAdapter returned nil")
	}
	t.Cleanup(func() { a.Close() })
	return a
}

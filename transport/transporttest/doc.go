// Package transporttest is the conformance suite every transport provider
// must pass: the soft iWARP-over-TCP provider, an in-process loop provider,
// real RDMA hardware. A provider is done when Run passes against it.
//
// Run registers one subtest per numbered rule of
// shared/docs/ndk-semantics.md, named exactly by the rule (C1–C7, Q1–Q7,
// S1–S5, M1–M13), and further subtests for behaviour the API in package
// transport promises on top of the rules: data integrity of send, write and
// read, send-with-invalidate, fast registration, inline sends, full queues,
// protocol and access errors, disconnects, many QPs on one SRQ, connection
// rejection and private data limits, memory windows, SRQ refill and
// provider-owned memory (PD.AllocateMemory).
//
// A provider calls it from one test:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, transporttest.Harness{
//			NewAdapter: func(t testing.TB) transport.Adapter { ... },
//			ListenAddr: "127.0.0.1:0",
//		})
//	}
//
// Optional features (transport/optional.go: fast registration, memory
// windows, flush) are found by type assertion, as consumers find them.
// Their subtests (FastRegisterAndInvalidate, SendInvalidate,
// MemoryWindows, the optional parts of Q5) run in full on a provider that
// has the interfaces. On one that lacks them, they check that the adapter
// advertises none of the feature (FRMRPageCount 0,
// FlagMemoryWindowsSupported clear), as an NDK adapter without the
// capability must, and skip naming the missing interface; Q4 cancels its
// deferred requests with Disconnect where there is no FlushQP.
//
// Everything random is drawn from one seed, printed at the start and in
// every failure message; BLK_SEED=<n> replays a run.
//
// Timing: the suite asserts ordering and thresholds with generous slack,
// never exact durations, so that it passes under -race on a loaded
// two-core machine. One-sided checks ("no notification within 100 ms") can
// only miss a bug, never invent one.
//
// What this package must never do: depend on any provider (it sees only the
// transport interfaces), reach into a provider's internals or counters,
// relax a rule to make a provider pass (a rule it cannot observe through the
// API is said so in the test, not guessed), bind or dial anything but the
// harness's ListenAddr on loopback, or sleep without a bound.
package transporttest

package soft_test

import (
	"testing"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
	"github.com/blk-project/blk/transport/transporttest"
)

// TestConformance runs the provider conformance suite against the soft
// provider.
func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Harness{
		NewAdapter: func(t testing.TB) transport.Adapter {
			a, err := soft.New(soft.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		ListenAddr: "127.0.0.1:0",
	})
}

// TestConformancePollGroup runs the suite with every CQ as a poll group
// (Config.PollGroup): the CQ's thread does its QPs' socket I/O.
func TestConformancePollGroup(t *testing.T) {
	transporttest.Run(t, transporttest.Harness{
		NewAdapter: func(t testing.TB) transport.Adapter {
			a, err := soft.New(soft.Config{PollGroup: true})
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		ListenAddr: "127.0.0.1:0",
	})
}

// TestConformancePollGroupSpin runs the suite once more with poll groups
// that busy-poll after work (Config.PollSpin), the hybrid path.
func TestConformancePollGroupSpin(t *testing.T) {
	if testing.Short() {
		t.Skip("the full suite a third time; -short runs it in goroutine and poll-group modes")
	}
	transporttest.Run(t, transporttest.Harness{
		NewAdapter: func(t testing.TB) transport.Adapter {
			a, err := soft.New(soft.Config{PollGroup: true, PollSpin: soft.SuggestedPollSpin})
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		ListenAddr: "127.0.0.1:0",
	})
}

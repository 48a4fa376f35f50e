package tcp_test

import (
	"strings"
	"testing"

	"github.com/blk-project/blk/target/tcp"
)

// TestValidateAddrErrors: a listen or advertised address the port
// refuses is an error that names the binding (target's checks name none).
func TestValidateAddrErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  tcp.Config
		want string
	}{
		{tcp.Config{Addr: "127.0.0.1"}, `tcp: listen address "127.0.0.1": `},
		{tcp.Config{Addr: "127.0.0.1:70000"}, `tcp: listen address "127.0.0.1:70000": port is not a number 0-65535`},
		{tcp.Config{AdvertiseAddr: "0.0.0.0"}, `tcp: advertised address "0.0.0.0" is an "any" address`},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate(%+v): %v, want an error starting %q", tc.cfg, err, tc.want)
		}
	}
}

// TestValidatePending: the per-source share of pending connections is
// within the port's total; by default a quarter of it.
func TestValidatePending(t *testing.T) {
	for _, tc := range []struct {
		cfg  tcp.Config
		want string
	}{
		{tcp.Config{MaxPending: 8, MaxPendingPerSource: 9}, "MaxPendingPerSource 9 is outside [1, MaxPending 8]"},
		{tcp.Config{MaxPendingPerSource: -1}, "MaxPendingPerSource -1"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v): %v, want an error with %q", tc.cfg, err, tc.want)
		}
	}
	for _, ok := range []tcp.Config{{}, {MaxPending: 2}, {MaxPending: 8, MaxPendingPerSource: 8}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v): %v", ok, err)
		}
	}
	if tcp.DefaultMaxPending < 4*tcp.DefaultMaxPendingPerSource {
		t.Errorf("default MaxPending %d is under 4 sources' share (%d each)", tcp.DefaultMaxPending, tcp.DefaultMaxPendingPerSource)
	}
}

package rdma_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/rdma"
)

// discoverOn reads the discovery log through addr and returns the
// TRADDR:TRSVCID of every entry for testSubNQN, with its address family.
func discoverOn(t *testing.T, addr string) (got []string, adrfam []uint8) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries, err := initiator.Discover(ctx, initiator.Config{Adapter: hostAdapter(t), HostNQN: testHostNQN}, addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.SubNQN.String() == testSubNQN {
			got = append(got, net.JoinHostPort(cstr(e.TrAddr[:]), cstr(e.TrSvcID[:])))
			adrfam = append(adrfam, e.AdrFam)
		}
	}
	if len(got) != 1 {
		t.Fatalf("discovery through %s: %d entries for %s (%v)", addr, len(got), testSubNQN, got)
	}
	return got, adrfam
}

// TestAdvertiseAddr: the discovery log and Port.AdvertisedAddr give the
// advertised address where one is set, and the listen address otherwise;
// a wildcard listen address is never reported as such.
func TestAdvertiseAddr(t *testing.T) {
	for _, tc := range []struct {
		name, listen, advertise string
		// want is the TRADDR:TRSVCID expected; PORT stands for the listen port.
		want, wantAdvertised string
		adrfam               uint8
	}{
		{"listen address", "127.0.0.1:0", "", "127.0.0.1:PORT", "127.0.0.1:PORT", nvme.AdrFamIPv4},
		{"advertised with port", "127.0.0.1:0", "192.0.2.10:14420", "192.0.2.10:14420", "192.0.2.10:14420", nvme.AdrFamIPv4},
		{"advertised without port", "127.0.0.1:0", "192.0.2.10", "192.0.2.10:PORT", "192.0.2.10:PORT", nvme.AdrFamIPv4},
		{"advertised IPv6", "127.0.0.1:0", "[2001:db8::7]:4420", "[2001:db8::7]:4420", "[2001:db8::7]:4420", nvme.AdrFamIPv6},
		// Wildcard without an advertised address: each connection is
		// told the address it arrived on; there is no single answer.
		{"wildcard", "0.0.0.0:0", "", "127.0.0.1:PORT", "", nvme.AdrFamIPv4},
		{"wildcard advertised", "0.0.0.0:0", "192.0.2.10", "192.0.2.10:PORT", "192.0.2.10:PORT", nvme.AdrFamIPv4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTestTarget(t, rdma.Config{Addr: tc.listen, AdvertiseAddr: tc.advertise, Cores: 1})
			_, port, _ := net.SplitHostPort(tt.addr)
			want := strings.ReplaceAll(tc.want, "PORT", port)
			got, fam := discoverOn(t, net.JoinHostPort("127.0.0.1", port))
			if got[0] != want || fam[0] != tc.adrfam {
				t.Errorf("discovery log entry %s (adrfam %d), want %s (adrfam %d)", got[0], fam[0], want, tc.adrfam)
			}
			if adv := tt.port.AdvertisedAddr(); adv != strings.ReplaceAll(tc.wantAdvertised, "PORT", port) {
				t.Errorf("AdvertisedAddr %q, want %q", adv, tc.wantAdvertised)
			}
		})
	}
}

// TestListenAddrErrors: a listen or advertised address the port refuses
// is an error that names the binding (target's checks name none).
func TestListenAddrErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  rdma.Config
		want string
	}{
		{rdma.Config{Addr: "127.0.0.1"}, `rdma: listen address "127.0.0.1": `},
		{rdma.Config{Addr: "127.0.0.1:0", AdvertiseAddr: "storage1.example"}, `rdma: advertised address "storage1.example"`},
	} {
		// Both are checked before the port touches the target or the adapter.
		if _, err := rdma.Listen(nil, nil, tc.cfg); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Listen(%+v): %v, want an error starting %q", tc.cfg, err, tc.want)
		}
	}
}

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

func TestParseAdvertiseAddr(t *testing.T) {
	for in, want := range map[string][2]string{
		"192.0.2.1":          {"192.0.2.1", ""},
		"192.0.2.1:4420":     {"192.0.2.1", "4420"},
		"2001:db8::1":        {"2001:db8::1", ""},
		"[2001:db8::1]":      {"2001:db8::1", ""},
		"[2001:db8::1]:4420": {"2001:db8::1", "4420"},
	} {
		h, p, err := rdma.ParseAdvertiseAddr(in)
		if err != nil || h != want[0] || p != want[1] {
			t.Errorf("ParseAdvertiseAddr(%q) = %q, %q, %v; want %q, %q", in, h, p, err, want[0], want[1])
		}
	}
	for in, msg := range map[string]string{
		"":                   "not an IP address",
		"storage1.example":   "not an IP address",
		"storage1:4420":      "not an IP address",
		"192.0.2.1:0":        "not a number 1-65535",
		"192.0.2.1:70000":    "not a number 1-65535",
		"0.0.0.0":            `"any" address`,
		"[::]:4420":          `"any" address`,
		"192.0.2.1:4420:1":   "not an IP address",
		"192.0.2.1:nvme-rdm": "not a number",
	} {
		if _, _, err := rdma.ParseAdvertiseAddr(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseAdvertiseAddr(%q): %v, want an error saying %q", in, err, msg)
		}
	}
	for addr, want := range map[string]bool{
		"0.0.0.0:4420": true, "[::]:4420": true, ":4420": true, "127.0.0.1:4420": false, "[::1]:4420": false, "bad": false,
	} {
		if got := rdma.IsWildcardHost(addr); got != want {
			t.Errorf("IsWildcardHost(%q) = %v", addr, got)
		}
	}
}

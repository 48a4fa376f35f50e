package target_test

import (
	"strings"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

func TestParseAdvertiseAddr(t *testing.T) {
	for in, want := range map[string][2]string{
		"192.0.2.1":          {"192.0.2.1", ""},
		"192.0.2.1:4420":     {"192.0.2.1", "4420"},
		"2001:db8::1":        {"2001:db8::1", ""},
		"[2001:db8::1]":      {"2001:db8::1", ""},
		"[2001:db8::1]:4420": {"2001:db8::1", "4420"},
		"2001:DB8:0::1":      {"2001:db8::1", ""},
	} {
		h, p, err := target.ParseAdvertiseAddr(in)
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
		_, _, err := target.ParseAdvertiseAddr(in)
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseAdvertiseAddr(%q): %v, want an error saying %q", in, err, msg)
		}
		// No package prefix: the binding (or blkd) that checks its
		// configuration adds its own.
		if err != nil && !strings.HasPrefix(err.Error(), "advertised address ") {
			t.Errorf("ParseAdvertiseAddr(%q): %v, want an error without a package prefix", in, err)
		}
	}
}

func TestIsWildcardHost(t *testing.T) {
	for addr, want := range map[string]bool{
		"0.0.0.0:4420": true, "[::]:4420": true, ":4420": true, "[0:0::0]:4420": true,
		"127.0.0.1:4420": false, "[::1]:4420": false, "bad": false, "0.0.0.0": false,
	} {
		if got := target.IsWildcardHost(addr); got != want {
			t.Errorf("IsWildcardHost(%q) = %v", addr, got)
		}
	}
}

func TestCheckListenAddr(t *testing.T) {
	for _, addr := range []string{":4420", "0.0.0.0:0", "127.0.0.1:65535", "[::1]:4420", "storage1:4420"} {
		if err := target.CheckListenAddr(addr); err != nil {
			t.Errorf("CheckListenAddr(%q): %v", addr, err)
		}
	}
	for addr, msg := range map[string]string{
		"127.0.0.1":       "missing port",
		"127.0.0.1:70000": "port is not a number 0-65535",
		"127.0.0.1:nvme":  "port is not a number 0-65535",
	} {
		err := target.CheckListenAddr(addr)
		if err == nil || !strings.HasPrefix(err.Error(), "listen address ") || !strings.Contains(err.Error(), msg) {
			t.Errorf("CheckListenAddr(%q): %v, want an error saying %q", addr, err, msg)
		}
	}
}

func TestSplitHostPortAdrFam(t *testing.T) {
	for addr, want := range map[string]struct {
		host, port string
		fam        uint8
	}{
		"127.0.0.1:4420":     {"127.0.0.1", "4420", nvme.AdrFamIPv4},
		"[fd00::7]:4420":     {"fd00::7", "4420", nvme.AdrFamIPv6},
		"[::ffff:1.2.3.4]:1": {"::ffff:1.2.3.4", "1", nvme.AdrFamIPv4},
		"[::]:4420":          {"::", "4420", nvme.AdrFamIPv6},
		"rxe0":               {"rxe0", "", nvme.AdrFamIPv4}, // not host:port: all host
	} {
		host, port := target.SplitHostPort(addr)
		if host != want.host || port != want.port {
			t.Errorf("SplitHostPort(%q) = %q, %q; want %q, %q", addr, host, port, want.host, want.port)
		}
		if fam := target.AdrFam(host); fam != want.fam {
			t.Errorf("AdrFam(%q) = %d, want %d", host, fam, want.fam)
		}
	}
}

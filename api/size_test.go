package api

import (
	"encoding/json"
	"testing"
)

// TestParseSize: the one size grammar blkd's API and blkctl's flags share.
func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"512": 512, "4KiB": 4096, "10GiB": 10 << 30, "1.5TiB": 3 << 39, "10GB": 10e9, "4k": 4096,
		"1 MiB": 1 << 20, "2MB": 2e6, "8B": 8, "1G": 1 << 30, "1TB": 1e12, "0": 0, "4194305TiB": 4194305 << 40,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "ten", "10XB", "1.5", "-4KiB", "1e3", "GiB", "99999999999PiB", "0.3KiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
	for n, want := range map[uint64]string{512: "512 B", 4096: "4 KiB", 10 << 30: "10 GiB", 3 << 39: "1.5 TiB"} {
		if got := HumanSize(n); got != want {
			t.Errorf("HumanSize(%d) = %q, want %q", n, got, want)
		}
	}
	var s struct{ Size Size }
	if err := json.Unmarshal([]byte(`{"Size": "1.5KiB"}`), &s); err != nil || s.Size != 1536 {
		t.Errorf("string size: %d, %v", s.Size, err)
	}
	if err := json.Unmarshal([]byte(`{"Size": 8192}`), &s); err != nil || s.Size != 8192 {
		t.Errorf("number size: %d, %v", s.Size, err)
	}
	if err := json.Unmarshal([]byte(`{"Size": 1.5}`), &s); err == nil {
		t.Error("fractional number of bytes accepted")
	}
}

package api

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestParseSize: the one size grammar blkd's API and blkctl's flags share.
func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"512": 512, "4KiB": 4096, "10GiB": 10 << 30, "1.5TiB": 3 << 39, "10GB": 10e9, "4k": 4096,
		"1Gi": 1 << 30, "10Gi": 10 << 30, "512Mi": 512 << 20, "4Ki": 4096, "2Ti": 2 << 40, "1Pi": 1 << 50,
		"1.5Gi": 3 << 29, "1 gi": 1 << 30, "10GI": 10 << 30,
		"1 MiB": 1 << 20, "2MB": 2e6, "8B": 8, "1G": 1 << 30, "1TB": 1e12, "0": 0, "4194305TiB": 4194305 << 40,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "ten", "10XB", "1.5", "-4KiB", "1e3", "GiB", "99999999999PiB", "0.3KiB", "1Ei", "1iB", "0.3Ki"} {
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

// TestCheckBlockMultiple: a size that is not whole blocks is refused with
// the nearest valid sizes, and the binary unit for a decimal one.
func TestCheckBlockMultiple(t *testing.T) {
	for _, c := range []struct {
		in   string
		bs   uint64
		want string
	}{
		{"10GB", 4096, "10GB is 10000000000 bytes, not a multiple of the block size 4096: use 9999998976 or 10000003072, or 10GiB"},
		{"1.5 tb", 4096, "1.5 tb is 1500000000000 bytes, not a multiple of the block size 4096: use 1499999997952 or 1500000002048, or 1.5TiB"},
		{"4097", 4096, "4097 is 4097 bytes, not a multiple of the block size 4096: use 4096 or 8192"},
		{"100", 512, "100 is 100 bytes, not a multiple of the block size 512: use 512"},
	} {
		n, err := ParseSize(c.in)
		if err != nil {
			t.Fatal(err)
		}
		err = CheckBlockMultiple(c.in, n, c.bs)
		if err == nil || err.Error() != c.want {
			t.Errorf("CheckBlockMultiple(%q): %v\nwant %s", c.in, err, c.want)
		}
	}
	for _, in := range []string{"10GiB", "10Gi", "4096", "4096KB", "1G"} {
		n, _ := ParseSize(in)
		if err := CheckBlockMultiple(in, n, 4096); err != nil {
			t.Errorf("CheckBlockMultiple(%q): %v", in, err)
		}
	}
}

// TestSizeHelpExamples: every example SizeHelp names parses, and the
// binary ones are whole 4096-byte blocks (the help must not suggest a size
// volume create refuses).
func TestSizeHelpExamples(t *testing.T) {
	for _, ex := range []string{"512", "4KiB", "10GiB", "10Gi", "1.5TiB", "4TB"} {
		if !strings.Contains(SizeHelp, ex) {
			t.Fatalf("SizeHelp no longer names %s: update this test", ex)
		}
		n, err := ParseSize(ex)
		if err != nil {
			t.Errorf("SizeHelp's %s: %v", ex, err)
		}
		if ex != "512" && n%4096 != 0 {
			t.Errorf("SizeHelp's %s = %d bytes is not a multiple of 4096", ex, n)
		}
	}
}

// FuzzSizeRoundTrip: HumanSize's output parses back to n within its
// rounding (two decimals of the unit), or is refused only for not being
// whole bytes.
func FuzzSizeRoundTrip(f *testing.F) {
	for _, n := range []uint64{0, 512, 4096, 10 << 30, 3 << 39, 1<<64 - 1} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n uint64) {
		h := HumanSize(n)
		got, err := ParseSize(strings.ReplaceAll(h, " ", ""))
		if strings.HasSuffix(h, "EiB") {
			if err == nil {
				t.Fatalf("ParseSize(%q) accepted an unknown unit", h)
			}
			return
		}
		if err != nil {
			// Two decimals of KiB are not always whole bytes ("4.04 KiB");
			// any other refusal is a grammar the two disagree on.
			if !strings.Contains(err.Error(), "not a whole number of bytes") {
				t.Fatalf("ParseSize(HumanSize(%d) = %q): %v", n, h, err)
			}
			return
		}
		if got == n {
			return
		}
		// Rounded to two decimals: within half a hundredth of the unit.
		unit := uint64(1)
		for i, u := range []string{" KiB", " MiB", " GiB", " TiB", " PiB"} {
			if strings.HasSuffix(h, u) {
				unit = 1 << (10 * (i + 1))
			}
		}
		diff := got - n
		if n > got {
			diff = n - got
		}
		if diff*200 > unit {
			t.Fatalf("HumanSize(%d) = %q parses to %d", n, h, got)
		}
	})
}

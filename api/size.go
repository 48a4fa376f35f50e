// Package api holds what blkd's management API and its clients (blkctl,
// tests) share: the request and response types of /v1, and the one size
// grammar both parse.
package api

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// sizeUnits are the units ParseSize accepts, matched case-insensitively
// (longest first): binary KiB…PiB, Kubernetes' quantity suffixes Ki…Pi
// (binary too), K…P (binary, blk's meaning since the start; Kubernetes'
// M and G are decimal, so the help says to write Mi and Gi), decimal
// KB…PB, and B.
var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40}, {"pib", 1 << 50},
	{"ki", 1 << 10}, {"mi", 1 << 20}, {"gi", 1 << 30}, {"ti", 1 << 40}, {"pi", 1 << 50},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"pb", 1e15},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"p", 1 << 50},
	{"b", 1},
}

// SizeHelp describes the grammar, for error messages.
const SizeHelp = "a number of bytes with an optional unit, like 512, 4KiB, 10GiB, 10Gi, 1.5TiB (binary: KiB/Ki/K … PiB/Pi/P) or 4TB (decimal: KB … PB)"

// CheckBlockMultiple refuses a size n (written as in) that is not a whole
// number of blocks of bs bytes, naming the nearest valid sizes and, for a
// decimal size, the binary unit that was probably meant ("10GB is
// 10000000000 bytes, not a multiple of 4096: use 9999998976 or
// 10000003072, or 10GiB").
func CheckBlockMultiple(in string, n, bs uint64) error {
	if bs == 0 || n%bs == 0 {
		return nil
	}
	down, up := n/bs*bs, (n/bs+1)*bs
	use := fmt.Sprintf("use %d or %d", down, up)
	if down == 0 {
		use = fmt.Sprintf("use %d", up)
	}
	if bin := binaryOf(in); bin != "" {
		use += ", or " + bin
	}
	return fmt.Errorf("%s is %d bytes, not a multiple of the block size %d: %s", in, n, bs, use)
}

// binaryOf rewrites a decimal size ("10GB", "1.5 TB") in the binary unit
// of the same letter ("10GiB", "1.5TiB"), or returns "" when in has no
// decimal unit.
func binaryOf(in string) string {
	str := strings.TrimSpace(in)
	i := strings.IndexFunc(str, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		return ""
	}
	unit := strings.ToLower(strings.TrimSpace(str[i:]))
	if len(unit) != 2 || unit[1] != 'b' || !strings.ContainsRune("kmgtp", rune(unit[0])) {
		return ""
	}
	return strings.TrimSpace(str[:i]) + strings.ToUpper(unit[:1]) + "iB"
}

// ParseSize parses a byte count with an optional unit; fractions are
// allowed as long as the result is a whole number of bytes.
func ParseSize(s string) (uint64, error) {
	str := strings.TrimSpace(s)
	num, mult := str, uint64(1)
	if i := strings.IndexFunc(str, func(r rune) bool { return (r < '0' || r > '9') && r != '.' }); i >= 0 {
		unit := strings.TrimSpace(str[i:])
		num = strings.TrimSpace(str[:i])
		found := false
		for _, u := range sizeUnits {
			if strings.ToLower(unit) == u.suffix {
				mult, found = u.mult, true
				break
			}
		}
		if !found {
			return 0, fmt.Errorf("size %q: unknown unit %q: use %s", s, unit, SizeHelp)
		}
	}
	if num == "" {
		return 0, fmt.Errorf("size %q has no number: use %s", s, SizeHelp)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok || r.Sign() < 0 {
		return 0, fmt.Errorf("size %q: %q is not a number: use %s", s, num, SizeHelp)
	}
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).SetUint64(mult)))
	if !r.IsInt() {
		return 0, fmt.Errorf("size %q is not a whole number of bytes: use %s", s, SizeHelp)
	}
	if !r.Num().IsUint64() {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return r.Num().Uint64(), nil
}

// HumanSize formats n in the largest binary unit that keeps it ≥ 1, with
// up to two decimals ("10 GiB", "1.5 TiB", "512 B").
func HumanSize(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	v := float64(n)
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + " " + units[i]
}

// Size is a byte count in JSON: a number of bytes, or a string in
// ParseSize's grammar ("10GiB", "1.5TiB", "4096").
type Size uint64

// UnmarshalJSON implements json.Unmarshaler.
func (s *Size) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		n, err := ParseSize(str)
		*s = Size(n)
		return err
	}
	var n uint64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("size %s: a whole number of bytes or a string like \"10GiB\"", b)
	}
	*s = Size(n)
	return nil
}

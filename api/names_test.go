package api

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"v", "vol1", "Vol-1_a.b", "a..b", "1", "x.", strings.Repeat("a", MaxNameLen)} {
		if err := CheckName("volume name", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "...", "../x", "a/b", "/a", "%2e%2e", "a%2Fb", ".hidden", "-v", "_v",
		"a b", "a\\b", "a?b", "a#b", "a:b", "é", "a\x00", "a\n", strings.Repeat("a", MaxNameLen+1)} {
		err := CheckName("volume name", bad)
		if !errors.Is(err, ErrName) || !strings.Contains(err.Error(), "volume name") {
			t.Errorf("%q: %v, want ErrName naming the volume name", bad, err)
		}
	}
}

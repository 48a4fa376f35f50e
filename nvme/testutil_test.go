package nvme

import (
	"encoding/hex"
	"strings"
	"testing"
)

// hexBytes parses space-separated hex, ignoring "|" separators used to
// mark field boundaries in expected layouts.
func hexBytes(t *testing.T, s string) []byte {
	t.Helper()
	s = strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex in test: %v", err)
	}
	return b
}

func equalBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: length %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: byte %d = %#02x, want %#02x", what, i, got[i], want[i])
		}
	}
}

package providers

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestOpen(t *testing.T) {
	a, err := Open("", Options{})
	if err != nil {
		t.Fatalf("default provider: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(Names(), "soft") {
		t.Errorf("Names %v lacks soft", Names())
	}
	if _, err := Open("soft", Options{Device: "rxe0"}); err == nil || !strings.Contains(err.Error(), "no device") {
		t.Errorf("soft with a device: %v", err)
	}
	if err := Check("nope"); !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), "soft") {
		t.Errorf("unknown provider: %v", err)
	}
	if slices.Contains(Names(), "verbs") {
		if err := Check("verbs"); err != nil {
			t.Errorf("verbs registered but Check says %v", err)
		}
	} else if err := Check("verbs"); !errors.Is(err, ErrNotBuilt) || !strings.Contains(err.Error(), "-tags verbs") {
		t.Errorf("verbs in a build without it: %v", err)
	}
}

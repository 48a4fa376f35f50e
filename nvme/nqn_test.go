package nvme

import (
	"strings"
	"testing"
)

func TestValidateNQN(t *testing.T) {
	long := "nqn.2026-01.io.blk:" + strings.Repeat("x", MaxNQNLen-len("nqn.2026-01.io.blk:"))
	cases := []struct {
		nqn  string
		want error
	}{
		{DiscoveryNQN, nil},
		{testHostNQN, nil},
		{"nqn.2026-01.io.blk:vol1", nil},
		{"nqn.2014-08.com.Example-Corp:sub system/with spaces", nil},
		{"nqn.2026-12.io.blk", nil},
		{long, nil},
		{long + "x", ErrNQNLength},
		{"", ErrNQNLength},
		{"nqn.", ErrNQN},
		{"iqn.2026-01.io.blk:x", ErrNQN},
		{"nqn.26-01.io.blk:x", ErrNQN},
		{"nqn.2026-13.io.blk:x", ErrNQN},
		{"nqn.2026-00.io.blk:x", ErrNQN},
		{"nqn.2026_01.io.blk:x", ErrNQN},
		{"nqn.2026-01:x", ErrNQN},
		{"nqn.2026-01.:x", ErrNQN},
		{"nqn.2026-01..io:x", ErrNQN},
		{"nqn.2026-01.io..blk:x", ErrNQN},
		{"nqn.2026-01.io.blk.:x", ErrNQN},
		{"nqn.2026-01.io_blk:x", ErrNQN},
		{"nqn.2026-01.io.blk:x\x00y", ErrNQN},
		{"nqn.2026-01.io.blk:x\ny", ErrNQN},
		{"nqn.2026-0a.io.blk:x", ErrNQN},
	}
	for _, tc := range cases {
		if got := ValidateNQN(tc.nqn); got != tc.want {
			t.Errorf("ValidateNQN(%q) = %v, want %v", tc.nqn, got, tc.want)
		}
	}
	if DiscoveryNQN != "nqn.2014-08.org.nvmexpress.discovery" {
		t.Fatal("discovery NQN")
	}
}

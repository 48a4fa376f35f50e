package volume

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	c := Config{Dir: "/x"}.WithDefaults()
	if c.MaxTransferBytes != DefaultMaxTransferBytes || c.PointDeleteMaxBlocks != DefaultPointDeleteMaxBlocks ||
		c.MemTableBytes != DefaultMemTableBytes || c.CacheBytes != DefaultCacheBytes || c.FS == nil ||
		c.SyncInterval != DefaultSyncInterval {
		t.Fatalf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.WithDefaults() != c {
		t.Fatal("WithDefaults is not idempotent")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
	}{
		{"no dir", Config{}},
		{"transfer below a block", Config{Dir: "d", MaxTransferBytes: 512}},
		{"transfer not 4K multiple", Config{Dir: "d", MaxTransferBytes: 6144}},
		{"negative transfer", Config{Dir: "d", MaxTransferBytes: -4096}},
		{"memtable too small", Config{Dir: "d", MaxTransferBytes: 1 << 20, MemTableBytes: 2 << 20}},
		{"point deletes too many", Config{Dir: "d", MaxTransferBytes: 4096, MemTableBytes: 1 << 20, PointDeleteMaxBlocks: 9}},
		{"point deletes negative", Config{Dir: "d", PointDeleteMaxBlocks: -1}},
		{"negative cache", Config{Dir: "d", CacheBytes: -1}},
		{"sync interval above the maximum", Config{Dir: "d", SyncInterval: MaxSyncInterval + 1}},
	} {
		err := tc.c.Validate()
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", tc.name, err)
		}
		if _, err := Open(tc.c); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Open = %v, want ErrInvalid", tc.name, err)
		}
	}
}

// TestConfigRoundTrip: a config dumped as JSON loads back unchanged.
func TestConfigRoundTrip(t *testing.T) {
	c := Config{Dir: "/var/lib/blk", MaxTransferBytes: 128 << 10, PointDeleteMaxBlocks: 16,
		MemTableBytes: 32 << 20, CacheBytes: 1 << 30, ReadOnly: true, SyncInterval: -1}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back != c {
		t.Fatalf("round trip: %+v, want %+v (%s)", back, c, b)
	}
	d := Config{Dir: "x"}.WithDefaults()
	d.FS = nil
	b, _ = json.Marshal(d)
	back = Config{}
	_ = json.Unmarshal(b, &back)
	if back != d {
		t.Fatalf("round trip of defaults: %+v, want %+v", back, d)
	}
}

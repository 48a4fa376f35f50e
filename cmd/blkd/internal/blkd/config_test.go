package blkd

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"4096": 4096, "10GiB": 10 << 30, "512MiB": 512 << 20, "1G": 1 << 30, "3KiB": 3 << 10,
		"1TB": 1e12, "2 MiB": 2 << 20, "100B": 100, "0": 0,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "ten", "1.5GiB", "-1", "GiB", "99999999999TiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) succeeded", in)
		}
	}
	var s struct{ Size Size }
	if err := json.Unmarshal([]byte(`{"Size": "1KiB"}`), &s); err != nil || s.Size != 1024 {
		t.Errorf("string size: %d, %v", s.Size, err)
	}
	if err := json.Unmarshal([]byte(`{"Size": 8192}`), &s); err != nil || s.Size != 8192 {
		t.Errorf("number size: %d, %v", s.Size, err)
	}
	if err := json.Unmarshal([]byte(`{"Size": 1.5}`), &s); err == nil {
		t.Error("fractional size accepted")
	}
}

func TestConfig(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.DataDir != DefaultDataDir || c.NodeID != "node1" || c.RaftAddr != "127.0.0.1:7000" ||
		c.NVMeAddr != "127.0.0.1:4420" || c.APIAddr != "127.0.0.1:7070" || !*c.Bootstrap {
		t.Fatalf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// The dump loads back unchanged.
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := LoadConfigFile(path)
	if err != nil || !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip: %+v, %v; want %+v", back, err, c)
	}
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Cores: -2}, "--cores -2"},
		{Config{APIAddr: "nohost"}, `--api-addr "nohost"`},
		{Config{Join: "nohost"}, `--join "nohost"`},
	} {
		err := tc.c.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.c, err, tc.want)
		}
	}
}

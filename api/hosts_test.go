package api

import (
	"encoding/json"
	"testing"
	"time"
)

// TestHostJSON: a registered host's time is RFC 3339 in UTC with
// nanoseconds, and empty name and zone are left out; it decodes back.
func TestHostJSON(t *testing.T) {
	at := time.Unix(1764201600, 5).In(time.FixedZone("CET", 3600))
	h := Host{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:a", RegisteredAt: at.UTC()}
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"host_nqn":"nqn.2014-08.org.nvmexpress:uuid:a","registered_at":"2025-11-27T00:00:00.000000005Z"}`; string(b) != want {
		t.Fatalf("got %s, want %s", b, want)
	}
	var back Host
	if err := json.Unmarshal(b, &back); err != nil || !back.RegisteredAt.Equal(at) || back.HostNQN != h.HostNQN {
		t.Fatalf("decoded %+v, %v", back, err)
	}
}

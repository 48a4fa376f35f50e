package api

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestRFC3339Times: every object with a Unix-nanosecond time also carries
// it as RFC 3339 (UTC, nanoseconds), its other fields unchanged, nested
// objects included; a zero time writes no RFC 3339 field; decoding the
// output gives the object back.
func TestRFC3339Times(t *testing.T) {
	const ns = 1795700000123456789
	want := time.Unix(0, ns).UTC().Format(time.RFC3339Nano)
	v := Volume{Name: "v", CreatedAt: ns,
		Replicas:    []Replica{{Node: "n1", Since: ns}},
		Attachments: []Attachment{{HostNQN: "h", Since: ns}},
		Flatten:     &FlattenProgress{Since: ns}}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, frag := range []string{
		`"name":"v"`, `"created_at":1795700000123456789`, `"created":"` + want + `"`,
		`"replicas":[{"node":"n1"`, `"since":1795700000123456789`, `"since_time":"` + want + `"`,
	} {
		if !strings.Contains(s, frag) {
			t.Errorf("volume JSON lacks %s:\n%s", frag, s)
		}
	}
	if n := strings.Count(s, `"since_time":"`+want+`"`); n != 3 {
		t.Errorf("%d since_time fields, want 3 (replica, attachment, flatten):\n%s", n, s)
	}
	var back Volume
	if err := json.Unmarshal(b, &back); err != nil || back.CreatedAt != ns || back.Replicas[0].Since != ns || back.Attachments[0].Since != ns || back.Flatten.Since != ns {
		t.Errorf("round trip: %+v, %v", back, err)
	}
	sb, err := json.Marshal(Snapshot{Name: "s", Volume: "v", CreatedAt: ns})
	if err != nil || !strings.Contains(string(sb), `"created":"`+want+`"`) || !strings.Contains(string(sb), `"created_at":1795700000123456789`) {
		t.Errorf("snapshot JSON: %s, %v", sb, err)
	}
	zb, _ := json.Marshal(Volume{Name: "z"})
	if strings.Contains(string(zb), `"created"`) {
		t.Errorf("zero time written: %s", zb)
	}
	lb, _ := json.Marshal(VolumeList{Volumes: []Volume{v}})
	if !strings.Contains(string(lb), `"created":"`+want+`"`) {
		t.Errorf("list lacks created: %s", lb)
	}
}

package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestHostsFeatureGate: Node.Apply refuses to propose Op 31 and 32 while
// a registered node lacks FeatureHosts, naming it (nothing reaches the
// log), and proposes them once every node has it; a name outside the
// grammar is refused before the gate.
func TestHostsFeatureGate(t *testing.T) {
	n := startSolo(t, t.TempDir(), vfs.NewMem(), nil)
	defer n.Close()
	ctx := context.Background()
	for _, c := range []Command{
		RegisterNode{ID: "a", TCPAddr: "a:1", MgmtAddr: "a:2", Features: []string{FeatureHosts}},
		RegisterNode{ID: "old", TCPAddr: "o:1", MgmtAddr: "o:2", Features: []string{FeatureReservations}},
	} {
		if _, err := n.Apply(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	reg := RegisterHost{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:h", Name: "w1", Zone: "z1", At: 7}
	before := n.AppliedIndex()
	for _, c := range []Command{reg, UnregisterHost{HostNQN: reg.HostNQN}} {
		if _, err := n.Apply(ctx, c); !errors.Is(err, ErrFeatureMissing) || !strings.Contains(err.Error(), "node old") || !strings.Contains(err.Error(), `"hosts"`) {
			t.Fatalf("%v proposed while node old lacks the feature: %v", c.Op(), err)
		}
	}
	if _, err := n.Apply(ctx, RegisterHost{HostNQN: reg.HostNQN, Name: "bad name"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a bad name: %v, want ErrInvalid before the gate", err)
	}
	if n.AppliedIndex() != before {
		t.Fatal("a refused proposal reached the log")
	}
	if _, err := n.Apply(ctx, RegisterNode{ID: "old", TCPAddr: "o:1", MgmtAddr: "o:2", Features: []string{FeatureHosts}}); err != nil {
		t.Fatal(err)
	}
	r, err := n.Apply(ctx, reg)
	if err != nil || r.Host == nil || *r.Host != (Host{HostNQN: reg.HostNQN, Name: "w1", Zone: "z1", RegisteredAt: 7}) {
		t.Fatalf("register once upgraded: %+v, %v", r.Host, err)
	}
	var h Host
	var ok bool
	n.FSM().Read(func(s *State) { h, ok = s.Host(reg.HostNQN) })
	if !ok || h.Name != "w1" {
		t.Fatalf("registry holds %+v, %v", h, ok)
	}
	if _, err := n.Apply(ctx, UnregisterHost{HostNQN: reg.HostNQN}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Apply(ctx, UnregisterHost{HostNQN: reg.HostNQN}); !errors.Is(err, ErrUnknownHost) {
		t.Fatalf("unregister twice: %v, want ErrUnknownHost", err)
	}
}

// TestHostsSnapshot: registered hosts survive a snapshot round trip
// byte for byte; a registry without hosts encodes as before them (no
// "hosts" key); a snapshot with a host twice or a bad name is refused.
func TestHostsSnapshot(t *testing.T) {
	s := NewState()
	if b := s.MarshalState(); bytes.Contains(b, []byte(`"hosts"`)) {
		t.Fatalf("a registry without hosts writes them: %s", b)
	}
	mustApply(t, s, RegisterHost{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:b", Name: "b", At: 2})
	mustApply(t, s, RegisterHost{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:a", Name: "a", Zone: "z", At: 1})
	b := s.MarshalState()
	s2, err := UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	if b2 := s2.MarshalState(); !bytes.Equal(b, b2) {
		t.Fatalf("round trip changed the state:\n%s\n%s", b, b2)
	}
	if hs := s2.Hosts(); len(hs) != 2 || hs[0].Name != "a" || hs[0].Zone != "z" || hs[1].RegisteredAt != 2 {
		t.Fatalf("hosts after restore: %+v", hs)
	}
	for what, bad := range map[string]string{
		"twice":    `{"version":1,"index":2,"next_volume_id":1,"nodes":[],"volumes":[],"connections":[],"hosts":[{"host_nqn":"nqn.2014-08.x:a","registered_at":1},{"host_nqn":"nqn.2014-08.x:a","registered_at":1}]}`,
		"bad name": `{"version":1,"index":2,"next_volume_id":1,"nodes":[],"volumes":[],"connections":[],"hosts":[{"host_nqn":"nqn.2014-08.x:a","name":"a b","registered_at":1}]}`,
		"bad nqn":  `{"version":1,"index":2,"next_volume_id":1,"nodes":[],"volumes":[],"connections":[],"hosts":[{"host_nqn":"x","registered_at":1}]}`,
	} {
		if _, err := UnmarshalState([]byte(bad)); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("snapshot with a host %s: %v, want ErrBadSnapshot", what, err)
		}
	}
}

// TestHostsLimit: past MaxHosts a new host is refused with ErrLimit; a
// registered one still updates.
func TestHostsLimit(t *testing.T) {
	s := NewState()
	for i := range MaxHosts {
		s.hosts[fmt.Sprintf("nqn.2014-08.x:%d", i)] = &Host{HostNQN: fmt.Sprintf("nqn.2014-08.x:%d", i)}
	}
	if r := s.Apply(1, RegisterHost{HostNQN: "nqn.2014-08.x:new"}); !errors.Is(r.Err, ErrLimit) {
		t.Fatalf("host %d: %v, want ErrLimit", MaxHosts+1, r.Err)
	}
	if r := s.Apply(2, RegisterHost{HostNQN: "nqn.2014-08.x:0", Name: "zero"}); r.Err != nil || r.Host.Name != "zero" {
		t.Fatalf("a registered host at the limit: %+v", r)
	}
}

// TestHostCommandsEncode: Op 31 and 32 round-trip through the log
// encoding under their numbers.
func TestHostCommandsEncode(t *testing.T) {
	for _, c := range []Command{
		RegisterHost{HostNQN: "nqn.2014-08.x:a", Name: "a", Zone: "z", At: 3},
		UnregisterHost{HostNQN: "nqn.2014-08.x:a"},
	} {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[Op]byte{OpRegisterHost: 31, OpUnregisterHost: 32}[c.Op()]; b[1] != want {
			t.Errorf("%v encodes as op %d, want %d", c.Op(), b[1], want)
		}
		got, err := DecodeCommand(b)
		if err != nil || got != c {
			t.Errorf("decode %v: %+v, %v", c.Op(), got, err)
		}
	}
}

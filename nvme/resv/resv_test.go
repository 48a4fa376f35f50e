package resv

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
)

func host(b byte) HostID { return HostID{0: b} }

// TestAccessTable checks Access for the six types against the
// specification's table: holder, registrant (not holder), non-registrant.
func TestAccessTable(t *testing.T) {
	const rw, r, none = AllRights, ReadOK, Rights(0)
	table := []struct {
		typ                 Type
		holder, reg, nonreg Rights
	}{
		{WriteExclusive, rw, r, r},
		{ExclusiveAccess, rw, none, none},
		{WriteExclusiveRegsOnly, rw, rw, r},
		{ExclusiveAccessRegsOnly, rw, rw, none},
		{WriteExclusiveAllRegs, rw, rw, r},
		{ExclusiveAccessAllRegs, rw, rw, none},
	}
	a, b, c := host('A'), host('B'), host('C')
	for _, tc := range table {
		s := State{Type: tc.typ, Regs: []Registrant{{Host: a, Key: 1}, {Host: b, Key: 2}}}
		if !tc.typ.AllRegistrants() {
			s.Holder = a
		}
		if err := Check(&s); err != nil {
			t.Fatalf("%s: %v", tc.typ, err)
		}
		if got := Access(&s, a); got != tc.holder {
			t.Errorf("%s holder: %v, want %v", tc.typ, got, tc.holder)
		}
		if got := Access(&s, b); got != tc.reg {
			t.Errorf("%s registrant: %v, want %v", tc.typ, got, tc.reg)
		}
		if got := Access(&s, c); got != tc.nonreg {
			t.Errorf("%s non-registrant: %v, want %v", tc.typ, got, tc.nonreg)
		}
		if got := Access(&s, HostID{}); got != tc.nonreg {
			t.Errorf("%s zero host: %v, want %v", tc.typ, got, tc.nonreg)
		}
	}
	// Nothing held: registrants alone refuse nothing.
	s := State{Regs: []Registrant{{Host: a}}}
	for _, h := range []HostID{a, c, {}} {
		if Access(&s, h) != AllRights || Access(nil, h) != AllRights {
			t.Errorf("nothing held: %v refused", h)
		}
	}
}

// TestMaxRegistrants: registration number MaxRegistrants+1 is refused with
// Internal Error (DNR), by Register and by Replace with IEKEY alike.
func TestMaxRegistrants(t *testing.T) {
	var s State
	for i := range MaxRegistrants {
		var h HostID
		binary.BigEndian.PutUint32(h[:], uint32(i+1))
		var o Outcome
		s, o = Apply(s, Command{Op: Register, Host: h, NRKEY: uint64(i)})
		if !o.Status.Success() {
			t.Fatalf("registrant %d: %v", i, o.Status)
		}
	}
	extra := Command{Op: Register, Host: host('Z'), NRKEY: 9}
	for _, c := range []Command{extra, {Op: Register, Action: nvme.RREGAReplace, IEKEY: true, Host: host('Z')}} {
		n, o := Apply(s, c)
		if o.Status != nvme.StatusInternalError.WithDNR() || len(n.Regs) != MaxRegistrants || n.Gen != s.Gen {
			t.Fatalf("%+v: %v with %d registrants, gen %d", c, o.Status, len(n.Regs), n.Gen)
		}
	}
	if err := Check(&s); err != nil {
		t.Fatal(err)
	}
}

// TestReport checks the extended Reservation Status data structure byte
// for byte, its truncation, and EDS 0.
func TestReport(t *testing.T) {
	s := &State{
		Gen: 0x01020304, Type: WriteExclusiveRegsOnly, Holder: host('B'), PTPL: true,
		Regs: []Registrant{
			{Host: HostID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, Key: 0x1122334455667788},
			{Host: host('B'), Key: 0xB2},
		},
	}
	want := make([]byte, 64+2*64)
	copy(want, []byte{0x04, 0x03, 0x02, 0x01, 3, 2, 0, 0, 0, 1})
	e := want[64:]
	copy(e, []byte{0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11})
	copy(e[16:], []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	e = want[128:]
	copy(e, []byte{0xFF, 0xFF, 1, 0, 0, 0, 0, 0, 0xB2})
	e[16] = 'B'
	if n := s.ReportSize(); n != len(want) {
		t.Fatalf("ReportSize %d, want %d", n, len(want))
	}
	got := bytes.Repeat([]byte{0xEE}, len(want)+8)
	if st := s.Report(true, got); st != nvme.StatusSuccess {
		t.Fatalf("status %v", st)
	}
	if !bytes.Equal(got[:len(want)], want) || !bytes.Equal(got[len(want):], make([]byte, 8)) {
		t.Fatalf("report\n got %x\nwant %x", got, want)
	}
	// Truncated: the bytes that fit, REGCTL still counts both.
	for _, n := range []int{0, 4, 63, 64, 100, 128, 191} {
		short := bytes.Repeat([]byte{0xEE}, n)
		if st := s.Report(true, short); st != nvme.StatusSuccess {
			t.Fatalf("len %d: status %v", n, st)
		}
		if !bytes.Equal(short, want[:n]) {
			t.Fatalf("len %d:\n got %x\nwant %x", n, short, want[:n])
		}
	}
	// All registrants: every registrant holds it.
	ar := &State{Type: ExclusiveAccessAllRegs, Regs: s.Regs}
	buf := make([]byte, 192)
	ar.Report(true, buf)
	if buf[4] != 6 || buf[64+2] != 1 || buf[128+2] != 1 || buf[9] != 0 {
		t.Fatalf("all registrants: %x", buf)
	}
	// Nothing: the header alone, zero.
	var empty *State
	buf = bytes.Repeat([]byte{0xEE}, 64)
	if st := empty.Report(true, buf); st != nvme.StatusSuccess || !bytes.Equal(buf, make([]byte, 64)) {
		t.Fatalf("nil state: %v %x", st, buf)
	}
	if st := s.Report(false, buf); st != nvme.StatusHostIDInconsistent.WithDNR() {
		t.Fatalf("EDS 0: %v", st)
	}
	if a := testing.AllocsPerRun(100, func() { s.Report(true, got) }); a != 0 {
		t.Fatalf("Report allocates %.1f", a)
	}
}

// TestStateJSON: a state round-trips through JSON (the registry's
// encoding), host IDs as hex.
func TestStateJSON(t *testing.T) {
	s := State{Gen: 7, Type: WriteExclusive, Holder: host('A'), PTPL: true, Index: 42,
		Regs:   []Registrant{{Host: host('A'), Key: 1, NQN: "nqn.2014-08.org.nvmexpress:uuid:a"}},
		Recent: []Done{{Token: 9, Out: Outcome{Notices: []Notice{{Host: host('B'), Kind: RegistrationPreempted}}, Abort: []HostID{host('B')}}}}}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back State
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !equalState(s, back) {
		t.Fatalf("round trip:\n%+v\n%+v\n%s", s, back, b)
	}
	if !bytes.Contains(b, []byte(`"holder":"41000000000000000000000000000000"`)) {
		t.Fatalf("holder not hex: %s", b)
	}
	b, _ = json.Marshal(State{})
	if string(b) != `{"gen":0}` {
		t.Fatalf("empty state: %s", b)
	}
	if err := json.Unmarshal([]byte(`{"holder":"41"}`), &back); err == nil {
		t.Fatal("short host ID accepted")
	}
}

// randomCommand draws a command over a small universe of hosts and keys,
// so that conflicts, matches and preemptions all happen.
func randomCommand(r *rand.Rand) Command {
	keys := []uint64{0, 0xA1, 0xB2, 0xC3}
	c := Command{
		Op:     Op(r.IntN(6)),
		Action: uint8(r.IntN(4)),
		Type:   Type(r.IntN(8)),
		CRKEY:  keys[r.IntN(len(keys))],
		NRKEY:  keys[r.IntN(len(keys))],
		CPTPL:  uint8(r.IntN(4)),
		IEKEY:  r.IntN(4) == 0,
		Host:   host(byte('A' + r.IntN(4))),
	}
	if r.IntN(20) == 0 {
		c.Host = HostID{}
	}
	if r.IntN(3) == 0 {
		c.Token = uint64(1 + r.IntN(40))
	}
	if r.IntN(8) == 0 { // mostly valid commands
		return c
	}
	c.Op = Op(1 + r.IntN(5))
	c.Type = Type(1 + r.IntN(6))
	c.Action = uint8(r.IntN(3))
	if c.Op == Release {
		c.Action = uint8(r.IntN(2))
	}
	if c.CPTPL == 1 {
		c.CPTPL = 0
	}
	if c.Op == SetPTPL {
		c.CPTPL = 2 + uint8(r.IntN(2))
	}
	return c
}

// checkStep applies c to s and checks the properties of FuzzApply.
func checkStep(t *testing.T, s State, c Command) State {
	t.Helper()
	before := s.clone()
	n, o := Apply(s, c)
	if err := Check(&n); err != nil {
		t.Fatalf("%+v: %v\nbefore %+v\nafter %+v", c, err, before, n)
	}
	if !equalState(s, before) {
		t.Fatalf("%+v modified its input", c)
	}
	if !o.Status.Success() && !equalState(n, s) {
		t.Fatalf("%+v refused (%v) but changed the state", c, o.Status)
	}
	if !o.Status.Success() && !o.Status.DNR() {
		t.Fatalf("%+v: refusal %v without DNR", c, o.Status)
	}
	// The result shares nothing with the input: scribble on a copy of it.
	scribble := n.clone()
	for i := range n.Regs {
		n.Regs[i].Key ^= 0xFFFF
	}
	for i := range n.Recent {
		n.Recent[i].Token ^= 0xFFFF
	}
	if !equalState(s, before) {
		t.Fatalf("%+v: the result shares memory with the input", c)
	}
	n = scribble
	// A replayed token gets the same outcome and changes nothing.
	if c.Token != 0 {
		again, o2 := Apply(n, c)
		if !o.Status.Success() {
			if o2.Status != o.Status {
				t.Fatalf("%+v: refusal %v, again %v", c, o.Status, o2.Status)
			}
		} else if !equalOutcome(o, o2) || !equalState(again, n) {
			t.Fatalf("%+v: replay gave %+v (was %+v)", c, o2, o)
		}
	}
	replayed := false
	for _, d := range before.Recent {
		replayed = replayed || c.Token != 0 && d.Token == c.Token
	}
	if replayed && !equalState(n, before) {
		t.Fatalf("%+v: a replayed token changed the state", c)
	}
	if !replayed && o.Status.Success() && c.Op == Acquire && c.Action == nvme.RACQAAcquire && !n.Holds(c.Host) {
		t.Fatalf("%+v succeeded but %v does not hold", c, c.Host)
	}
	return n
}

func equalOutcome(a, b Outcome) bool {
	return a.Status == b.Status && equalJSON(a.Notices, b.Notices) && equalJSON(a.Abort, b.Abort)
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// TestApplyRandom runs seeded random command sequences through checkStep.
func TestApplyRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	defer func() {
		if t.Failed() {
			t.Logf("replay with seed %d", seed)
		}
	}()
	r := rand.New(rand.NewPCG(seed, 0))
	for range 200 {
		var s State
		for range 60 {
			s = checkStep(t, s, randomCommand(r))
		}
	}
}

// FuzzApply: random command sequences decoded from the input; after each,
// the invariants hold, the input is unchanged, a refusal changes nothing,
// a replayed token gets the same outcome.
func FuzzApply(f *testing.F) {
	f.Add([]byte{1, 0, 0, 1, 1, 0, 0, 2, 0, 1, 1, 1, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 1, 1, 0, 1, 0, 0, 2, 2, 0, 2, 0, 0, 1, 0, 1, 2, 1, 2, 1, 1, 2, 0, 6, 0, 0})
	f.Add([]byte{1, 3, 0, 2, 2, 0, 2, 1, 1, 3, 3, 6, 2, 2, 0, 1, 0, 3, 5, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var s State
		keys := []uint64{0, 0xA1, 0xB2, 0xC3}
		for len(data) >= 6 {
			d := data[:6]
			data = data[6:]
			c := Command{
				Op:     Op(d[0] % 7),
				Action: d[1] % 4,
				Host:   host(byte('A' + d[2]%4)),
				CRKEY:  keys[d[3]%4],
				NRKEY:  keys[d[3]/4%4],
				Type:   Type(d[4] % 8),
				CPTPL:  d[5] % 4,
				IEKEY:  d[5]&4 != 0,
			}
			if d[2]&0x80 != 0 {
				c.Host = HostID{}
			}
			if d[5]&8 != 0 {
				c.Token = uint64(d[5] >> 4)
			}
			s = checkStep(t, s, c)
		}
	})
}

// BenchmarkAccess: a host's rights under a held reservation with 16
// registrants (what the target computes once per queue per change).
func BenchmarkAccess(b *testing.B) {
	s := State{Type: WriteExclusiveRegsOnly, Holder: host(1)}
	for i := range 16 {
		s.Regs = append(s.Regs, Registrant{Host: host(byte(i + 1)), Key: uint64(i)})
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if Access(&s, host(byte(i%20+1))) == 0 {
			b.Fatal("refused")
		}
	}
}

func TestClearAll(t *testing.T) {
	s := State{Gen: 4, Type: WriteExclusive, Holder: host('A'), PTPL: true,
		Regs:   []Registrant{{Host: host('A'), Key: 1}, {Host: host('B'), Key: 2}},
		Recent: []Done{{Token: 3}}}
	before := s.clone()
	n, o := ClearAll(s)
	if !equalState(s, before) {
		t.Fatal("ClearAll modified its input")
	}
	want := State{Gen: 5, PTPL: true, Recent: []Done{{Token: 3}}}
	if !equalState(n, want) || !o.Status.Success() || len(o.Notices) != 2 ||
		o.Notices[0] != (Notice{Host: host('A'), Kind: ReservationPreempted}) || o.Notices[1].Host != host('B') {
		t.Fatalf("ClearAll: %+v %+v", n, o)
	}
	if again, o := ClearAll(n); !equalState(again, n) || len(o.Notices) != 0 {
		t.Fatalf("ClearAll of nothing: %+v %+v", again, o)
	}
}

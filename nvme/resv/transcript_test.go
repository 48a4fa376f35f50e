package resv

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/transcript"
	"github.com/blk-project/blk/nvme"
)

var rewrite = flag.Bool("resv.rewrite", false, "rewrite the expected output of testdata/*.txt transcripts")

// TestApplyTranscript runs testdata/apply.txt. Each block is a directive
// line, input lines, "----", and the expected output up to a blank line:
//
//	run      one command per line, applied to the running state; each prints
//	         its outcome and the state after it
//	reset    the running state becomes empty
//	access   one host per line: its rights now
//
// A command line is "<verb> <host> [key=value ...] [iekey]": verbs
// register, unregister, replace, acquire, preempt, preempt-abort, release,
// clear, set-ptpl, power-loss, raw (op= action= as numbers); keys crkey,
// nrkey, prkey (hex), type (WE, EA-RO, ... or a number), cptpl, token,
// nqn. A host is a short name ("A"); "0" is the zero host ID.
func TestApplyTranscript(t *testing.T) {
	path := "testdata/apply.txt"
	var s State
	transcript.Run(t, path, *rewrite, func(directive string, input []string, start int) []string {
		var got []string
		switch directive {
		case "run":
			for _, in := range input {
				c, err := parseCommand(in)
				if err != nil {
					t.Fatalf("%s:%d: %q: %v", path, start, in, err)
				}
				before := s.clone()
				n, o := Apply(s, c)
				if err := Check(&n); err != nil {
					t.Errorf("%s:%d: after %q: %v", path, start, in, err)
				}
				if !equalState(s, before) {
					t.Errorf("%s:%d: %q modified its input", path, start, in)
				}
				s = n
				got = append(got, in+": "+describeOutcome(o), "  "+describeState(&s))
			}
		case "reset":
			s = State{}
		case "access":
			for _, in := range input {
				got = append(got, in+": "+describeRights(Access(&s, parseHost(in))))
			}
		default:
			t.Fatalf("%s:%d: unknown directive %q", path, start, directive)
		}
		return got
	})
}

func parseHost(s string) HostID {
	var h HostID
	if s != "0" {
		copy(h[:], s)
	}
	return h
}

func hostName(h HostID) string {
	if h.IsZero() {
		return "0"
	}
	n := strings.TrimRight(string(h[:]), "\x00")
	for _, r := range n {
		if r < '!' || r > '~' {
			return h.String()
		}
	}
	return n
}

// verbs are the transcripts' commands: the op and action each sets
// (raw sets neither: op= and action= give them).
var verbs = map[string]struct {
	op     Op
	action uint8
}{
	"register":      {Register, nvme.RREGARegister},
	"unregister":    {Register, nvme.RREGAUnregister},
	"replace":       {Register, nvme.RREGAReplace},
	"acquire":       {Acquire, nvme.RACQAAcquire},
	"preempt":       {Acquire, nvme.RACQAPreempt},
	"preempt-abort": {Acquire, nvme.RACQAPreemptAndAbort},
	"release":       {Release, nvme.RRELARelease},
	"clear":         {Release, nvme.RRELAClear},
	"set-ptpl":      {SetPTPL, 0},
	"power-loss":    {PowerLoss, 0},
	"raw":           {},
}

func parseCommand(line string) (Command, error) {
	f := strings.Fields(line)
	if len(f) < 1 {
		return Command{}, fmt.Errorf("empty command")
	}
	var c Command
	v, ok := verbs[f[0]]
	if !ok {
		return c, fmt.Errorf("unknown verb %q", f[0])
	}
	c.Op, c.Action = v.op, v.action
	args := f[1:]
	if c.Op != PowerLoss || (len(args) > 0 && !strings.Contains(args[0], "=")) {
		if len(args) == 0 {
			return c, fmt.Errorf("no host")
		}
		c.Host = parseHost(args[0])
		args = args[1:]
	}
	for _, a := range args {
		if a == "iekey" {
			c.IEKEY = true
			continue
		}
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return c, fmt.Errorf("bad argument %q", a)
		}
		num := func(base int, bits int) (uint64, error) { return strconv.ParseUint(v, base, bits) }
		var err error
		var n uint64
		switch k {
		case "crkey":
			c.CRKEY, err = num(16, 64)
		case "nrkey", "prkey":
			c.NRKEY, err = num(16, 64)
		case "type":
			t, ok := ParseType(v)
			if !ok {
				err = fmt.Errorf("bad type %q", v)
			}
			c.Type = t
		case "cptpl":
			n, err = num(10, 8)
			c.CPTPL = uint8(n)
		case "token":
			c.Token, err = num(10, 64)
		case "nqn":
			c.NQN = v
		case "op":
			n, err = num(10, 8)
			c.Op = Op(n)
		case "action":
			n, err = num(10, 8)
			c.Action = uint8(n)
		default:
			err = fmt.Errorf("unknown key %q", k)
		}
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

func describeOutcome(o Outcome) string {
	var b strings.Builder
	b.WriteString(o.Status.String())
	if len(o.Notices) > 0 {
		b.WriteString(" notices=")
		for i, n := range o.Notices {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(hostName(n.Host) + ":" + n.Kind.String())
		}
	}
	if len(o.Abort) > 0 {
		b.WriteString(" abort=")
		for i, h := range o.Abort {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(hostName(h))
		}
	}
	return b.String()
}

func describeState(s *State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gen=%d type=%s", s.Gen, s.Type)
	if !s.Holder.IsZero() {
		b.WriteString(" holder=" + hostName(s.Holder))
	}
	if s.PTPL {
		b.WriteString(" ptpl")
	}
	b.WriteString(" regs=")
	if len(s.Regs) == 0 {
		b.WriteString("-")
	}
	for i, r := range s.Regs {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%s:%x", hostName(r.Host), r.Key)
	}
	if len(s.Recent) > 0 {
		b.WriteString(" tokens=")
		for i, d := range s.Recent {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "%d", d.Token)
		}
	}
	return b.String()
}

func describeRights(r Rights) string {
	switch r {
	case AllRights:
		return "read write"
	case ReadOK:
		return "read"
	case 0:
		return "none"
	}
	return fmt.Sprintf("Rights(%d)", r)
}

package meta

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/transcript"
)

var rewrite = flag.Bool("meta.rewrite", false, "rewrite the expected output of testdata/*.txt transcripts")

// sentinels names every error a Result can carry, for transcripts.
var sentinels = []struct {
	name string
	err  error
}{
	{"ErrBadCommand", ErrBadCommand}, {"ErrInvalid", ErrInvalid}, {"ErrLimit", ErrLimit},
	{"ErrUnknownNode", ErrUnknownNode}, {"ErrNodeNotUp", ErrNodeNotUp},
	{"ErrNodeInUse", ErrNodeInUse}, {"ErrVolumeExists", ErrVolumeExists}, {"ErrNQNInUse", ErrNQNInUse},
	{"ErrUnknownVolume", ErrUnknownVolume}, {"ErrBadBlockSize", ErrBadBlockSize},
	{"ErrSizeNotMultiple", ErrSizeNotMultiple}, {"ErrShrink", ErrShrink}, {"ErrBadTransition", ErrBadTransition},
	{"ErrVolumeNotOnline", ErrVolumeNotOnline}, {"ErrVolumeDeleting", ErrVolumeDeleting},
	{"ErrHasConnections", ErrHasConnections}, {"ErrHostNotAllowed", ErrHostNotAllowed},
	{"ErrAlreadyConnected", ErrAlreadyConnected}, {"ErrNotConnected", ErrNotConnected},
	{"ErrStaleEpoch", ErrStaleEpoch}, {"ErrNoCapacity", ErrNoCapacity},
	{"ErrUnknownSnapshot", ErrUnknownSnapshot}, {"ErrSnapshotExists", ErrSnapshotExists},
	{"ErrSnapshotNotReady", ErrSnapshotNotReady}, {"ErrHasClones", ErrHasClones},
	{"ErrHasChildren", ErrHasChildren}, {"ErrHasSnapshots", ErrHasSnapshots},
	{"ErrNotClone", ErrNotClone}, {"ErrBusy", ErrBusy},
	{"ErrUnknownHost", ErrUnknownHost},
}

func sentinelName(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return "unknown error: " + err.Error()
}

// runTranscript interprets one transcript. Each block is a directive line,
// input lines, "----", and the expected output up to a blank line:
//
//	apply                      one command per line: <op-name> <JSON body>
//	apply-verbose              as apply, with each error's message (what
//	                           operators read: it must name the objects)
//	state                      the registry, one line per object
//
// Lines starting with # between blocks are comments.
func runTranscript(t *testing.T, path string) {
	s := NewState()
	var index uint64
	byName := map[string]Op{}
	for op, name := range opNames {
		byName[name] = op
	}
	transcript.Run(t, path, *rewrite, func(directive string, input []string, start int) []string {
		var got []string
		switch directive {
		case "apply", "apply-verbose":
			for _, in := range input {
				name, body, _ := strings.Cut(in, " ")
				op, ok := byName[name]
				if !ok {
					t.Fatalf("%s:%d: unknown op %q", path, start, name)
				}
				index++
				r := s.ApplyBytes(index, append([]byte{CommandVersion, byte(op)}, body...))
				d := describe(r)
				if r.Err != nil && directive == "apply-verbose" {
					d += ": " + r.Err.Error()
				}
				got = append(got, fmt.Sprintf("%d %s: %s", index, name, d))
				if err := snapshotInvariants(s); err != nil {
					t.Errorf("%s:%d: after %s: %v", path, start, in, err)
				}
			}
		case "state":
			got = describeState(s)
		default:
			t.Fatalf("%s:%d: unknown directive %q", path, start, directive)
		}
		return got
	})
}

func describe(r Result) string {
	if r.Err != nil {
		return "error " + sentinelName(r.Err)
	}
	switch {
	case r.Reservation != nil:
		return "ok " + describeOutcome(*r.Reservation) + " → " + describeVolume(*r.Volume)
	case r.Volume != nil:
		return "ok " + describeVolume(*r.Volume)
	case r.Node != nil:
		return "ok " + describeNode(*r.Node)
	case r.Host != nil:
		return "ok " + describeHost(*r.Host)
	}
	return "ok"
}

func describeVolume(v Volume) string {
	s := fmt.Sprintf("volume %s id=%d size=%d bs=%d node=%s %v nqn=%s", v.Name, v.ID, v.SizeBytes, v.BlockSize, v.Node, v.State, v.NQN)
	if v.AllowAny {
		s += " allow-any"
	}
	if len(v.Hosts) > 0 {
		s += " hosts=" + strings.Join(v.Hosts, ",")
	}
	if len(v.Replicas) > 0 {
		var rs []string
		for _, r := range v.Replicas {
			d := r.Node + ":" + string(r.State)
			if r.Full {
				d += "(full)"
			}
			if r.Reason != "" {
				d += fmt.Sprintf("(%s)", r.Reason)
			}
			if r.ReplacedBy != "" {
				d += "(replaced-by " + r.ReplacedBy + ")"
			}
			rs = append(rs, d)
		}
		s += fmt.Sprintf(" epoch=%d want=%d replicas=%s", v.Epoch, v.Want, strings.Join(rs, ","))
	}
	if v.Parent != 0 {
		s += fmt.Sprintf(" parent=%d", v.Parent)
	}
	if v.CloneOf != nil {
		s += fmt.Sprintf(" clone-of=%s(%d)", v.CloneOf, v.CloneOf.ID)
	}
	if v.Flatten != nil {
		s += fmt.Sprintf(" flatten-since=%d", v.Flatten.Since)
	}
	if v.Reverted != 0 {
		s += fmt.Sprintf(" reverted=%d", v.Reverted)
	}
	for _, sn := range v.Snapshots {
		s += " " + describeSnapshot(sn)
	}
	if r := v.Reservation; r != nil {
		s += " " + describeReservation(r)
	}
	return s
}

func describeSnapshot(sn VolumeSnapshot) string {
	s := fmt.Sprintf("@%s(id=%d %v size=%d at=%d nodes=%s", sn.Name, sn.ID, sn.State, sn.SizeBytes, sn.CreatedAt, strings.Join(sn.Nodes, ","))
	if sn.Parent != 0 {
		s += fmt.Sprintf(" parent=%d", sn.Parent)
	}
	return s + ")"
}

func describeNode(n NodeInfo) string {
	s := fmt.Sprintf("node %s %v target=%s mgmt=%s", n.ID, n.State, n.TargetAddr, n.MgmtAddr)
	if n.Zone != "" {
		s += " zone=" + n.Zone
	}
	if n.Ordinal != 0 {
		s += fmt.Sprintf(" ordinal=%d", n.Ordinal)
	}
	if len(n.Features) > 0 {
		s += " features=" + strings.Join(n.Features, ",")
	}
	return s
}

func describeHost(h Host) string {
	return fmt.Sprintf("host %s name=%s zone=%s registered=%d", h.HostNQN, h.Name, h.Zone, h.RegisteredAt)
}

func describeState(s *State) []string {
	snap := s.Export()
	out := []string{fmt.Sprintf("index=%d next-volume-id=%d", snap.Index, snap.NextVolumeID)}
	for _, n := range snap.Nodes {
		out = append(out, describeNode(n))
	}
	for _, v := range snap.Volumes {
		out = append(out, describeVolume(v))
	}
	for _, c := range snap.Connections {
		out = append(out, fmt.Sprintf("connection %s → %s via %s since=%d", c.HostNQN, c.Volume, c.Node, c.Since))
	}
	for _, h := range snap.Hosts {
		out = append(out, describeHost(h))
	}
	return out
}

// TestTranscripts runs testdata/*.txt; -meta.rewrite regenerates their
// expected output (review the diff).
func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runTranscript(t, f) })
	}
}

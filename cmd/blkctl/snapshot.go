package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/urfave/cli/v2"
)

// Snapshots and clones (docs/snapshots.md §3.2). A snapshot is named
// VOL@SNAP wherever blkctl takes one: '@' is outside the name grammar,
// so the form is never ambiguous.

// snapshotCommands are the volume verbs of snapshots and clones.
func snapshotCommands() []*cli.Command {
	return append([]*cli.Command{
		{
			Name: "snapshot", Usage: "take a read-only, crash-consistent point-in-time copy of a volume, also while hosts write (no data is copied)", UsageText: "blkctl volume snapshot VOLUME NAME",
			Action: volumeSnapshot,
		},
		{
			Name: "snapshots", Usage: "list a volume's snapshots with their sizes and the space each holds", UsageText: "blkctl volume snapshots VOLUME",
			Action: volumeSnapshots,
		},
		{
			Name: "clone", Usage: "make a writable volume from a snapshot; it shares the snapshot's data until written (or flattened)", UsageText: "blkctl volume clone VOLUME@SNAPSHOT NEWVOLUME [--nqn NQN]",
			Flags:  []cli.Flag{&cli.StringFlag{Name: "nqn", Usage: "the new volume's subsystem `NQN`; default: the cluster's NQN for its name"}},
			Action: volumeClone,
		},
		{
			Name: "flatten", Usage: "copy into a clone every block it still reads from its snapshot, so the snapshot can be deleted; hosts keep writing meanwhile", UsageText: "blkctl volume flatten VOLUME [--wait]",
			Flags:  []cli.Flag{&cli.BoolFlag{Name: "wait", Usage: "wait until the flatten is done, showing its progress on stderr"}},
			Action: volumeFlatten,
		},
		{
			Name: "revert", Usage: "make a volume's content (and size) its snapshot's again; refused while a host is connected", UsageText: "blkctl volume revert VOLUME SNAPSHOT",
			Action: volumeRevert,
		},
	}, imageCommands()...)
}

// splitSnap splits VOL@SNAP; ok is false when s has no '@'.
func splitSnap(s string) (vol, snap string, ok bool, err error) {
	vol, snap, ok = strings.Cut(s, "@")
	if !ok {
		return s, "", false, nil
	}
	if err := api.CheckName("volume name", vol); err != nil {
		return "", "", true, err
	}
	if err := api.CheckName("snapshot name", snap); err != nil {
		return "", "", true, err
	}
	return vol, snap, true, nil
}

func snapPath(vol, snap string) string {
	return volPath(vol) + "/snapshots/" + url.PathEscape(snap)
}

// noSnapshots turns the 404/405 of a blkd without snapshot routes into
// what to do.
func noSnapshots(e *env, err error) error {
	var ae *apiError
	if errors.As(err, &ae) && ae.notFoundRoute() {
		return fmt.Errorf("this blkd (%s) has no snapshots: upgrade every node to a blkd with POST /v1/volumes/{name}/snapshots", e.api.base)
	}
	return err
}

func volumeSnapshot(c *cli.Context) error {
	a, err := args(c, "volume", "snapshot")
	if err != nil {
		return err
	}
	if err := api.CheckName("SNAPSHOT", a[1]); err != nil {
		return usageErrorf("%s: %v", c.Command.FullName(), err)
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	start := time.Now()
	var s api.Snapshot
	if err := e.api.do("POST", volPath(a[0])+"/snapshots", api.SnapshotRequest{Name: a[1]}, &s); err != nil {
		return hint(noSnapshots(e, err), a[0], "")
	}
	took := time.Since(start)
	if e.json {
		return e.printJSON(s)
	}
	fmt.Fprintf(e.stdout, "snapshot %s@%s: %s, taken in %s (writes held %s), on %s\n", s.Volume, s.Name, api.HumanSize(s.SizeBytes),
		took.Round(time.Millisecond), time.Duration(s.HeldNanos).Round(10*time.Microsecond), strings.Join(s.Nodes, " "))
	return nil
}

func volumeSnapshots(c *cli.Context) error {
	a, err := args(c, "volume")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var l api.SnapshotList
	if err := e.api.do("GET", volPath(a[0])+"/snapshots", nil, &l); err != nil {
		return hint(noSnapshots(e, err), a[0], "")
	}
	if l.Snapshots == nil {
		l.Snapshots = []api.Snapshot{}
	}
	if e.json {
		return e.printJSON(l)
	}
	if len(l.Snapshots) == 0 {
		fmt.Fprintf(e.stdout, "volume %s has no snapshots (take one with: blkctl volume snapshot %s NAME)\n", a[0], a[0])
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "NAME\tSIZE\tCREATED\tSTATE\tOWNED\tEXCLUSIVE\tCLONES\tNODES")
	for _, s := range l.Snapshots {
		clones := "-"
		if len(s.Clones) > 0 {
			clones = strings.Join(s.Clones, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, api.HumanSize(s.SizeBytes), time.Unix(0, s.CreatedAt).UTC().Format(time.RFC3339),
			s.State, optSize(s.OwnedBytes), optSize(s.ExclusiveBytes), clones, strings.Join(s.Nodes, ","))
	}
	return tw.Flush()
}

// optSize is a byte count the primary may not have given.
func optSize(n *uint64) string {
	if n == nil {
		return "?"
	}
	return api.HumanSize(*n)
}

func volumeClone(c *cli.Context) error {
	a, err := args(c, "snapshot", "newvolume")
	if err != nil {
		return err
	}
	vol, snap, ok, err := splitSnap(a[0])
	switch {
	case err != nil:
		return usageErrorf("%s: %v", c.Command.FullName(), err)
	case !ok:
		return usageErrorf("%s: %q is not a snapshot: name it VOLUME@SNAPSHOT (blkctl volume snapshots VOLUME lists them)", c.Command.FullName(), a[0])
	}
	if err := api.CheckName("NEWVOLUME", a[1]); err != nil {
		return usageErrorf("%s: %v", c.Command.FullName(), err)
	}
	req := api.CloneRequest{Name: a[1]}
	if c.IsSet("nqn") {
		if err := checkNQN("--nqn", c.String("nqn")); err != nil {
			return usageErrorf("%s: %v", c.Command.FullName(), err)
		}
		req.NQN = c.String("nqn")
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var v volume
	if err := e.api.do("POST", snapPath(vol, snap)+"/clone", req, &v); err != nil {
		return hint(noSnapshots(e, err), vol, "")
	}
	if e.json {
		return e.printJSON(v)
	}
	fmt.Fprintf(e.stdout, "volume %s: clone of %s, %s, on %s\n", v.Name, a[0], api.HumanSize(v.SizeBytes), strings.Join(replicaNodes(v), " "))
	return nil
}

func replicaNodes(v volume) []string {
	if len(v.Replicas) == 0 {
		return []string{v.Node}
	}
	var out []string
	for _, r := range v.Replicas {
		out = append(out, r.Node)
	}
	return out
}

func volumeFlatten(c *cli.Context) error {
	a, err := args(c, "volume")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var v volume
	if err := e.api.do("POST", volPath(a[0])+"/flatten", nil, &v); err != nil {
		return hint(noSnapshots(e, err), a[0], "")
	}
	if !c.Bool("wait") {
		if e.json {
			return e.printJSON(v)
		}
		fmt.Fprintf(e.stdout, "flattening volume %s (clone of %s): follow it with blkctl volume show %s\n", v.Name, v.CloneOf, v.Name)
		return nil
	}
	origin := v.CloneOf
	start, last := time.Now(), time.Time{}
	for v.CloneOf != "" {
		if f := v.Flatten; f != nil && time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(e.stderr, "flatten %s: %s\n", v.Name, progressText(f.DoneBytes, f.TotalBytes, time.Since(start)))
		}
		time.Sleep(200 * time.Millisecond)
		v = volume{} // what the answer omits (clone_of once flat) must not keep its old value
		if err := e.api.do("GET", volPath(a[0]), nil, &v); err != nil {
			return err
		}
		if v.State == api.StateDeleting {
			return fmt.Errorf("volume %s is being deleted: its flatten ends", v.Name)
		}
	}
	if e.json {
		return e.printJSON(v)
	}
	fmt.Fprintf(e.stdout, "volume %s is flat: it no longer shares data with %s (took %s)\n", v.Name, origin, time.Since(start).Round(time.Millisecond))
	return nil
}

// progressText is "3.2 GiB of 9.1 GiB copied (35%), 410 MB/s, 14 s left".
func progressText(done, total uint64, took time.Duration) string {
	s := fmt.Sprintf("%s of %s copied", api.HumanSize(done), api.HumanSize(total))
	if total > 0 {
		s += fmt.Sprintf(" (%d%%)", done*100/total)
	}
	if secs := took.Seconds(); secs > 0 && done > 0 {
		rate := float64(done) / secs
		s += fmt.Sprintf(", %.0f MB/s", rate/1e6)
		if total > done {
			s += fmt.Sprintf(", %.0f s left", float64(total-done)/rate)
		}
	}
	return s
}

func volumeRevert(c *cli.Context) error {
	a, err := args(c, "volume", "snapshot")
	if err != nil {
		return err
	}
	snap := a[1]
	if vol, s, ok, err := splitSnap(snap); ok {
		// VOL@SNAP is accepted when VOL is the volume.
		if err != nil {
			return usageErrorf("%s: %v", c.Command.FullName(), err)
		}
		if vol != a[0] {
			return usageErrorf("%s: %s is a snapshot of volume %s, not of %s: a volume reverts only to its own snapshots", c.Command.FullName(), snap, vol, a[0])
		}
		snap = s
	}
	if err := api.CheckName("SNAPSHOT", snap); err != nil {
		return usageErrorf("%s: %v", c.Command.FullName(), err)
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var v volume
	if err := e.api.do("POST", volPath(a[0])+"/revert", api.RevertRequest{Snapshot: snap}, &v); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusConflict && strings.Contains(ae.Msg, "connected") {
			return fmt.Errorf("%s (with blkctl: disconnect the host, blkctl detach %s --host-nqn NQN, then revert)", ae.Msg, a[0])
		}
		return hint(noSnapshots(e, err), a[0], "")
	}
	if e.json {
		return e.printJSON(v)
	}
	fmt.Fprintf(e.stdout, "volume %s reverted to %s@%s (%s); epoch %d\n", v.Name, a[0], snap, api.HumanSize(v.SizeBytes), v.Epoch)
	return nil
}

// snapshotDelete is volume delete VOL@SNAP.
func snapshotDelete(c *cli.Context, e *env, vol, snap string) error {
	if err := e.api.do("DELETE", snapPath(vol, snap), nil, nil); err != nil {
		return hint(noSnapshots(e, err), vol, "")
	}
	if e.json {
		return e.printJSON(map[string]any{"deleted": vol + "@" + snap})
	}
	fmt.Fprintf(e.stdout, "deleted snapshot %s@%s\n", vol, snap)
	return nil
}

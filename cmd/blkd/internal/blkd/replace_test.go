package blkd

import (
	"reflect"
	"testing"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
)

// TestReplaceView: a replacement in progress shows on both replicas: the
// leaving one's replaced_by, the new one's replaces, with its reason.
func TestReplaceView(t *testing.T) {
	v := meta.Volume{Name: "r", Node: "n1", State: meta.VolumeOnline, Epoch: 1, Want: 3, Replicas: []meta.Replica{
		{Node: "n1", State: meta.ReplicaInSync, Since: 1},
		{Node: "n2", State: meta.ReplicaOutOfSync, Reason: "missed a write", Since: 2, ReplacedBy: "n4"},
		{Node: "n4", State: meta.ReplicaRebuilding, Reason: "replacing the replica on n2", Since: 3, Full: true},
		{Node: "n3", State: meta.ReplicaInSync, Since: 1},
	}}
	var a api.Volume
	a.State = api.StateOnline
	replicaView(v, &a)
	want := []api.Replica{
		{Node: "n1", State: api.ReplicaInSync, Since: 1, Primary: true},
		{Node: "n2", State: api.ReplicaOutOfSync, Reason: "missed a write", Since: 2, ReplacedBy: "n4"},
		{Node: "n4", State: api.ReplicaRebuilding, Reason: "replacing the replica on n2", Since: 3, Replaces: "n2"},
		{Node: "n3", State: api.ReplicaInSync, Since: 1},
	}
	if !reflect.DeepEqual(a.Replicas, want) {
		t.Fatalf("replicas %+v", a.Replicas)
	}
}

// TestReplacerDownFor: a node counts as down from the first round this
// leader saw it down; unknown nodes not at all.
func TestReplacerDownFor(t *testing.T) {
	t0 := time.Unix(100, 0)
	r := replacer{downSince: map[string]time.Time{"n2": t0}}
	f := r.downFor(t0.Add(7 * time.Second))
	if f("n2") != 7*time.Second || f("n3") != 0 {
		t.Fatalf("n2 %v, n3 %v", f("n2"), f("n3"))
	}
}

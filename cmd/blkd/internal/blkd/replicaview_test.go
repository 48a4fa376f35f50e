package blkd

import (
	"errors"
	"reflect"
	"testing"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
)

// TestReplicaView: the API's replica fields. A volume written before
// replicas shows one in-sync primary at epoch 1, wanting 1; an online
// volume with fewer copies in sync than wanted says "degraded: K/N in
// sync" and stays online; a reason already given (unavailable, failed) is
// kept.
func TestReplicaView(t *testing.T) {
	old := meta.Volume{Name: "o", Node: "n1", State: meta.VolumeOnline, CreatedAt: 5}
	var a api.Volume
	a.State = api.StateOnline
	replicaView(old, &a)
	want := []api.Replica{{Node: "n1", State: api.ReplicaInSync, Since: 5, Primary: true}}
	if a.Epoch != 1 || a.WantReplicas != 1 || !reflect.DeepEqual(a.Replicas, want) || a.Reason != "" {
		t.Fatalf("old volume: %+v", a)
	}

	r := meta.Volume{Name: "r", Node: "n2", State: meta.VolumeOnline, Epoch: 2, Want: 3, Replicas: []meta.Replica{
		{Node: "n1", State: meta.ReplicaOutOfSync, Reason: "primary lost at epoch 1", Since: 9},
		{Node: "n2", State: meta.ReplicaInSync, Since: 1},
		{Node: "n3", State: meta.ReplicaInSync, Since: 1},
	}}
	a = api.Volume{State: api.StateOnline}
	replicaView(r, &a)
	if a.State != api.StateOnline || a.Reason != "degraded: 2/3 in sync" || a.Epoch != 2 || a.WantReplicas != 3 {
		t.Fatalf("degraded: %+v", a)
	}
	if !a.Replicas[1].Primary || a.Replicas[0].Primary || a.Replicas[0].Reason != "primary lost at epoch 1" || a.Replicas[0].State != api.ReplicaOutOfSync {
		t.Fatalf("replicas %+v", a.Replicas)
	}

	a = api.Volume{State: api.StateUnavailable, Reason: "its node n2 is down (not heard from)"}
	replicaView(r, &a)
	if a.Reason != "its node n2 is down (not heard from)" {
		t.Fatalf("reason replaced: %q", a.Reason)
	}
	r.Replicas[0].State = meta.ReplicaInSync
	a = api.Volume{State: api.StateOnline}
	replicaView(r, &a)
	if a.Reason != "" {
		t.Fatalf("all in sync, reason %q", a.Reason)
	}
}

// TestOlderLeaderJoin: an older leader's 400 on the unknown "features"
// field makes the join retry without them (a rolling upgrade); any other
// error does not, and a request without features is never changed.
func TestOlderLeaderJoin(t *testing.T) {
	old := errors.New(`join answered 400 Bad Request: request body is not the expected JSON object: json: unknown field "features"`)
	req := JoinRequest{NodeID: "n2", Features: nodeFeatures}
	if !olderLeader(old, &req) || req.Features != nil {
		t.Fatalf("older leader: features %v", req.Features)
	}
	if olderLeader(old, &req) {
		t.Fatal("retried twice: a request without features cannot be the cause")
	}
	req.Features = nodeFeatures
	if olderLeader(errors.New("join answered 503: no leader"), &req) || olderLeader(nil, &req) || len(req.Features) != len(nodeFeatures) {
		t.Fatalf("other errors: features %v", req.Features)
	}
}

// TestOlderLeaderReplicaAddr: an older leader refusing "replica_addr"
// is retried without it (and without the features, as old).
func TestOlderLeaderReplicaAddr(t *testing.T) {
	old := errors.New(`join answered 400 Bad Request: request body is not the expected JSON object: json: unknown field "replica_addr"`)
	req := JoinRequest{NodeID: "n2", Features: nodeFeatures, ReplicaAddr: "127.0.0.1:4420"}
	if !olderLeader(old, &req) || req.ReplicaAddr != "" || req.Features != nil {
		t.Fatalf("older leader: %+v", req)
	}
}

// TestReplicaAddr: the listen address of NVMe/TCP is what other nodes
// reach for replica connections, registered only when hosts are told
// another address.
func TestReplicaAddr(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{TCPAddr: "127.0.0.1:4420"}, ""},
		{Config{TCPAddr: "127.0.0.1:4420", AdvertiseAddr: "10.0.2.2"}, "127.0.0.1:4420"},
		{Config{TCPAddr: "192.0.2.7:4420", AdvertiseAddr: "198.51.100.1:14420"}, "192.0.2.7:4420"},
		{Config{TCPAddr: "0.0.0.0:4420", AdvertiseAddr: "198.51.100.1"}, ""},
		{Config{TCPAddr: "off", AdvertiseAddr: "198.51.100.1"}, ""},
	} {
		if got := tc.c.replicaAddr(); got != tc.want {
			t.Errorf("%+v: replica address %q, want %q", tc.c, got, tc.want)
		}
	}
}

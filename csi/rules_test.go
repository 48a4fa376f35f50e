package csi

import (
	"testing"

	"github.com/blk-project/blk/api"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestVolumeSize(t *testing.T) {
	for _, tc := range []struct {
		req, lim, align, fallback, want int64
		code                            codes.Code
	}{
		{0, 0, 4096, 1 << 30, 1 << 30, codes.OK},
		{1, 0, 4096, 1 << 30, 4096, codes.OK},
		{4097, 0, 4096, 1 << 30, 8192, codes.OK},
		{0, 1 << 20, 4096, 1 << 30, 1 << 20, codes.OK},         // the default capped by the limit
		{4097, 8191, 4096, 1 << 30, 0, codes.OutOfRange},       // no multiple in range
		{2 << 20, 1 << 20, 4096, 1 << 30, 0, codes.OutOfRange}, // required over limit
		{0, 100, 4096, 1 << 30, 0, codes.OutOfRange},
		{-1, 0, 4096, 1 << 30, 0, codes.InvalidArgument},
	} {
		got, err := volumeSize(&csipb.CapacityRange{RequiredBytes: tc.req, LimitBytes: tc.lim}, tc.align, tc.fallback)
		if status.Code(err) != tc.code || got != tc.want {
			t.Errorf("volumeSize(%d, %d) = %d, %v; want %d, %v", tc.req, tc.lim, got, err, tc.want, tc.code)
		}
	}
}

func TestPage(t *testing.T) {
	keys := []string{"a", "b", "c", "d", "e"}
	for _, tc := range []struct {
		token string
		max   int
		from  int
		next  string
		code  codes.Code
	}{
		{"", 0, 0, "", codes.OK},
		{"", 2, 0, "b", codes.OK},
		{"b", 2, 2, "d", codes.OK},
		{"d", 2, 4, "", codes.OK}, // the last page: no token
		{"", 5, 0, "", codes.OK},
		{"zz", 2, 0, "", codes.Aborted},
	} {
		from, next, err := page(keys, tc.token, tc.max)
		if status.Code(err) != tc.code || from != tc.from || next != tc.next {
			t.Errorf("page(%q, %d) = %d, %q, %v; want %d, %q, %v", tc.token, tc.max, from, next, err, tc.from, tc.next, tc.code)
		}
	}
}

func TestCapacity(t *testing.T) {
	m := func(id, zone, state string, capacity, promised uint64) api.Member {
		return api.Member{ID: id, Zone: zone, State: state, CapacityBytes: capacity, PromisedBytes: promised}
	}
	members := []api.Member{
		m("n1", "a", "up", 100, 40),  // 60
		m("n2", "a", "up", 100, 90),  // 10
		m("n3", "b", "up", 100, 70),  // 30
		m("n4", "c", "up", 100, 80),  // 20
		m("n5", "c", "down", 100, 0), // down: not counted
		m("n6", "b", "up", 50, 80),   // over-promised: 0
	}
	for _, tc := range []struct {
		zone          string
		zoned         bool
		replicas      int
		avail, larges int64
	}{
		{"", false, 0, 120, 60},
		{"a", true, 0, 70, 60},
		{"c", true, 0, 20, 20},
		{"", false, 3, 20, 20}, // the third-largest zone's best: c's 20
		{"", false, 2, 30, 30},
		{"", false, 4, 0, 0}, // three zones only
	} {
		avail, largest := capacity(members, tc.zone, tc.zoned, tc.replicas)
		if avail != tc.avail || largest != tc.larges {
			t.Errorf("capacity(zone %q, replicas %d) = %d, %d; want %d, %d", tc.zone, tc.replicas, avail, largest, tc.avail, tc.larges)
		}
	}
}

func TestCheckCap(t *testing.T) {
	ok := []*csipb.VolumeCapability{
		mountVC(csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		mountVC(csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER),
		mountVC(csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY),
		blockVC(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
	}
	for _, vc := range ok {
		if err := checkCap(vc); err != nil {
			t.Errorf("%v: %v", vc, err)
		}
	}
	xfs := mountVC(singleWriter)
	xfs.GetMount().FsType = "xfs"
	if err := checkCap(xfs); err != nil {
		t.Errorf("xfs: %v", err)
	}
	btrfs := mountVC(singleWriter)
	btrfs.GetMount().FsType = "btrfs"
	bad := []*csipb.VolumeCapability{
		nil,
		mountVC(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
		blockVC(csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER),
		blockVC(csipb.VolumeCapability_AccessMode_UNKNOWN),
		{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: singleWriter}},
		btrfs,
	}
	for _, vc := range bad {
		if err := checkCap(vc); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v; want InvalidArgument", vc, err)
		}
	}
}

func TestHealth(t *testing.T) {
	for _, tc := range []struct {
		v    api.Volume
		want []csipb.VolumeHealthErrorType
	}{
		{api.Volume{State: api.StateOnline, Replicas: []api.Replica{{State: api.ReplicaInSync}}}, nil},
		{api.Volume{State: api.StateOnline, Replicas: []api.Replica{{State: api.ReplicaInSync}, {State: api.ReplicaRebuilding}}},
			[]csipb.VolumeHealthErrorType{csipb.VolumeHealthErrorType_DEGRADED}},
		{api.Volume{State: api.StateDegraded, Reason: "disk full"}, []csipb.VolumeHealthErrorType{csipb.VolumeHealthErrorType_DEGRADED}},
		{api.Volume{State: api.StateUnavailable, Reason: "node down"}, []csipb.VolumeHealthErrorType{csipb.VolumeHealthErrorType_INACCESSIBLE}},
		{api.Volume{State: api.StateFailed}, []csipb.VolumeHealthErrorType{csipb.VolumeHealthErrorType_INACCESSIBLE}},
	} {
		h := health(&tc.v)
		var got []csipb.VolumeHealthErrorType
		for _, e := range h.HealthStatuses {
			got = append(got, e.Status)
		}
		if len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) {
			t.Errorf("health(%s %s) = %v; want %v", tc.v.State, tc.v.Reason, got, tc.want)
		}
	}
}

package blkd

import (
	"reflect"
	"testing"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestRemoteSubsystems: every node's discovery log lists the volumes a
// host may connect to wherever they live — online and degraded ones, not
// creating, offline, failed or deleting ones — each with its hosts and
// the ports of its replica nodes other than the listing node's, at the
// PORTIDs their own logs give them, sorted by NQN; the target takes the
// list, and it is listed after the target's own subsystems.
func TestRemoteSubsystems(t *testing.T) {
	s := meta.NewState()
	apply := func(c meta.Command) {
		t.Helper()
		if r := s.Apply(s.Index()+1, c); r.Err != nil {
			t.Fatalf("%T: %v", c, r.Err)
		}
	}
	apply(meta.RegisterNode{ID: "n1", TCPAddr: "10.0.0.1:4420", TargetAddr: "10.0.1.1:4421", MgmtAddr: "m:1", Zone: "z1"})
	apply(meta.RegisterNode{ID: "n2", TCPAddr: "10.0.0.2:4420", MgmtAddr: "m:2", Zone: "z2"})
	apply(meta.RegisterNode{ID: "n3", TCPAddr: "10.0.0.3:4420", TargetAddr: "10.0.1.3:4421", MgmtAddr: "m:3", Zone: "z3"})
	const h1 = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000h1"
	create := func(name, node string, replicas ...string) {
		t.Helper()
		apply(meta.CreateVolume{Name: name, SizeBytes: 1 << 20, BlockSize: 4096, Node: node, NQN: "nqn.2026-01.io.blk:" + name, Replicas: replicas})
	}
	state := func(name string, st meta.VolumeState) {
		t.Helper()
		apply(meta.SetVolumeState{Name: name, State: st, Reason: "test"})
	}
	create("on1", "n1")
	create("on2", "n2")
	create("on3", "n3")
	create("rep", "n3", "n3", "n1", "n2")
	create("creating", "n2")
	create("off", "n2")
	create("deg", "n3")
	create("failed", "n3")
	create("gone", "n2")
	for _, n := range []string{"on1", "on2", "on3", "rep", "off", "deg", "failed", "gone"} {
		state(n, meta.VolumeOnline)
	}
	state("off", meta.VolumeOffline)
	state("deg", meta.VolumeDegraded)
	state("failed", meta.VolumeFailed)
	apply(meta.DeleteVolume{Name: "gone"})
	apply(meta.AllowHost{Volume: "on2", HostNQN: h1})
	apply(meta.SetAllowAny{Volume: "on3", AllowAny: true})

	tcp := func(ord int, host string) target.Port {
		return target.Port{ID: uint16(4*ord + 1), TrType: nvme.TrTypeTCP, AdrFam: nvme.AdrFamIPv4, TrAddr: host, TrSvcID: "4420", TReq: nvme.TReqDisableSQFlow}
	}
	rdma := func(ord int, host string) target.Port {
		return target.Port{ID: uint16(4*ord + 2), TrType: nvme.TrTypeRDMA, AdrFam: nvme.AdrFamIPv4, TrAddr: host, TrSvcID: "4421"}
	}
	remote := func(name string, any bool, hosts []string, paths ...target.Port) target.RemoteSubsystem {
		return target.RemoteSubsystem{NQN: "nqn.2026-01.io.blk:" + name, AllowAny: any, Hosts: hosts, Paths: paths}
	}
	// From n1: its own one-replica volume is not listed (no other path);
	// the replicated one with n3's and n2's ports (n1's own are its
	// subsystem's); n2's and n3's volumes at their nodes.
	want := []target.RemoteSubsystem{
		remote("deg", false, nil, tcp(3, "10.0.0.3"), rdma(3, "10.0.1.3")),
		remote("on2", false, []string{h1}, tcp(2, "10.0.0.2")),
		remote("on3", true, nil, tcp(3, "10.0.0.3"), rdma(3, "10.0.1.3")),
		remote("rep", false, nil, tcp(3, "10.0.0.3"), rdma(3, "10.0.1.3"), tcp(2, "10.0.0.2")),
	}
	got := remoteSubsystems(s, "n1")
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("from n1:\n got %+v\nwant %+v", got, want)
	}
	// From a node of none of them (a new node): every one, every path.
	all := remoteSubsystems(s, "n9")
	if len(all) != 5 || all[1].NQN != "nqn.2026-01.io.blk:on1" || !reflect.DeepEqual(all[1].Paths, []target.Port{tcp(1, "10.0.0.1"), rdma(1, "10.0.1.1")}) {
		t.Fatalf("from n9: %+v", all)
	}
	if r := all[4]; r.NQN != "nqn.2026-01.io.blk:rep" || len(r.Paths) != 5 {
		t.Fatalf("from n9, the replicated volume: %+v", r)
	}

	// The target takes the list as it is, and again changes nothing.
	tgt, err := target.New(target.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	if err := tgt.SetRemoteSubsystems(got); err != nil {
		t.Fatalf("SetRemoteSubsystems: %v", err)
	}
	// As the target checks them: the RDMA TSAS defaulted, no hosts nil.
	for i := range want {
		if len(want[i].Hosts) == 0 {
			want[i].Hosts = nil
		}
		for j := range want[i].Paths {
			if p := &want[i].Paths[j]; p.TrType == nvme.TrTypeRDMA {
				p.RDMA = nvme.RDMATSAS{QPType: nvme.RDMAQPTypeConnected, PrType: nvme.RDMAPrTypeNotSpecified, CMS: nvme.RDMACMSRDMACM}
			}
		}
	}
	back := tgt.RemoteSubsystems()
	for i := range back {
		if len(back[i].Hosts) == 0 {
			back[i].Hosts = nil
		}
	}
	if !reflect.DeepEqual(back, want) {
		t.Fatalf("the target keeps:\n got %+v\nwant %+v", back, want)
	}
}

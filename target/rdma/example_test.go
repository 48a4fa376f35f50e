package rdma_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// A target serving one volume of an extent store over the soft iWARP
// transport, and the initiator writing and reading it, on loopback.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Storage node: a store (pebble and the data area in memory here; a
	// directory and an area file in blkd), a target, a subsystem with the
	// volume as namespace 1, and an RDMA port.
	s, _ := store.Open(store.Config{FS: vfs.NewMem(), Dir: "/data", Area: store.NewMemArea(4<<20, 512, 512)})
	defer s.Close()
	vol, _ := s.Create(1, store.CreateOptions{SizeBytes: 16 << 20})
	nic, _ := soft.New(soft.Config{})
	defer nic.Close()
	cfg := rdma.Config{Addr: "127.0.0.1:0"}
	// The port passes its limits with every queue: the target needs none.
	tgt, _ := target.New(target.Config{})
	defer tgt.Close()
	sub, _ := tgt.AddSubsystem(target.SubsystemConfig{
		NQN: "nqn.2026-11.io.blk:example", Serial: "blk-example", Model: "blk",
		Hosts: []string{"nqn.2026-11.io.blk:host-a"},
	})
	sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: target.StoreBackend(vol)})
	port, err := rdma.Listen(tgt, nic, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer port.Close()

	// Compute host: connect, find the namespace, write and read back.
	hostNIC, _ := soft.New(soft.Config{})
	defer hostNIC.Close()
	ctrl, err := initiator.Connect(ctx, initiator.Config{
		Adapter: hostNIC, HostNQN: "nqn.2026-11.io.blk:host-a", Queues: 2,
	}, port.Addr().String(), "nqn.2026-11.io.blk:example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ctrl.Close()
	ns := ctrl.Namespace(1)
	fmt.Printf("namespace %d: %d blocks of %d bytes\n", ns.ID(), ns.Blocks(), ns.BlockSize())

	data := bytes.Repeat([]byte("blk!"), 2048) // two 4 KiB blocks
	if _, err := ns.WriteAt(data, 8192); err != nil {
		fmt.Println(err)
		return
	}
	ns.Flush()
	back := make([]byte, len(data))
	ns.ReadAt(back, 8192)
	fmt.Println("read back equal:", bytes.Equal(back, data))
	// Output:
	// namespace 1: 4096 blocks of 4096 bytes
	// read back equal: true
}

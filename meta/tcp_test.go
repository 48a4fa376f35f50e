package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

// TestClusterTCP: three members on real TCP ports of 127.0.0.1; the leader
// dies, the other two carry on and agree.
func TestClusterTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	root := t.TempDir()
	nodes := make([]*Node, 3)
	t.Cleanup(func() {
		for _, n := range nodes {
			if n != nil {
				_ = n.Close()
			}
		}
	})
	for i := range nodes {
		cfg := testConfig(t, fmt.Sprintf("t%d", i), filepath.Join(root, fmt.Sprintf("t%d", i)))
		cfg.BindAddr, cfg.Bootstrap = "127.0.0.1:0", i == 0
		n, err := NewNode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
	}
	leader := func() (*Node, error) {
		var l *Node
		for _, n := range nodes {
			if n != nil && n.IsLeader() {
				if l != nil {
					return nil, errors.New("two leaders")
				}
				l = n
			}
		}
		if l == nil {
			return nil, errors.New("no leader")
		}
		return l, nil
	}
	ctx := context.Background()
	eventually(t, "m0 leads", func() error {
		if !nodes[0].IsLeader() {
			return errors.New("not yet")
		}
		return nil
	})
	for _, n := range nodes[1:] {
		if err := nodes[0].AddVoter(ctx, n.ID(), n.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	apply := func(c Command) {
		eventually(t, fmt.Sprintf("apply %#v", c), func() error {
			l, err := leader()
			if err != nil {
				return err
			}
			_, err = l.Apply(ctx, c)
			if errors.Is(err, ErrNotLeader) {
				return err
			}
			return nil
		})
	}
	apply(RegisterNode{ID: "s", TargetAddr: "a:1", MgmtAddr: "a:2"})
	for i := range 20 {
		apply(CreateVolume{Name: fmt.Sprintf("v%d", i), SizeBytes: 4096, BlockSize: 4096, Node: "s"})
	}
	// A follower names the leader by its TCP address.
	for _, n := range nodes[1:] {
		var nl *NotLeaderError
		eventually(t, "follower knows the leader", func() error {
			_, err := n.Apply(ctx, PurgeVolume{Name: "v0"})
			if !errors.As(err, &nl) || nl.LeaderAddr != nodes[0].Addr() {
				return fmt.Errorf("%v", err)
			}
			return nil
		})
	}
	_ = nodes[0].Close()
	nodes[0] = nil
	for i := 20; i < 40; i++ {
		apply(CreateVolume{Name: fmt.Sprintf("v%d", i), SizeBytes: 4096, BlockSize: 4096, Node: "s"})
	}
	eventually(t, "survivors agree", func() error {
		a, b := nodes[1].FSM().MarshalState(), nodes[2].FSM().MarshalState()
		if !bytes.Equal(a, b) {
			return errors.New("registries differ")
		}
		if n := len(nodes[1].FSM().Export().Volumes); n != 40 {
			return fmt.Errorf("%d volumes", n)
		}
		return nil
	})
}

// TestImports: meta is the control plane; it never imports a data-plane
// package. nvme/resv is the pure reservation model (no I/O), which the FSM
// applies (docs/reservations.md §1.2).
func TestImports(t *testing.T) { importtest.Only(t, ".", "api", "nvme/resv") }

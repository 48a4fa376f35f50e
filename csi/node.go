package csi

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// node is the Node service (§1.10). Placeholder until piece 2 lands.
type node struct {
	csipb.UnimplementedNodeServer
	d *Driver
}

func (n *node) start() error                    { return nil }
func (n *node) close(ctx context.Context) error { return nil }

// probe is the node part of Probe (identity.go): its own state dir and
// the kernel's fabrics device. Placeholder until piece 2 lands.
func (n *node) probe(ctx context.Context) error { return nil }

package csi

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// controller is the Controller service (§1.5). Placeholder until piece 1 lands.
type controller struct {
	csipb.UnimplementedControllerServer
	d *Driver
}

func (c *controller) start() error                    { return nil }
func (c *controller) close(ctx context.Context) error { return nil }

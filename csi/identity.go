package csi

import csipb "github.com/container-storage-interface/spec/lib/go/csi"

// identity is the Identity service (§1.3). Placeholder until piece 1 lands.
type identity struct {
	csipb.UnimplementedIdentityServer
	d *Driver
}

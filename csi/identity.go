package csi

import (
	"context"
	"time"

	"github.com/blk-project/blk/internal/version"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// identity is the Identity service (docs/operations.md §1.3).
type identity struct {
	csipb.UnimplementedIdentityServer
	d *Driver
}

// probeTimeout bounds the controller's readiness question to blkd.
const probeTimeout = 5 * time.Second

func (i *identity) GetPluginInfo(ctx context.Context, req *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	v := i.d.cfg.Version
	if v == "" {
		v = version.Get().Version
	}
	return &csipb.GetPluginInfoResponse{Name: DriverName, VendorVersion: v}, nil
}

func (i *identity) GetPluginCapabilities(ctx context.Context, req *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	svc := func(t csipb.PluginCapability_Service_Type) *csipb.PluginCapability {
		return &csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: t}}}
	}
	return &csipb.GetPluginCapabilitiesResponse{Capabilities: []*csipb.PluginCapability{
		svc(csipb.PluginCapability_Service_CONTROLLER_SERVICE),
		svc(csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		{Type: &csipb.PluginCapability_VolumeExpansion_{VolumeExpansion: &csipb.PluginCapability_VolumeExpansion{
			Type: csipb.PluginCapability_VolumeExpansion_ONLINE}}},
	}}, nil
}

// Probe answers ready when every service this process serves is: the
// controller's when blkd's GET /readyz answers 200 within probeTimeout,
// the node's when its own checks pass (node.probe).
func (i *identity) Probe(ctx context.Context, req *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	if c := i.d.ctrl; c != nil {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := c.api.readyz(pctx)
		cancel()
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "blkd is not ready: %v", err)
		}
	}
	if n := i.d.node; n != nil {
		if err := n.probe(ctx); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "node not ready: %v", err)
		}
	}
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

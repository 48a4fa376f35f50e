package csi

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// StorageClass parameters (docs/operations.md §1.6). All optional;
// unknown keys are refused, so that a typo never silently gives a
// default. Keys under csi.storage.k8s.io/ are the sidecars' and are
// ignored, except csi.storage.k8s.io/fstype, which sets fsType.
const (
	ParamReplicas       = "replicas"
	ParamBlockSize      = "blockSize"
	ParamTransport      = "transport"
	ParamFSType         = "fsType"
	ParamMkfsOptions    = "mkfsOptions"
	ParamZoneLocal      = "zoneLocal"
	ParamFlattenClones  = "flattenClones"
	ParamAuthentication = "authentication"

	// ParamSidecarFSType is the external-provisioner's fstype key; it
	// wins over fsType.
	ParamSidecarFSType = "csi.storage.k8s.io/fstype"
	sidecarPrefix      = "csi.storage.k8s.io/"
)

// Parameters are the StorageClass parameter keys the driver accepts, for
// the manifests' test and the docs.
var Parameters = []string{
	ParamReplicas, ParamBlockSize, ParamTransport, ParamFSType,
	ParamMkfsOptions, ParamZoneLocal, ParamFlattenClones, ParamAuthentication,
}

// Transports of the transport parameter: how the node connects (§1.10).
const (
	TransportTCP    = "tcp"
	TransportNBD    = "nbd"
	TransportTCPNBD = "tcp,nbd"
)

// Authentication modes of the authentication parameter.
const (
	AuthNone   = "none"
	AuthDHCHAP = "dhchap"
)

// params are a StorageClass's parameters, checked.
type params struct {
	Replicas       int    // 0: blkd's default
	BlockSize      uint32 // 512 or 4096
	Transport      string // TransportTCP, TransportNBD or TransportTCPNBD
	FSType         string // "ext4" or "xfs"
	MkfsOptions    []string
	ZoneLocal      bool
	FlattenClones  bool
	Authentication string // AuthNone or AuthDHCHAP
}

// defaultParams are the parameters of an empty StorageClass.
func defaultParams() params {
	return params{BlockSize: 4096, Transport: TransportTCP, FSType: "ext4", Authentication: AuthNone}
}

// parseParams checks a StorageClass's parameters; the error names the
// key and what it accepts.
func parseParams(m map[string]string) (params, error) {
	p := defaultParams()
	for k, v := range m {
		if err := p.set(k, v); err != nil {
			return params{}, err
		}
	}
	if v, ok := m[ParamSidecarFSType]; ok && v != "" {
		if err := p.set(ParamFSType, v); err != nil {
			return params{}, fmt.Errorf("parameter %s: %w", ParamSidecarFSType, err)
		}
	}
	return p, nil
}

func (p *params) set(k, v string) error {
	bad := func(want string) error {
		return fmt.Errorf("parameter %s=%q: want %s", k, v, want)
	}
	switch k {
	case ParamReplicas:
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 5 {
			return bad("1 to 5")
		}
		p.Replicas = n
	case ParamBlockSize:
		switch v {
		case "512", "4096":
			n, _ := strconv.ParseUint(v, 10, 32)
			p.BlockSize = uint32(n)
		default:
			return bad("512 or 4096")
		}
	case ParamTransport:
		switch v {
		case TransportTCP, TransportNBD, TransportTCPNBD:
			p.Transport = v
		case "rdma":
			return bad("tcp, nbd or tcp,nbd (the kernel's nvme-rdma needs an RDMA device a node cannot be assumed to have)")
		default:
			return bad("tcp, nbd or tcp,nbd")
		}
	case ParamFSType:
		switch v {
		case "ext4", "xfs":
			p.FSType = v
		default:
			return bad("ext4 or xfs")
		}
	case ParamMkfsOptions:
		p.MkfsOptions = strings.Fields(v)
	case ParamZoneLocal:
		if v != "true" && v != "false" {
			return bad("true or false")
		}
		p.ZoneLocal = v == "true"
	case ParamFlattenClones:
		if v != "true" && v != "false" {
			return bad("true or false")
		}
		p.FlattenClones = v == "true"
	case ParamAuthentication:
		switch v {
		case AuthNone, AuthDHCHAP:
			p.Authentication = v
		default:
			return bad("none or dhchap")
		}
	default:
		if strings.HasPrefix(k, sidecarPrefix) {
			return nil // the sidecars' own keys; fstype is read by parseParams
		}
		return fmt.Errorf("unknown parameter %q: the driver takes %s", k, strings.Join(sorted(Parameters), ", "))
	}
	return nil
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// Volume context keys: what CreateVolume returns in the volume's context
// and the node reads at NodeStage (never a secret).
const (
	ctxTransport      = "transport"
	ctxFSType         = "fsType"
	ctxMkfsOptions    = "mkfsOptions"
	ctxAuthentication = "authentication"
	ctxBlockSize      = "blockSize"
)

// volumeContext is what the node needs of p.
func (p params) volumeContext() map[string]string {
	m := map[string]string{
		ctxTransport:      p.Transport,
		ctxFSType:         p.FSType,
		ctxAuthentication: p.Authentication,
		ctxBlockSize:      strconv.FormatUint(uint64(p.BlockSize), 10),
	}
	if len(p.MkfsOptions) > 0 {
		m[ctxMkfsOptions] = strings.Join(p.MkfsOptions, " ")
	}
	return m
}

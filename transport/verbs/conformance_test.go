//go:build verbs && linux && cgo

package verbs_test

import (
	"net"
	"os"
	"testing"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/transporttest"
	"github.com/blk-project/blk/transport/verbs"
)

// The tests run on a real RDMA device, named by the environment: the e2e
// scenario TestVerbsConformance sets BLK_VERBS_DEVICE (rxe0 or siw0) and
// BLK_VERBS_ADDR (the device's IP) in its guests. Without them they skip.
const (
	deviceEnv = "BLK_VERBS_DEVICE"
	addrEnv   = "BLK_VERBS_ADDR"
)

// device returns the device and address under test, or skips.
func device(t testing.TB) (string, string) {
	t.Helper()
	dev, addr := os.Getenv(deviceEnv), os.Getenv(addrEnv)
	if dev == "" {
		t.Skipf("%s is not set: these tests need an RDMA device (the e2e scenario TestVerbsConformance runs them on rxe and siw)", deviceEnv)
	}
	if addr == "" || net.ParseIP(addr) == nil {
		t.Skipf("%s=%q is not an IP address of %s", addrEnv, addr, dev)
	}
	return dev, addr
}

func open(t testing.TB, dev string) *verbs.Adapter {
	t.Helper()
	a, err := verbs.New(verbs.Config{Device: dev})
	if err != nil {
		t.Fatalf("verbs.New(%s): %v", dev, err)
	}
	return a
}

// TestConformance runs the provider conformance suite on the device.
func TestConformance(t *testing.T) {
	dev, addr := device(t)
	a := open(t, dev)
	info := a.Info()
	t.Logf("%s (iWARP %v): %+v", dev, a.IWARP(), info)
	a.Close()
	transporttest.Run(t, transporttest.Harness{
		NewAdapter: func(t testing.TB) transport.Adapter { return open(t, dev) },
		ListenAddr: net.JoinHostPort(addr, "0"),
	})
}

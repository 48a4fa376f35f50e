package rdma_test

import (
	"net"
	"os"
	"testing"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/providers"
)

// The end-to-end benchmarks (bench_test.go) run over the provider and on
// the address the environment names, so that the same ratios can be taken
// on an RDMA device:
//
//	BLK_BENCH_PROVIDER  provider name (transport/providers); default soft
//	BLK_BENCH_DEVICE    its device (verbs: rxe0, siw0, mlx5_0); default none
//	BLK_BENCH_ADDR      the IP both ends use; default 127.0.0.1
//
// The verbs provider is only in builds with -tags verbs (cgo):
//
//	BLK_BENCH_PROVIDER=verbs BLK_BENCH_DEVICE=rxe0 BLK_BENCH_ADDR=10.0.2.15 \
//	    CGO_ENABLED=1 go test -tags verbs -run '^$' -bench . ./target/rdma/
//
// The benchmarks' child servers get the same choice through
// BLK_TEST_CHILD_PROVIDER and BLK_TEST_CHILD_DEVICE (benchChildEnv), so
// other tests' children stay on the soft provider whatever the benchmarks
// are told.
const (
	benchProviderEnv = "BLK_BENCH_PROVIDER"
	benchDeviceEnv   = "BLK_BENCH_DEVICE"
	benchAddrEnv     = "BLK_BENCH_ADDR"

	childProviderEnv = "BLK_TEST_CHILD_PROVIDER"
	childDeviceEnv   = "BLK_TEST_CHILD_DEVICE"
)

// benchListenAddr is where the benchmarks' servers listen: any port on
// BLK_BENCH_ADDR, or on 127.0.0.1.
func benchListenAddr() string {
	ip := os.Getenv(benchAddrEnv)
	if ip == "" {
		ip = "127.0.0.1"
	}
	return net.JoinHostPort(ip, "0")
}

// benchChildEnv is the environment that gives a child server the
// benchmarks' provider and device.
func benchChildEnv() []string {
	return []string{
		childProviderEnv + "=" + os.Getenv(benchProviderEnv),
		childDeviceEnv + "=" + os.Getenv(benchDeviceEnv),
	}
}

// benchAdapter opens the host side's adapter of the benchmarks' provider,
// closed when tb ends.
func benchAdapter(tb testing.TB) transport.Adapter {
	tb.Helper()
	a, err := providers.Open(os.Getenv(benchProviderEnv), providers.Options{Device: os.Getenv(benchDeviceEnv)})
	if err != nil {
		tb.Fatalf("%s=%q %s=%q: %v", benchProviderEnv, os.Getenv(benchProviderEnv), benchDeviceEnv, os.Getenv(benchDeviceEnv), err)
	}
	tb.Cleanup(func() { a.Close() })
	return a
}

// childAdapter opens a child server's adapter: the provider and device
// its parent chose (benchChildEnv), soft by default.
func childAdapter() (transport.Adapter, error) {
	return providers.Open(os.Getenv(childProviderEnv), providers.Options{Device: os.Getenv(childDeviceEnv)})
}

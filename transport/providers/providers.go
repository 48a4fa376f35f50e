// Package providers opens a transport provider by name, so that a daemon
// or a tool chooses its RDMA provider by configuration:
//
//   - "soft": the pure-Go iWARP provider over TCP (transport/soft), in
//     every build; the default. On Linux its CQs are poll groups
//     (soft.Config.PollGroup): each CQ's thread does its QPs' socket I/O.
//   - "soft-goroutines": the same with a sender and a receiver goroutine
//     per QP (the design before poll groups).
//   - "verbs": the rdma-core provider (transport/verbs) on an RDMA device —
//     Soft-RoCE, siw or a NIC — in builds with the verbs tag (cgo,
//     libibverbs and librdmacm): go build -tags verbs ./cmd/blkd.
//
// A provider in a package registers itself from an init function; a
// binary gets it by importing this package, which imports every provider
// its build has.
package providers

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/blk-project/blk/transport"
)

// Default is the provider used when none is named.
const Default = "soft"

// Options configure the opened adapter.
type Options struct {
	// Device names the RDMA device for providers that drive one (verbs:
	// "rxe0", "siw0", "mlx5_0"); empty means the provider's choice (the
	// first device). The soft provider takes none.
	Device string
}

// Opener opens an adapter of one provider.
type Opener func(Options) (transport.Adapter, error)

// ErrNotBuilt: the named provider is one blk has, but not in this build.
var ErrNotBuilt = errors.New("providers: provider not in this build")

// ErrUnknown: no provider has that name.
var ErrUnknown = errors.New("providers: no such provider")

var (
	mu      sync.Mutex
	openers = map[string]Opener{}
)

// known are the providers blk has, with the build that has them.
var known = map[string]string{
	"soft":            "every build",
	"soft-goroutines": "every build",
	"verbs":           "builds with -tags verbs (cgo with rdma-core's libibverbs-dev and librdmacm-dev)",
}

// Register makes a provider available under name; providers call it from
// init. A second registration of a name panics (a build mistake).
func Register(name string, open Opener) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := openers[name]; dup {
		panic("providers: " + name + " registered twice")
	}
	openers[name] = open
}

// Names lists the providers in this build, sorted.
func Names() []string {
	mu.Lock()
	defer mu.Unlock()
	out := make([]string, 0, len(openers))
	for n := range openers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Check says whether name can be opened in this build: nil, or an error
// matching ErrNotBuilt or ErrUnknown that says what to do.
func Check(name string) error {
	if name == "" {
		name = Default
	}
	mu.Lock()
	_, ok := openers[name]
	mu.Unlock()
	if ok {
		return nil
	}
	if build, ok := known[name]; ok {
		return fmt.Errorf("%w: %q is in %s; this binary has %v", ErrNotBuilt, name, build, Names())
	}
	all := make([]string, 0, len(known))
	for n := range known {
		all = append(all, n)
	}
	slices.Sort(all)
	return fmt.Errorf("%w: %q (blk has %v)", ErrUnknown, name, all)
}

// Open opens an adapter of the named provider ("" is Default).
func Open(name string, opt Options) (transport.Adapter, error) {
	if err := Check(name); err != nil {
		return nil, err
	}
	if name == "" {
		name = Default
	}
	mu.Lock()
	open := openers[name]
	mu.Unlock()
	return open(opt)
}

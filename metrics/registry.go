package metrics

import (
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"net/http"
	"sync"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/version"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/target/tcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ErrRegistered is returned when an object's collectors are registered a
// second time.
var ErrRegistered = errors.New("metrics: already registered")

// Handler serves reg's metrics in the Prometheus exposition formats. A
// collector that fails does not fail the scrape (the rest is served, and
// promhttp_metric_handler_errors_total, registered in reg, counts it).
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg,
	})
}

// Registry registers the collectors of blk's objects in a Prometheus
// registry the caller owns, and unregisters them when the object goes
// away (a port closed, a controller disconnected). Safe for concurrent
// use.
type Registry struct {
	reg *prometheus.Registry

	mu   sync.Mutex
	objs map[any][]prometheus.Collector
}

// NewRegistry returns a Registry registering into reg.
func NewRegistry(reg *prometheus.Registry) *Registry {
	return &Registry{reg: reg, objs: make(map[any][]prometheus.Collector)}
}

// Prometheus returns the underlying registry.
func (r *Registry) Prometheus() *prometheus.Registry { return r.reg }

// Handler serves the registry's metrics (see the function Handler).
func (r *Registry) Handler() http.Handler { return Handler(r.reg) }

// RegisterTarget registers a TargetCollector for t; names (optional)
// maps its namespaces to volumes.
func (r *Registry) RegisterTarget(t *target.Target, names ...func() map[Namespace]NamespaceLabel) error {
	var f func() map[Namespace]NamespaceLabel
	if len(names) > 0 {
		f = names[0]
	}
	return r.register(t, NewTargetCollector(t, f))
}

// RegisterPort registers a PortCollector for p and an EngineCollector for
// its engine, both labelled port=p.Addr().String().
func (r *Registry) RegisterPort(p *rdma.Port) error {
	return r.register(p, NewPortCollector(p), NewEngineCollector(p.Addr().String(), p.Engine()))
}

// RegisterTCPPort registers a TCPPortCollector for p.
func (r *Registry) RegisterTCPPort(p *tcp.Port) error {
	return r.register(p, NewTCPPortCollector(p))
}

// RegisterStore registers a StoreCollector for s; names (optional) maps
// its objects to volume and snapshot names.
func (r *Registry) RegisterStore(s *store.Store, names ...func() map[uint64]VolumeLabel) error {
	var f func() map[uint64]VolumeLabel
	if len(names) > 0 {
		f = names[0]
	}
	return r.register(s, NewStoreCollector(s, f))
}

// RegisterStoreIO registers a StoreIOCollector for x.
func (r *Registry) RegisterStoreIO(x *target.StoreIO) error {
	return r.register(x, NewStoreIOCollector(x))
}

// RegisterProcess registers the Go runtime and process collectors and
// blk_build_info{version, revision, goversion}, from internal/version (as
// the binaries' --version).
func (r *Registry) RegisterProcess() error {
	v := version.Get()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "blk_build_info", Help: "1, labelled with the running binary's version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": v.Version, "revision": v.Revision, "goversion": v.GoVersion},
	})
	build.Set(1)
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), build} {
		if err := r.reg.Register(c); err != nil {
			return fmt.Errorf("metrics: register process collectors: %w", err)
		}
	}
	return nil
}

// RegisterController registers a ControllerCollector for c, connected to
// subsystem at addr.
func (r *Registry) RegisterController(c *initiator.Controller, subsystem, addr string) error {
	return r.register(c, NewControllerCollector(c, subsystem, addr))
}

// Unregister removes the collectors registered for obj (the *Target,
// *Port, *Store or *Controller given to a Register method) and reports
// whether there were any.
func (r *Registry) Unregister(obj any) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, ok := r.objs[obj]
	for _, c := range cs {
		r.reg.Unregister(c)
	}
	delete(r.objs, obj)
	return ok
}

// register registers every collector of obj, or none.
func (r *Registry) register(obj any, cs ...prometheus.Collector) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.objs[obj]; ok {
		return fmt.Errorf("metrics: %T: %w", obj, ErrRegistered)
	}
	for i, c := range cs {
		if err := r.reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				r.reg.Unregister(done)
			}
			return fmt.Errorf("metrics: register %T: %w", c, err)
		}
	}
	r.objs[obj] = cs
	return nil
}

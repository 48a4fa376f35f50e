package metrics_test

import (
	"errors"
	"go/build"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/blk-project/blk/metrics"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestRegistryRegisterUnregister: an object registers once; Unregister
// removes its collectors so it (or a replacement) can register again.
func TestRegistryRegisterUnregister(t *testing.T) {
	reg := metrics.NewRegistry(prometheus.NewRegistry())
	tt := newTestTarget(t)
	must(t, reg.RegisterTarget(tt.t))
	must(t, reg.RegisterPort(tt.port))
	must(t, reg.RegisterStore(tt.store))
	if err := reg.RegisterPort(tt.port); !errors.Is(err, metrics.ErrRegistered) {
		t.Errorf("second RegisterPort: %v, want ErrRegistered", err)
	}
	// A second collector of the same target clashes in the registry
	// itself; the error says so and nothing is left half-registered.
	if err := reg.Prometheus().Register(metrics.NewTargetCollector(tt.t, nil)); err == nil {
		t.Error("a second TargetCollector registered")
	}
	families, err := reg.Prometheus().Gather()
	if err != nil {
		t.Fatal(err)
	}
	if !hasFamily(families, "blk_rdma_commands_total") || !hasFamily(families, "blk_transport_completions_total") {
		t.Fatal("port metrics missing")
	}
	if !reg.Unregister(tt.port) {
		t.Error("Unregister(port) = false")
	}
	if reg.Unregister(tt.port) {
		t.Error("second Unregister(port) = true")
	}
	if families, _ = reg.Prometheus().Gather(); hasFamily(families, "blk_rdma_commands_total") || hasFamily(families, "blk_transport_completions_total") {
		t.Error("port metrics still exported after Unregister")
	}
	must(t, reg.RegisterPort(tt.port))
}

func hasFamily(fs []*dto.MetricFamily, name string) bool {
	return slices.ContainsFunc(fs, func(f *dto.MetricFamily) bool { return f.GetName() == name })
}

// TestImportGraph: metrics sits at the edge. It imports blk's library
// packages, and only cmd/ may import it.
func TestImportGraph(t *testing.T) {
	const mod = "github.com/blk-project/blk/"
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, mod+"cmd") || strings.HasPrefix(imp, mod+"meta") {
			t.Errorf("metrics imports %s", imp)
		}
	}
	err = filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "cmd") {
			return filepath.SkipDir
		}
		p, err := build.ImportDir(path, build.ImportComment)
		if err != nil {
			return nil // no Go files, or being written
		}
		all := slices.Concat(p.Imports, p.TestImports, p.XTestImports)
		if slices.Contains(all, mod+"metrics") && filepath.Base(path) != "metrics" {
			t.Errorf("%s imports metrics: only cmd/ may", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Command schemagen writes the JSON schemas kubeconform validates
// deploy/kubernetes against, offline (docs/operations.md §7, §8.3): from
// the OpenAPI v2 document of a Kubernetes release (api/openapi-spec/
// swagger.json in the k8s.io/kubernetes module's zip) and from CRD files
// (the external-snapshotter's VolumeSnapshotClass), in kubeconform's
// layout, strict: an object with declared properties allows no other.
//
//	go run ./deploy/kubernetes/schemagen -out DIR \
//	  -kubernetes-zip ZIP [-crd-zip ZIP -crd PATH-IN-ZIP ...]
//
// DIR gets _definitions.json (every definition, references kept local) and
// one KIND-GROUP-VERSION.json per x-kubernetes-group-version-kind, holding
// a reference into it; each CRD version gets KIND-GROUP-VERSION.json of
// its own. kubeconform then runs with
// -schema-location 'DIR/{{ .ResourceKind }}{{ .KindSuffix }}.json'.
package main

import (
	"archive/zip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("schemagen", flag.ContinueOnError)
	dir := fs.String("out", "", "directory to write the schemas into (created)")
	kzip := fs.String("kubernetes-zip", "", "the k8s.io/kubernetes module zip (go mod download -json: Zip)")
	swaggerIn := fs.String("swagger", "", "a swagger.json file instead of -kubernetes-zip")
	czip := fs.String("crd-zip", "", "a module zip holding the -crd files")
	var crds multi
	fs.Var(&crds, "crd", "a CRD file: a path inside -crd-zip, or a file when -crd-zip is empty (repeat)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("-out is required")
	}
	if (*kzip == "") == (*swaggerIn == "") {
		return errors.New("exactly one of -kubernetes-zip and -swagger is required")
	}
	var swagger []byte
	var err error
	if *kzip != "" {
		swagger, err = readZip(*kzip, "/api/openapi-spec/swagger.json")
	} else {
		swagger, err = os.ReadFile(*swaggerIn)
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	n, err := writeSwagger(*dir, swagger)
	if err != nil {
		return err
	}
	for _, c := range crds {
		var doc []byte
		if *czip != "" {
			doc, err = readZip(*czip, "/"+strings.TrimPrefix(c, "/"))
		} else {
			doc, err = os.ReadFile(c)
		}
		if err != nil {
			return err
		}
		k, err := writeCRD(*dir, doc)
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		n += k
	}
	fmt.Fprintf(out, "schemagen: %d schemas in %s\n", n, *dir)
	return nil
}

// readZip returns the file at path suffix inside a module zip (whose
// names all begin with module@version/).
func readZip(path, suffix string) ([]byte, error) {
	zr, err := zip.OpenReader(path)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	for _, f := range zr.File {
		if inModule(f.Name) == strings.TrimPrefix(suffix, "/") {
			rc, err := f.Open()
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			return io.ReadAll(rc)
		}
	}
	return nil, fmt.Errorf("%s: no file %s", path, strings.TrimPrefix(suffix, "/"))
}

// inModule is a module zip's file name without its module@version/ prefix.
func inModule(name string) string {
	at := strings.Index(name, "@")
	if at < 0 {
		return name
	}
	slash := strings.Index(name[at:], "/")
	if slash < 0 {
		return name
	}
	return name[at+slash+1:]
}

type gvk struct {
	Group   string `json:"group"`
	Version string `json:"version"`
	Kind    string `json:"kind"`
}

// fileName is kubeconform's {{ .ResourceKind }}{{ .KindSuffix }}.json:
// the kind in lower case, the group's first label, the version.
func fileName(g gvk) string {
	s := strings.ToLower(g.Kind)
	if g.Group != "" {
		s += "-" + strings.ToLower(strings.Split(g.Group, ".")[0])
	}
	return s + "-" + strings.ToLower(g.Version) + ".json"
}

// writeSwagger writes _definitions.json and a file per kind.
func writeSwagger(dir string, doc []byte) (int, error) {
	var sw struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(doc, &sw); err != nil {
		return 0, fmt.Errorf("swagger.json: %w", err)
	}
	if len(sw.Definitions) == 0 {
		return 0, errors.New("swagger.json: no definitions")
	}
	defs := make(map[string]any, len(sw.Definitions))
	for name, d := range sw.Definitions {
		defs[name] = strictify(d)
	}
	// Quantity is a string in the document, but YAML's "cpu: 1" is a number
	// that the API server accepts.
	if _, ok := defs[quantity]; ok {
		defs[quantity] = map[string]any{"oneOf": []any{
			map[string]any{"type": "string"}, map[string]any{"type": "number"},
		}}
	}
	if err := writeJSON(filepath.Join(dir, "_definitions.json"), map[string]any{"definitions": defs}); err != nil {
		return 0, err
	}
	names := make([]string, 0, len(sw.Definitions))
	for name := range sw.Definitions {
		names = append(names, name)
	}
	sort.Strings(names)
	n := 0
	for _, name := range names {
		raw, _ := json.Marshal(sw.Definitions[name]["x-kubernetes-group-version-kind"])
		var kinds []gvk
		_ = json.Unmarshal(raw, &kinds)
		for _, k := range kinds {
			// A kind served under several names (the List kinds of
			// meta/v1) points at the first definition only.
			path := filepath.Join(dir, fileName(k))
			if _, err := os.Stat(path); err == nil {
				continue
			}
			ref := map[string]any{"$ref": "_definitions.json#/definitions/" + name}
			if err := writeJSON(path, ref); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

const quantity = "io.k8s.apimachinery.pkg.api.resource.Quantity"

// strictify rewrites one schema for kubeconform's -strict run: objects
// with properties refuse others, int-or-string takes either.
func strictify(v any) any {
	switch s := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(s)+1)
		for k, e := range s {
			switch k {
			case "x-kubernetes-group-version-kind", "description", "example", "default", "enum":
				out[k] = e // data, not schemas
			case "properties", "definitions", "patternProperties":
				// Field names to schemas: a field may be called
				// "format" or "properties" itself.
				m, _ := e.(map[string]any)
				named := make(map[string]any, len(m))
				for name, sub := range m {
					named[name] = strictify(sub)
				}
				out[k] = named
			default:
				out[k] = strictify(e)
			}
		}
		if s["format"] == "int-or-string" {
			delete(out, "type")
			delete(out, "format")
			out["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
		}
		_, props := s["properties"]
		_, extra := s["additionalProperties"]
		if props && !extra && s["x-kubernetes-preserve-unknown-fields"] != true {
			out["additionalProperties"] = false
		}
		return out
	case []any:
		out := make([]any, len(s))
		for i, e := range s {
			out[i] = strictify(e)
		}
		return out
	}
	return v
}

// writeCRD writes one schema per served version of a CRD.
func writeCRD(dir string, doc []byte) (int, error) {
	var crd struct {
		Kind string `json:"kind"`
		Spec struct {
			Group string `json:"group"`
			Names struct {
				Kind string `json:"kind"`
			} `json:"names"`
			Versions []struct {
				Name   string `json:"name"`
				Served bool   `json:"served"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(doc, &crd); err != nil {
		return 0, err
	}
	if crd.Kind != "CustomResourceDefinition" {
		return 0, fmt.Errorf("kind %q, not CustomResourceDefinition", crd.Kind)
	}
	n := 0
	for _, v := range crd.Spec.Versions {
		if !v.Served || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		// metadata is "type: object" with no properties in a CRD (the API
		// server adds ObjectMeta's schema), so it stays open here.
		s := strictify(v.Schema.OpenAPIV3Schema)
		k := gvk{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}
		if err := writeJSON(filepath.Join(dir, fileName(k)), s); err != nil {
			return n, err
		}
		n++
	}
	if n == 0 {
		return 0, errors.New("no served version with a schema")
	}
	return n, nil
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

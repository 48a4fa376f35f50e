package main

import (
	"archive/zip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestFileName(t *testing.T) {
	for _, tc := range []struct {
		g    gvk
		want string
	}{
		{gvk{"", "v1", "Service"}, "service-v1.json"},
		{gvk{"apps", "v1", "Deployment"}, "deployment-apps-v1.json"},
		{gvk{"storage.k8s.io", "v1", "CSIDriver"}, "csidriver-storage-v1.json"},
		{gvk{"rbac.authorization.k8s.io", "v1", "ClusterRole"}, "clusterrole-rbac-v1.json"},
		{gvk{"snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass"}, "volumesnapshotclass-snapshot-v1.json"},
	} {
		if got := fileName(tc.g); got != tc.want {
			t.Errorf("fileName(%+v) = %s, want %s", tc.g, got, tc.want)
		}
	}
}

func TestStrictify(t *testing.T) {
	in := decode(t, `{
		"type": "object",
		"description": "kept as is",
		"properties": {
			"port": {"type": "string", "format": "int-or-string"},
			"labels": {"type": "object", "additionalProperties": {"type": "string"}},
			"raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}},
			"properties": {"type": "object", "properties": {"format": {"type": "string"}}},
			"items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}}
		}
	}`)
	want := decode(t, `{
		"type": "object",
		"description": "kept as is",
		"additionalProperties": false,
		"properties": {
			"port": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
			"labels": {"type": "object", "additionalProperties": {"type": "string"}},
			"raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}},
			"properties": {"type": "object", "additionalProperties": false, "properties": {"format": {"type": "string"}}},
			"items": {"type": "array", "items": {"type": "object", "additionalProperties": false, "properties": {"n": {"type": "integer"}}}}
		}
	}`)
	if got := strictify(in); !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", " ")
		t.Errorf("strictify:\n%s", g)
	}
}

// TestRun writes the schemas of a small swagger document and a CRD, both
// from module zips as validate.sh gives them.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	swagger := `{"definitions": {
		"io.k8s.api.core.v1.Service": {"type": "object", "properties": {"spec": {"$ref": "#/definitions/io.k8s.api.core.v1.ServiceSpec"}},
			"x-kubernetes-group-version-kind": [{"group": "", "kind": "Service", "version": "v1"}]},
		"io.k8s.api.core.v1.ServiceSpec": {"type": "object", "properties": {"clusterIP": {"type": "string"}}},
		"io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"}
	}}`
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
spec:
  group: snapshot.storage.k8s.io
  names: {kind: VolumeSnapshotClass}
  versions:
    - name: v1beta1
      served: false
      schema: {openAPIV3Schema: {type: object}}
    - name: v1
      served: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            driver: {type: string}
            metadata: {type: object}
`
	kzip := writeZip(t, dir, "k.zip", "k8s.io/kubernetes@v1.0.0/api/openapi-spec/swagger.json", swagger)
	czip := writeZip(t, dir, "c.zip", "github.com/x/client/v8@v8.0.0/config/crd/vsc.yaml", crd)
	out := filepath.Join(dir, "schemas")
	var log strings.Builder
	if err := run([]string{"-out", out, "-kubernetes-zip", kzip, "-crd-zip", czip, "-crd", "config/crd/vsc.yaml"}, &log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "2 schemas") {
		t.Errorf("log %q, want 2 schemas", log.String())
	}
	if got := read(t, out, "service-v1.json"); !reflect.DeepEqual(got, decode(t, `{"$ref": "_definitions.json#/definitions/io.k8s.api.core.v1.Service"}`)) {
		t.Errorf("service-v1.json = %v", got)
	}
	defs := read(t, out, "_definitions.json")["definitions"].(map[string]any)
	if q := defs["io.k8s.apimachinery.pkg.api.resource.Quantity"]; !reflect.DeepEqual(q, decode(t, `{"oneOf": [{"type": "string"}, {"type": "number"}]}`)) {
		t.Errorf("Quantity = %v", q)
	}
	if spec := defs["io.k8s.api.core.v1.ServiceSpec"].(map[string]any); spec["additionalProperties"] != false {
		t.Errorf("ServiceSpec is not strict: %v", spec)
	}
	vsc := read(t, out, "volumesnapshotclass-snapshot-v1.json")
	if vsc["additionalProperties"] != false {
		t.Errorf("VolumeSnapshotClass is not strict: %v", vsc)
	}
	if _, err := os.Stat(filepath.Join(out, "volumesnapshotclass-snapshot-v1beta1.json")); err == nil {
		t.Error("a version not served got a schema")
	}

	for _, args := range [][]string{
		{"-kubernetes-zip", kzip},
		{"-out", out},
		{"-out", out, "-kubernetes-zip", kzip, "-swagger", "x.json"},
		{"-out", out, "-kubernetes-zip", czip},
		{"-out", out, "-kubernetes-zip", kzip, "-crd-zip", kzip, "-crd", "api/openapi-spec/swagger.json"},
	} {
		if err := run(args, io.Discard); err == nil {
			t.Errorf("run %v: no error", args)
		}
	}
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func read(t *testing.T, dir, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, string(b))
}

func writeZip(t *testing.T, dir, name, file, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	w, err := zw.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, body)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

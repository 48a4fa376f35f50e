package csi

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseParams(t *testing.T) {
	p, err := parseParams(nil)
	if err != nil || !reflect.DeepEqual(p, defaultParams()) {
		t.Fatalf("empty: %+v %v", p, err)
	}
	p, err = parseParams(map[string]string{
		"replicas": "3", "blockSize": "512", "transport": "tcp,nbd", "fsType": "ext4",
		"mkfsOptions": " -E  nodiscard ", "zoneLocal": "true", "flattenClones": "true", "authentication": "dhchap",
		"csi.storage.k8s.io/fstype":                  "xfs",
		"csi.storage.k8s.io/pvc/name":                "data",
		"csi.storage.k8s.io/provisioner-secret-name": "x",
	})
	want := params{Replicas: 3, BlockSize: 512, Transport: "tcp,nbd", FSType: "xfs", MkfsOptions: []string{"-E", "nodiscard"},
		ZoneLocal: true, FlattenClones: true, Authentication: "dhchap"}
	if err != nil || !reflect.DeepEqual(p, want) {
		t.Fatalf("full: %+v %v; want %+v", p, err, want)
	}
	for k, v := range map[string]string{
		"replicas": "0", "blockSize": "1024", "transport": "rdma", "fsType": "btrfs", "zoneLocal": "yes",
		"flattenClones": "1", "authentication": "chap", "replica": "3", "csi.storage.k8s.io/fstype": "vfat",
	} {
		_, err := parseParams(map[string]string{k: v})
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v; want an error naming the key", k, v, err)
		}
	}
}

// TestParametersListed: every key parseParams takes is in Parameters (the
// manifests' test and the docs read that list), and only those.
func TestParametersListed(t *testing.T) {
	valid := map[string]string{
		ParamReplicas: "1", ParamBlockSize: "4096", ParamTransport: "tcp", ParamFSType: "ext4",
		ParamMkfsOptions: "", ParamZoneLocal: "false", ParamFlattenClones: "false", ParamAuthentication: "none",
	}
	if len(valid) != len(Parameters) {
		t.Fatalf("Parameters has %d keys, the test knows %d", len(Parameters), len(valid))
	}
	for _, k := range Parameters {
		if _, err := parseParams(map[string]string{k: valid[k]}); err != nil {
			t.Errorf("listed key %s refused: %v", k, err)
		}
	}
}

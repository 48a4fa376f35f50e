#!/usr/bin/env bash
# Validates deploy/kubernetes/*.yaml and examples/*.yaml with kubeconform,
# strict, offline (docs/operations.md §7, §8.3), as CI does:
#   - the Kubernetes schemas are generated from the swagger.json of the
#     k8s.io/kubernetes module ($KUBERNETES_VERSION) and the snapshot CRDs
#     from the external-snapshotter's client module, both fetched through
#     the Go module proxy (go mod download, from a directory outside blk's
#     module: neither is a dependency of blk), by schemagen into a temp dir;
#   - kubeconform is built with go install at a pinned version;
#   - a document with an unknown field must fail first (strictness is what
#     is checked), then every manifest must pass: no schema missing, none
#     skipped.
# The consistency checks schemas cannot make (image tags, names, sockets,
# parameters) are manifests_test.go's, in go test.
#
#   bash deploy/kubernetes/validate.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

KUBERNETES_VERSION=v1.37.2
SNAPSHOTTER_CLIENT_VERSION=v8.7.0
KUBECONFORM_VERSION=v0.8.0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "manifests: $*" >&2; exit 1; }

# retry CMD...: module downloads over the network, three tries.
retry() {
	local i
	for i in 1 2; do
		"$@" && return 0
		echo "manifests: '$*' failed (try $i), again in $((i * 5)) s" >&2
		sleep $((i * 5))
	done
	"$@"
}

# zip_of MODULE@VERSION: the path of the module's zip in the module cache.
zip_of() {
	local out
	out=$(cd "$work" && retry env GOFLAGS=-mod=mod go mod download -json "$1") || fail "go mod download $1 failed"
	printf '%s\n' "$out" | sed -n 's/^[[:space:]]*"Zip": "\(.*\)",$/\1/p'
}

kzip=$(zip_of "k8s.io/kubernetes@$KUBERNETES_VERSION")
szip=$(zip_of "github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER_CLIENT_VERSION")
[ -f "$kzip" ] && [ -f "$szip" ] || fail "no module zip (got '$kzip' and '$szip')"

go run ./deploy/kubernetes/schemagen -out "$work/schemas" -kubernetes-zip "$kzip" \
	-crd-zip "$szip" \
	-crd config/crd/snapshot.storage.k8s.io_volumesnapshotclasses.yaml \
	-crd config/crd/snapshot.storage.k8s.io_volumesnapshots.yaml

retry env GOBIN="$work/bin" GOFLAGS=-mod=mod go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" ||
	fail "go install kubeconform@$KUBECONFORM_VERSION failed"
kubeconform() {
	"$work/bin/kubeconform" -strict -summary \
		-schema-location "$work/schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" "$@"
}

cat >"$work/bad.yaml" <<'BAD'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: strictness-check
provisioner: csi.blk-project.github.io
allowVolumeExpansions: true
BAD
if out=$(kubeconform "$work/bad.yaml" 2>&1); then
	fail "kubeconform accepted a StorageClass with an unknown field: the schemas are not strict
$out"
fi
printf '%s\n' "$out" | grep -q "additional properties 'allowVolumeExpansions' not allowed" ||
	fail "kubeconform refused the strictness check for another reason:
$out"

files=(deploy/kubernetes/*.yaml deploy/kubernetes/examples/*.yaml)
out=$(kubeconform "${files[@]}" 2>&1) || fail "kubeconform refused:
$out"
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -q ' Invalid: 0, Errors: 0, Skipped: 0$' || fail "kubeconform's summary is not clean"
echo "manifests: ${#files[@]} files valid against Kubernetes $KUBERNETES_VERSION's schemas (kubeconform $KUBECONFORM_VERSION, strict)"

// Package kubernetes holds blk's Kubernetes manifests (the *.yaml files
// beside this one, applied with kubectl apply -f deploy/kubernetes/) and
// the test that checks what their schemas cannot: that they name the
// driver, the images, the sockets, the Secrets, the flags and the
// StorageClass parameters the code and each other expect. validate.sh
// checks them against the Kubernetes schemas with kubeconform; schemagen
// writes those schemas. docs/kubernetes.md says how to use them.
//
// It has no code: nothing imports it.
package kubernetes

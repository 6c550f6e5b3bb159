//go:build tools

// Package tools pins the upstream Kubernetes control-plane commands that the
// tests and the demo run; scripts/build-cluster-bin.sh builds them with
// `go build` from this module so go.sum fixes every dependency.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)

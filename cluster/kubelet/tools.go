//go:build tools

// Package tools pins the node agent the real-node tests run: kubelet from the same k8s.io/kubernetes as cluster/kube
// (a module of its own, so that adding it does not change cluster/kube's go.sum and the control plane's cache key).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)

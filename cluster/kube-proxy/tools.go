//go:build tools

// Package tools pins the Service proxy of the real nodes: kube-proxy from the same k8s.io/kubernetes as cluster/kube
// and cluster/kubelet, in a module of its own because it needs modules (knftables, netlink, ipvs, the kube-proxy
// config API) that cluster/kubelet/go.sum lacks: adding them there would change the kubelet's cache key.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)

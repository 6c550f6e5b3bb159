//go:build tools

// Package tools pins the etcd server that the test control plane stores its
// state in; it lives in a module of its own because etcd's dependency graph
// conflicts with Kubernetes' pinned versions.
package tools

import _ "go.etcd.io/etcd/server/v3"

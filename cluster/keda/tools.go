//go:build tools

// Package tools pins KEDA, whose operator (it creates and drives the HPA of
// each ScaledObject, and scales 0 <-> 1 itself) and metrics server (the
// external-metrics API the HPA reads) the autoscaling tests run; its CRDs,
// RBAC and APIService come from the same module version's config/ folder.
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)

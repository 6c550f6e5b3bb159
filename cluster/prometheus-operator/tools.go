//go:build tools

// Package tools pins prometheus-operator for scripts/build-prometheus-operator.sh, which builds its cmd/operator and
// takes the monitoring.coreos.com CRDs from the same module version's example/prometheus-operator-crd folder.
package tools

import _ "github.com/prometheus-operator/prometheus-operator/cmd/operator"

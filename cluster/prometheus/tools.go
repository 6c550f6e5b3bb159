//go:build tools

// Package tools pins Prometheus for scripts/build-prometheus.sh, which builds its cmd/prometheus with only the file,
// HTTP and Kubernetes service discovery (Prometheus' own remove_all_sd / enable_kubernetes_sd build tags).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"

#!/usr/bin/env bash
# Builds prometheus-operator (its cmd/operator) from the pinned Go module in cluster/prometheus-operator, into a cache
# OUTSIDE the clone, beside the control plane's:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/prometheus-operator-<hash>/   (hash: cluster/prometheus-operator
#   go.mod+go.sum, the Go version and this recipe)
# The integration tier runs it against the real control plane, so that the PodMonitor and PrometheusRule we render are
# turned into Prometheus configuration and rules by the operator that reads them in a user's cluster. Its
# monitoring.coreos.com CRDs and its ClusterRole are copied from the same module version (example/
# prometheus-operator-crd, example/rbac/prometheus-operator) into <dir>/crd and <dir>/rbac, not kept in the repo.
# A no-op when present; built in a temporary directory and renamed into place (scripts/lib/cached-build.sh).
#   scripts/build-prometheus-operator.sh              build if missing, print the directory on the last line
#   scripts/build-prometheus-operator.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
source "$(dirname "$0")/lib/cached-build.sh"
MODULE=github.com/prometheus-operator/prometheus-operator
RECIPE=1   # bump when the build commands below change in a way that changes the output

cache_init prometheus-operator prometheus-operator "recipe=$RECIPE" cluster/prometheus-operator/go.mod \
  cluster/prometheus-operator/go.sum
[ "${1:-}" = "--print-dir" ] && cache_print_dir
if cache_done; then
  echo "prometheus-operator: present in $dest"
  echo "$dest"; exit 0
fi
cache_begin
version="$(cd cluster/prometheus-operator && go list -m -f '{{.Version}}' "$MODULE")"
echo "prometheus-operator: building $MODULE $version into $dest (cold: ~310 CPU-s, ~3 min on an idle 2-core machine)"
timed_build prometheus-operator prometheus-operator "$MODULE/cmd/operator" \
  "-ldflags=-s -w -X github.com/prometheus/common/version.Version=${version#v}"
src="$(cd cluster/prometheus-operator && go list -m -f '{{.Dir}}' "$MODULE")"
mkdir -p "$tmp/crd" "$tmp/rbac"
cp "$src"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$tmp/crd/"
cp "$src"/example/rbac/prometheus-operator/prometheus-operator-cluster-role.yaml "$tmp/rbac/"
chmod -R u+w "$tmp/crd" "$tmp/rbac"
cache_finish "$go_version prometheus-operator=$version"
echo "$dest"

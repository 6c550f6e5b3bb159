#!/usr/bin/env bash
# Builds Prometheus from its published Go module (github.com/prometheus/prometheus, pinned in cluster/prometheus)
# with only the file, HTTP and Kubernetes service discovery compiled in (Prometheus' own remove_all_sd /
# enable_kubernetes_sd build tags), into a cache OUTSIDE the clone:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/prometheus-<hash>/prometheus   (hash: cluster/prometheus/go.mod
#   and go.sum, the Go version and this recipe)
# Why not Debian's: its Prometheus 2.42 is built without kubernetes_sd_configs ("field kubernetes_sd_configs not found
# in type config.ScrapeConfig"), and the end-to-end tier discovers the engine pods from the API server.
# A no-op when present; built in a temporary directory and renamed into place (scripts/lib/cached-build.sh).
#   scripts/build-prometheus.sh              build if missing, print the directory on the last line
#   scripts/build-prometheus.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
source "$(dirname "$0")/lib/cached-build.sh"
RECIPE=1
TAGS=remove_all_sd,enable_kubernetes_sd

cache_init prometheus prometheus "recipe=$RECIPE tags=$TAGS" cluster/prometheus/go.mod cluster/prometheus/go.sum
[ "${1:-}" = "--print-dir" ] && cache_print_dir
if cache_done; then
  echo "prometheus: present in $dest"
  echo "$dest"; exit 0
fi
cache_begin
version="$(cd cluster/prometheus && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
echo "prometheus: building github.com/prometheus/prometheus $version (tags $TAGS) into $dest"
timed_build prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus -tags "$TAGS" \
  "-ldflags=-s -w -X github.com/prometheus/common/version.Version=$version"
cache_finish "$go_version prometheus=$version tags=$TAGS"
echo "$dest"

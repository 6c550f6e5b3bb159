#!/usr/bin/env bash
# Builds Prometheus from its published Go module (github.com/prometheus/prometheus, pinned in cluster/prometheus)
# with only the file, HTTP and Kubernetes service discovery compiled in (Prometheus' own remove_all_sd /
# enable_kubernetes_sd build tags), into a cache OUTSIDE the clone:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/prometheus-<hash>/prometheus   (hash: cluster/prometheus/go.mod
#   and go.sum, the Go version and this recipe)
# Why not Debian's: its Prometheus 2.42 is built without kubernetes_sd_configs ("field kubernetes_sd_configs not found
# in type config.ScrapeConfig"), and the end-to-end tier discovers the engine pods from the API server.
# A no-op when present; built in a temporary directory and renamed into place.
#   scripts/build-prometheus.sh              build if missing, print the directory on the last line
#   scripts/build-prometheus.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
RECIPE=1
TAGS=remove_all_sd,enable_kubernetes_sd

command -v go >/dev/null || { echo "build-prometheus: 'go' is not on PATH (Go >= 1.26 is needed)" >&2; exit 1; }
go_version="$(go env GOVERSION)"
key="$( { cat cluster/prometheus/go.mod cluster/prometheus/go.sum; echo "$go_version recipe=$RECIPE tags=$TAGS"; } |
        sha256sum | cut -c1-16)"
cache_root="${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}"
dest="$cache_root/prometheus-$key"

if [ "${1:-}" = "--print-dir" ]; then
  [ -f "$dest/.complete" ] || { echo "build-prometheus: $dest is not built (run make cluster-bin)" >&2; exit 1; }
  echo "$dest"; exit 0
fi
if [ -f "$dest/.complete" ]; then
  echo "prometheus: present in $dest"
  echo "$dest"; exit 0
fi
mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.prometheus-$key.partial.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
version="$(cd cluster/prometheus && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
echo "prometheus: building github.com/prometheus/prometheus $version (tags $TAGS) into $dest"
t0=$SECONDS
(cd cluster/prometheus && go build -tags "$TAGS" -trimpath \
  -ldflags="-s -w -X github.com/prometheus/common/version.Version=$version" \
  -o "$tmp/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
echo "prometheus: built in $((SECONDS - t0)) s wall ($(stat -c %s "$tmp/prometheus" | awk '{printf "%d", $1/1e6}') MB)"
echo "$go_version prometheus=$version tags=$TAGS" > "$tmp/VERSIONS"
touch "$tmp/.complete"
chmod 755 "$tmp"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "$dest"

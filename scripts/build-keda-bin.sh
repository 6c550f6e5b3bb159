#!/usr/bin/env bash
# Builds KEDA (its operator, which creates and drives the HPA of every ScaledObject and scales 0 <-> 1 itself, and its
# metrics server, the external-metrics API the HPA reads) from the pinned Go module in cluster/keda, into a cache
# OUTSIDE the clone, beside the control plane's:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/keda-<hash>/   (hash: cluster/keda/go.mod+go.sum, the Go version and
#   this script's recipe)
# A cache of its own, so a KEDA bump does not rebuild the control plane (and the reverse). KEDA's CRDs, RBAC and
# APIService are copied from the same module version's config/ folder into <dir>/config. Built in a temporary
# directory and renamed into place (scripts/lib/cached-build.sh).
#   scripts/build-keda-bin.sh              build if missing, print the directory on the last line
#   scripts/build-keda-bin.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
source "$(dirname "$0")/lib/cached-build.sh"

KEDA_VERSION=v2.21.0   # github.com/kedacore/keda/v2 in cluster/keda/go.mod
RECIPE=1               # bump when the build commands below change in a way that changes the binaries

cache_init keda "keda binaries" "recipe=$RECIPE" cluster/keda/go.mod cluster/keda/go.sum
[ "${1:-}" = "--print-dir" ] && cache_print_dir
if cache_done; then
  echo "keda binaries: present in $dest"
  echo "$dest"; exit 0
fi

cache_begin
echo "keda binaries: building KEDA $KEDA_VERSION into $dest with $go_version (cold: ~20 min on 2 cores)"
ldflags="-ldflags=-s -w -X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v}"

t0=$SECONDS
(cd cluster/keda && go mod download -x 2>&1 | grep -c '^# get' | sed 's/^/keda binaries: downloaded modules: /') || true
echo "download                 $((SECONDS - t0)) s wall" >> "$tmp/build-times.txt"
timed_build keda keda-operator github.com/kedacore/keda/v2/cmd/operator "$ldflags"
timed_build keda keda-metrics-apiserver github.com/kedacore/keda/v2/cmd/adapter "$ldflags"

src="$(cd cluster/keda && go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)"
mkdir -p "$tmp/config"
cp -r "$src/config/crd" "$src/config/rbac" "$src/config/metrics-server" "$tmp/config/"
chmod -R u+w "$tmp/config"
cache_finish "$go_version keda=$KEDA_VERSION"
echo "keda binaries: done ($(du -sm "$dest" | cut -f1) MB in $dest)"
echo "$dest"

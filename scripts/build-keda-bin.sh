#!/usr/bin/env bash
# Builds KEDA (its operator, which creates and drives the HPA of every ScaledObject and scales 0 <-> 1 itself, and its
# metrics server, the external-metrics API the HPA reads) from the pinned Go module in cluster/keda, into a cache
# OUTSIDE the clone, beside the control plane's:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/keda-<hash>/   (hash: cluster/keda/go.mod+go.sum, the Go version and
#   this script's recipe)
# A cache of its own, so a KEDA bump does not rebuild the control plane (and the reverse). KEDA's CRDs, RBAC and
# APIService are copied from the same module version's config/ folder into <dir>/config. Atomic like
# build-cluster-bin.sh: built in a temporary directory and renamed into place.
#   scripts/build-keda-bin.sh              build if missing, print the directory on the last line
#   scripts/build-keda-bin.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

KEDA_VERSION=v2.21.0   # github.com/kedacore/keda/v2 in cluster/keda/go.mod
RECIPE=1               # bump when the build commands below change in a way that changes the binaries

command -v go >/dev/null || { echo "build-keda-bin: 'go' is not on PATH (Go >= 1.26 is needed)" >&2; exit 1; }
go_version="$(go env GOVERSION)"
key="$( { cat cluster/keda/go.mod cluster/keda/go.sum; echo "$go_version recipe=$RECIPE"; } | sha256sum | cut -c1-16)"
cache_root="${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}"
dest="$cache_root/keda-$key"

if [ "${1:-}" = "--print-dir" ]; then
  [ -f "$dest/.complete" ] || { echo "build-keda-bin: $dest is not built (run make cluster-bin)" >&2; exit 1; }
  echo "$dest"; exit 0
fi
if [ -f "$dest/.complete" ]; then
  echo "keda binaries: present in $dest"
  echo "$dest"; exit 0
fi

mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.keda-$key.partial.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "keda binaries: building KEDA $KEDA_VERSION into $dest with $go_version (cold: ~20 min on 2 cores)"

child_cpu() {  # sets $cpu: CPU seconds (user+sys) of every child this shell has waited for so far
  times > "$tmp/.times"
  cpu=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); n += a[1] * 60 + a[2] } print n }' \
    "$tmp/.times")
}

ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v}"
build() {  # build <output name> <package>
  local name=$1 pkg=$2
  local t0=$SECONDS cpu c0
  echo "keda binaries: building $name ($pkg)"
  child_cpu; c0=$cpu
  (cd cluster/keda && go build -trimpath -ldflags="$ldflags" -o "$tmp/$name" "$pkg")
  child_cpu
  awk -v n="$name" -v w="$((SECONDS - t0))" -v c="$cpu" -v c0="$c0" -v b="$(stat -c %s "$tmp/$name")" \
    'BEGIN { printf "%-24s %5d s wall %5.0f s CPU %4d MB\n", n, w, c - c0, b / 1e6 }' | tee -a "$tmp/build-times.txt"
}

t0=$SECONDS
(cd cluster/keda && go mod download -x 2>&1 | grep -c '^# get' | sed 's/^/keda binaries: downloaded modules: /') || true
echo "download                 $((SECONDS - t0)) s wall" >> "$tmp/build-times.txt"
build keda-operator github.com/kedacore/keda/v2/cmd/operator
build keda-metrics-apiserver github.com/kedacore/keda/v2/cmd/adapter

src="$(cd cluster/keda && go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)"
mkdir -p "$tmp/config"
cp -r "$src/config/crd" "$src/config/rbac" "$src/config/metrics-server" "$tmp/config/"
chmod -R u+w "$tmp/config"
echo "$go_version keda=$KEDA_VERSION" > "$tmp/VERSIONS"
rm -f "$tmp/.times"
touch "$tmp/.complete"
chmod 755 "$tmp"

rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "keda binaries: done ($(du -sm "$dest" | cut -f1) MB in $dest)"
echo "$dest"
